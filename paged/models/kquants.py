"""llama.cpp's K-quants (Q2_K ... Q6_K): super-blocks of 256 weights, and the formulas that widen them.

Most GGUF files on the hub (``Q4_K_M`` = Q4_K with Q6_K for some tensors) store
their weights in super-blocks of 256 consecutive weights of a row: one or two
float16 factors ``d`` (and ``dmin``) for the super-block, a small integer scale
(and min) for each sub-block of 16 or 32 weights, and 2 to 6 bits per weight:

  type  bytes  sub-block  weight
  Q2_K   84    16         d * sc * q - dmin * m        sc, m 4 bits; q 2 bits
  Q3_K  110    16         d * (sc - 32) * q            sc 6 bits; q 3 bits, -4 .. 3
  Q4_K  144    32         d * sc * q - dmin * m        sc, m 6 bits; q 4 bits
  Q5_K  176    32         d * sc * q - dmin * m        sc, m 6 bits; q 5 bits
  Q6_K  210    16         d * sc * (q - 32)            sc int8; q 6 bits

``dequantize_kquant`` writes the formulas one torch operation at a time, rounding
where ``gguf``'s reference rounds (each product, then the difference, in float32),
so its weights are ``gguf.quants.dequantize``'s bit for bit
(``tests/kernels/test_quant_linear.py``). A weight matrix keeps its bytes as the
file has them, one row of super-blocks after another: ``csrc/cpu/quant_linear.cpp``
reads Q4_K and Q6_K in place.
"""

from __future__ import annotations

import torch

QK_K = 256  # weights per super-block
# ggml type number -> (name, bytes per super-block of 256 weights)
K_FORMATS = {10: ("Q2_K", 84), 11: ("Q3_K", 110), 12: ("Q4_K", 144), 13: ("Q5_K", 176), 14: ("Q6_K", 210)}


def _half(b: torch.Tensor) -> torch.Tensor:  # [S, 2] uint8 -> [S, 1] float32
    return b.contiguous().view(torch.float16).float()


def _bits(b: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """``(b >> shift) & mask`` for each shift, the shifts as a new dimension before the last: [..., n, L]."""
    return torch.stack([(b >> s) & mask for s in shifts], dim=-2)


def k_scales_mins(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins, [S, 8] each (uint8).

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7; bytes 4-7 the mins
    0-3 and the top bits of mins 4-7; bytes 8-11 the low 4 bits of scales 4-7 and mins 4-7.
    """
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc, mn


def dequantize_kquant(raw: torch.Tensor, kind: int, n: int, k: int) -> torch.Tensor:
    """The weights of a ``[n, k]`` K-quant matrix (``raw``: its bytes as the file has them, uint8) as
    float32 ``[n, k]``; ``k`` a multiple of 256."""
    size = K_FORMATS[kind][1]
    b = raw.reshape(-1, size)  # [S, bytes] super-blocks, row after row
    s = b.shape[0]
    if kind == 10:  # Q2_K: scales[16] | qs[64] | d | dmin
        sc, qs = b[:, :16], b[:, 16:80]
        d, dmin = _half(b[:, 80:82]), _half(b[:, 82:84])
        dl = (d * (sc & 0xF).float()).reshape(s, 16, 1)
        ml = (dmin * (sc >> 4).float()).reshape(s, 16, 1)
        q = _bits(qs.reshape(s, 2, 32), [0, 2, 4, 6], 3).reshape(s, 16, 16).float()
        w = dl * q - ml
    elif kind == 11:  # Q3_K: hmask[32] | qs[64] | scales[12] | d
        hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _half(b[:, 108:110])
        low = _bits(packed[:, :8].reshape(s, 1, 8), [0, 4], 0xF).reshape(s, 16)
        high = _bits(packed[:, 8:12].reshape(s, 1, 4), [0, 2, 4, 6], 3).reshape(s, 16)
        sc = ((low | (high << 4)).to(torch.int8) - 32).float()  # -32 .. 31
        dl = (d * sc).reshape(s, 16, 1)
        ql = _bits(qs.reshape(s, 2, 32), [0, 2, 4, 6], 3).reshape(s, 16, 16)
        qh = _bits(hmask.reshape(s, 1, 32), list(range(8)), 1).reshape(s, 16, 16) ^ 1  # a set bit: no -4
        w = dl * (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float()
    elif kind in (12, 13):  # Q4_K: d | dmin | scales[12] | qs[128]; Q5_K: ... | qh[32] | qs[128]
        d, dmin = _half(b[:, 0:2]), _half(b[:, 2:4])
        sc, mn = k_scales_mins(b[:, 4:16])
        dl = (d * sc.float()).reshape(s, 8, 1)
        ml = (dmin * mn.float()).reshape(s, 8, 1)
        qs = b[:, 16:144] if kind == 12 else b[:, 48:176]
        q = _bits(qs.reshape(s, 4, 32), [0, 4], 0xF).reshape(s, 8, 32)  # each 32 bytes: low nibbles, then high
        if kind == 13:
            q = q | (_bits(b[:, 16:48].reshape(s, 1, 32), list(range(8)), 1).reshape(s, 8, 32) << 4)
        w = dl * q.float() - ml
    elif kind == 14:  # Q6_K: ql[128] | qh[64] | scales[16] int8 | d
        ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _half(b[:, 208:210])
        dl = (d * sc.contiguous().view(torch.int8).float()).reshape(s, 16, 1)
        low = _bits(ql.reshape(s, 2, 1, 64), [0, 4], 0xF).reshape(s, 2, 4, 32)  # per half: 4 groups of 32
        high = _bits(qh.reshape(s, 2, 1, 32), [0, 2, 4, 6], 3).reshape(s, 2, 4, 32)
        q = ((low | (high << 4)).to(torch.int8) - 32).reshape(s, 16, 16).float()
        w = dl * q
    else:
        raise ValueError(f"block type {kind} is not a K-quant; K-quants: {sorted(K_FORMATS)}")
    return w.reshape(n, k)
