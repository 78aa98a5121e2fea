"""``causal_attention``: plain causal attention over one sequence's contiguous keys and values.

The specification every attention path is measured against (docs/architecture.md,
the one oracle): the kernels' fallback (``paged.kernels.cpu``), the models'
``ContiguousAttention``, step03's reference path and the tests all call this one
function. It sits with the kernels, the bottom of the ladder, so each of them
imports it without climbing.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def check_window_and_softcap(window: int | None, softcap: float | None) -> None:
    """Raises ValueError unless ``window`` is None or an int >= 1 and ``softcap`` None or a finite
    number > 0 (the attention paths' and the C++ kernels' shared bounds)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be >= 1 (keys a query sees, itself included) or None, got {window!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be a finite number > 0 or None, got {softcap!r}")


def causal_attention(
    q: torch.Tensor,  # [T_q, H, D]   queries of the last T_q positions
    k: torch.Tensor,  # [T_k, H_kv, D] every key of the sequence, oldest first
    v: torch.Tensor,  # [T_k, H_kv, D]
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:  # [T_q, H, D]
    """Query ``i`` sits at position ``p = T_k - T_q + i`` and sees keys ``0..p``, or with a sliding
    ``window`` W keys ``p - W + 1 .. p`` only (transformers' and llama.cpp's window: W keys, itself
    included).

    Grouped-query attention by repeating each KV head ``H // H_kv`` times. ``softcap`` (Gemma 2)
    turns each score ``s = scale * q·k`` into ``softcap * tanh(s / softcap)`` before the mask and a
    softmax in float32 (float64 for float64 inputs), written out as transformers' eager attention
    does it; without it, SDPA.

    Raises:
        ValueError: ``window`` below 1 or ``softcap`` not a finite number above 0.
    """
    check_window_and_softcap(window, softcap)
    t_q, h, _ = q.shape
    t_k, h_kv, _ = k.shape
    k = k.repeat_interleave(h // h_kv, dim=1)  # [T_k, H, D]
    v = v.repeat_interleave(h // h_kv, dim=1)
    key_pos = torch.arange(t_k, device=q.device)[None, :]  # [1, T_k]
    query_pos = torch.arange(t_k - t_q, t_k, device=q.device)[:, None]  # [T_q, 1]
    mask = key_pos <= query_pos  # [T_q, T_k]
    if window is not None:
        mask &= key_pos > query_pos - window
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, T, D]
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(0, 1)
    scores = torch.tanh(q @ k.transpose(1, 2) * scale / softcap) * softcap  # [H, T_q, T_k]
    scores = scores.masked_fill(~mask, float("-inf"))
    softmax_dtype = torch.promote_types(q.dtype, torch.float32)  # float64 stays float64: the tight tests' oracle
    return (torch.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype) @ v).transpose(0, 1)
