"""The quantized linear (``csrc/cpu/quant_linear.cpp``, ``paged.models.quantized``) against its specification.

The weights are GGUF blocks made by ``gguf``'s own quantizer from random matrices; the
references are float64 products of tensors computed here.

* Dequantization: bitwise (``torch.equal``). The kernel's ``quant_dequantize`` and the torch
  formulas of ``dequantize_blocks`` both equal ``gguf.quants.dequantize``: widening a block is
  a product (and a sum) rounded once each in float32, which every implementation rounds alike.
* The product, toleranced. The kernel rounds every block of 32 activations to int8
  (``quantize_activations``), multiplies integers exactly and combines the blocks in float32.
  Against ``x̂ · Wᵀ`` in float64 (x̂ the rounded activations) the error is float32 rounding
  of about ``B + 8`` terms (B blocks): at most ``4 (B + 8) u · T``, ``u = 2**-24`` and ``T`` the
  sum of the terms' magnitudes (``_term_bound``); then one rounding to the output dtype.
  Against the exact ``x · Wᵀ`` it adds what rounding x costs: ``|x - x̂| <= max|x_b| / 254``
  per element of block b, times ``|W|``.
* Batch invariance: bitwise. A row's output is the same alone, among other rows and, for
  a layer large enough to be split between threads, on one thread.
* Every implementation (``impl``: the scalar loops, AVX2, AVX-512 VNNI, those this CPU runs; and
  ``"lanes"``, ``quant_linear_lanes`` over the blocks laid out with one output per vector lane,
  where AVX2 is built: its VNNI loop where that is built, else its AVX2 one, and ``"lanes-avx2"``, the
  AVX2 loop where VNNI would be taken) is held to all of the above: they add the same float32 terms in
  different orders, so each is checked against the float64 product, not against another. The lanes
  loop adds at most two terms a block one after another (``2 B`` roundings, plus the scale products'),
  inside the same bound.

A broken nibble order, a fifth bit (Q5_0) in the wrong place, a scale applied to the wrong
block or a lost padding block moves a result by a whole block's share of ``T`` (about ``T / B``),
thousands of times the bound.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.kernels import cpu
from paged.models.kquants import K_FORMATS, k_scales_mins
from paged.models.quantized import (BLOCK_FORMATS, QuantizedLinear, dequantize_blocks, pack_blocks,
                                    pack_lane_linears, quantize_activations, row_layout)

T = gguf.GGMLQuantizationType
KINDS = (int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q8_0))
U32 = 2.0**-24
BF16_ULP = 2.0**-8  # half a bfloat16 unit in the last place, relative


@pytest.fixture(scope="module")
def ext():
    return cpu.load(strict=True)


AVX2_FLAGS = {"avx2", "fma", "f16c"}
VNNI_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c"}
# what -march=native sees: the CPU's own feature flags
IMPLS = ["scalar"] + (["avx2"] if AVX2_FLAGS <= cpu.cpu_flags() else []) + (
    ["avx512"] if VNNI_FLAGS <= cpu.cpu_flags() else [])
# quant_linear_lanes (read by the AVX2 loop, or the VNNI one where it is built; "lanes-avx2": the AVX2 one there)
LANES = (["lanes"] if AVX2_FLAGS <= cpu.cpu_flags() else []) + (["lanes-avx2"] if VNNI_FLAGS <= cpu.cpu_flags() else [])
IMPL_KINDS = [(impl, kind) for impl in IMPLS + LANES for kind in KINDS]  # every implementation, every format


def _linear(ext, impl, x, packed, kind, n, k, **kwargs):
    """``quant_linear`` with ``impl``; for ``"lanes"`` (``"lanes-avx2"``), ``quant_linear_lanes`` (with its AVX2
    loop) over the blocks laid out in lanes."""
    if impl.startswith("lanes"):
        lanes_impl = "avx2" if impl == "lanes-avx2" else "auto"
        return ext.quant_linear_lanes(x, ext.quant_pack_lanes(packed, kind, n, k), kind, n, k, lanes_impl, **kwargs)
    return ext.quant_linear(x, packed, kind, n, k, impl=impl, **kwargs)


def test_each_implementation_this_cpu_runs_is_compiled_in(ext):
    """Exact: the build has the AVX2 loops where the CPU has AVX2, FMA and F16C, and the VNNI loops where it
    has AVX-512 VNNI (so ``IMPLS``, which the tests below run, cannot quietly lose one)."""
    assert ext.quant_avx2_compiled() == (AVX2_FLAGS <= cpu.cpu_flags())
    assert ext.quant_vnni_compiled() == (VNNI_FLAGS <= cpu.cpu_flags())


def quantized(kind: int, n: int, k: int, seed: int, scale: float = 1.0):
    """(GGUF block bytes, packed tensor) of a random ``[n, k]`` weight with an offset per row."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * scale + rng.standard_normal((n, 1)) * scale).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(w, T(kind)))
    return raw, pack_blocks(raw.reshape(-1).view(np.uint8), kind, n, k)


def _term_bound(x_hat: torch.Tensor, packed: torch.Tensor, kind: int, n: int, k: int) -> torch.Tensor:
    """``T[m, c]``: the sum over blocks of ``|d| q_max |x̂|`` plus ``|offset| |x̂|``, float64."""
    blocks, q_bytes, row_bytes = row_layout(kind, k)
    rows = packed.reshape(n, row_bytes)
    d = rows[:, blocks * q_bytes: blocks * (q_bytes + 2)].contiguous().view(torch.float16).double().abs()
    if kind == int(T.Q4_1):
        m = rows[:, blocks * (q_bytes + 2):].contiguous().view(torch.float16).double().abs()
        per_block = d * 15 + m
    elif kind == int(T.Q4_0):
        per_block = d * 8 + d * 8  # |q - 8| <= 8 as one product, and the offset term -8 d
    elif kind == int(T.Q5_0):
        per_block = d * 31 + d * 16  # the product d q (q <= 31), and the offset term -16 d
    else:
        per_block = d * 128
    weight_mag = per_block[:, : k // 32].repeat_interleave(32, dim=1)  # [n, k]
    return x_hat.abs().double() @ weight_mag.T


@st.composite
def shapes(draw):
    """(kind, M, N, K, seed): odd block counts (a padding block), N not a multiple of 4 or of 16 (a partial
    tile of rows, a partial group of lanes)."""
    kind = draw(st.sampled_from(KINDS))
    return (kind, draw(st.integers(1, 9)), draw(st.integers(1, 40)), 32 * draw(st.integers(1, 11)),
            draw(st.integers(0, 2**31)))


@given(case=shapes())
def test_dequantize_is_ggufs_bitwise(ext, case):
    """Bitwise: the kernel's and the torch formulas' weights are gguf's dequantized weights."""
    kind, _, n, k, seed = case
    raw, packed = quantized(kind, n, k, seed)
    want = torch.from_numpy(gguf.quants.dequantize(raw, T(kind)).reshape(n, k).astype(np.float32))
    assert torch.equal(ext.quant_dequantize(packed, kind, n, k), want)
    assert torch.equal(dequantize_blocks(packed, kind, n, k), want)


@pytest.mark.parametrize("impl", IMPLS + LANES)
@settings(max_examples=60)
@given(case=shapes(), dtype=st.sampled_from([torch.float32, torch.bfloat16]), scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_linear_equals_dequantize_then_multiply(ext, impl, case, dtype, scale):
    """Toleranced: against x̂ · Wᵀ in float64 within float32 rounding; against x · Wᵀ within x's rounding."""
    kind, m, n, k, seed = case
    raw, packed = quantized(kind, n, k, seed, scale)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)
    y = _linear(ext, impl, x, packed, kind, n, k)
    assert y.dtype == dtype and y.shape == (m, n)
    w = dequantize_blocks(packed, kind, n, k).double()
    x_hat = quantize_activations(x)
    want = x_hat.double() @ w.T
    blocks = k // 32
    out_rounding = (BF16_ULP if dtype == torch.bfloat16 else U32) * want.abs()
    tol = 4 * (blocks + 8) * U32 * _term_bound(x_hat, packed, kind, n, k) + out_rounding
    assert ((y.double() - want).abs() <= tol).all()
    # and the exact activations: each is off by at most half its block's step, max|x_b| / 254
    step = x.double().reshape(m, blocks, 32).abs().amax(-1).repeat_interleave(32, dim=1) / 254
    exact = x.double() @ w.T
    assert ((y.double() - exact).abs() <= tol + step @ w.abs().T * (1 + 1e-6)).all()


@pytest.mark.parametrize("impl", IMPLS + LANES)
@given(case=shapes())
def test_a_row_does_not_depend_on_the_batch(ext, impl, case):
    """Bitwise: each row alone gives what it gets in the batch (the thread count: the test below), in float32
    (where a sum added in another order shows in the last bits; bfloat16's rounding of the output can hide
    it) and in bfloat16."""
    kind, m, n, k, seed = case
    _, packed = quantized(kind, n, k, seed)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
        batch = _linear(ext, impl, x, packed, kind, n, k)
        for i in range(m):
            assert torch.equal(_linear(ext, impl, x[i : i + 1], packed, kind, n, k), batch[i : i + 1])


@pytest.mark.parametrize(("impl", "kind"), IMPL_KINDS)
def test_a_layer_large_enough_to_split_gives_the_same_bits_on_one_thread(ext, impl, kind):
    """Bitwise: a layer big enough that its columns are split between threads (4096 x 1024 at one and
    three rows: the AVX2 loop splits from 2 M weights x rows, three rows counted as one; the VNNI and
    lanes loops count every row) gives the one-thread result, and each row its own result."""
    n, k = 4096, 1024
    _, packed = quantized(kind, n, k, 3)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(3)).bfloat16()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        split = [_linear(ext, impl, x[:m], packed, kind, n, k) for m in (1, 3)]
        torch.set_num_threads(1)
        single = [_linear(ext, impl, x[:m], packed, kind, n, k) for m in (1, 3)]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split[0], single[0]) and torch.equal(split[1], single[1])
    assert torch.equal(split[1][:1], split[0])


@pytest.mark.parametrize(("impl", "kind"), IMPL_KINDS)
def test_the_second_thread_rule_changes_no_bit(ext, impl, kind):
    """Bitwise: a small layer (960 x 576, qkv's) split over the threads from any work
    (``second_thread_weights`` 0: every tile a task; the loop's own rule; never) gives the same
    outputs, at one row and at three."""
    n, k = 960, 576
    _, packed = quantized(kind, n, k, 5)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5)).bfloat16()
    for m in (1, 3):
        outs = [_linear(ext, impl, x[:m], packed, kind, n, k, second_thread_weights=rule) for rule in (0, None, 1 << 62)]
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), m


def test_the_torch_fallback_equals_the_kernel(ext, monkeypatch):
    """Toleranced (as above): a ``QuantizedLinear`` without the kernel dequantizes and multiplies in float32."""
    import paged.models.quantized as quantized_module

    kind, n, k = int(T.Q4_1), 24, 96
    _, packed = quantized(kind, n, k, 7)
    layer = QuantizedLinear(packed, kind, n, k)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        fast = layer(x)
        monkeypatch.setattr(quantized_module, "load_cpu_kernels", lambda: None)
        slow = layer(x)
    # each is within the bound of the same float64 product, so the two within twice it
    tol = 4 * (k // 32 + 8) * U32 * _term_bound(quantize_activations(x), packed, kind, n, k) * 2
    assert ((fast.double() - slow.double()).abs() <= tol).all()
    assert not torch.equal(fast, torch.zeros_like(fast))


def test_a_layer_given_lane_blocks_multiplies_by_them(ext, monkeypatch):
    """Bitwise: after ``pack_lane_linears`` a Q4_1 ``QuantizedLinear`` gives ``quant_linear_lanes``' bits (where
    the AVX2 loops are built; elsewhere it gets none) and holds the lanes in place of the row layout, which
    ``row_blocks`` gives back byte for byte; laid out again it is laid out once; with
    ``PAGED_PREPACK_WEIGHTS=0`` (no laid-out copies) it is back in the row layout, the file's bytes, and gives
    ``quant_linear``'s bits. A Q4_K layer beside it is laid out too."""
    kind, n, k = int(T.Q4_1), 40, 256
    _, packed = quantized(kind, n, k, 9)
    k_packed = k_quantized(int(T.Q4_K), n, k, 9)
    layer = QuantizedLinear(packed.clone(), kind, n, k)
    other = QuantizedLinear(k_packed.clone(), int(T.Q4_K), n, k)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(9))
    model = torch.nn.Sequential(layer, other)
    built = bool(LANES)
    for _ in range(2):
        assert pack_lane_linears(model) == 2 * built and (other.lane_blocks is not None) == built
        assert (layer.blocks is None) == built and (other.blocks is None) == built
        assert torch.equal(layer.row_blocks(), packed) and torch.equal(other.row_blocks(), k_packed)
        if built:  # both in one allocation, each on its own 4 KiB page (layers.huge_page_parts)
            assert layer.lane_blocks.untyped_storage().data_ptr() == other.lane_blocks.untyped_storage().data_ptr()
            assert layer.lane_blocks.data_ptr() % 4096 == 0 == other.lane_blocks.data_ptr() % 4096
    with torch.inference_mode():
        if built:
            assert torch.equal(layer.lane_blocks, ext.quant_pack_lanes(packed, kind, n, k))
            assert torch.equal(layer(x), ext.quant_linear_lanes(x, layer.lane_blocks, kind, n, k))
        monkeypatch.setenv("PAGED_PREPACK_WEIGHTS", "0")
        assert pack_lane_linears(model) == 0 and layer.lane_blocks is None is other.lane_blocks
        assert torch.equal(layer.blocks, packed) and torch.equal(other.blocks, k_packed)
        assert torch.equal(layer(x), ext.quant_linear(x, packed, kind, n, k))


@pytest.mark.skipif(not LANES, reason="the lanes layout is built only for a CPU with AVX2, FMA and F16C")
def test_lanes_packed_into_a_given_place_are_the_new_tensors_bytes(ext):
    """Bitwise: ``quant_pack_lanes(..., into=t)`` writes into ``t`` (``quant_lanes_bytes`` long) what it returns
    in a new tensor, whatever ``t`` held before (the records of missing rows are zeroed); a place of another
    size is refused, naming the size it must have."""
    for kind, n, k in ((int(T.Q4_1), 40, 96), (int(T.Q6_K), 17, 256)):
        packed = quantized(kind, n, k, 4)[1] if kind in KINDS else k_quantized(kind, n, k, 4)
        want = ext.quant_pack_lanes(packed, kind, n, k)
        into = torch.full((ext.quant_lanes_bytes(kind, n, k),), 0xA5, dtype=torch.uint8)
        got = ext.quant_pack_lanes(packed, kind, n, k, into=into)
        assert got.data_ptr() == into.data_ptr() and torch.equal(into, want)
        with pytest.raises(ValueError, match=f"contiguous CPU tensor of {want.numel()} bytes \\(quant_lanes_bytes\\)"):
            ext.quant_pack_lanes(packed, kind, n, k, into=torch.zeros(want.numel() + 1, dtype=torch.uint8))


@pytest.mark.skipif(not LANES, reason="the lanes layout is built only for a CPU with AVX2, FMA and F16C")
@settings(max_examples=60)
@given(kind=st.sampled_from(KINDS + (int(T.Q4_K), int(T.Q6_K))), n=st.integers(1, 40), blocks=st.integers(1, 11),
       seed=st.integers(0, 2**31))
def test_the_lanes_give_back_the_row_layout_byte_for_byte(ext, kind, n, blocks, seed):
    """Bitwise: ``quant_unpack_lanes(quant_pack_lanes(b)) == b`` for every format the lanes hold, with every
    byte of the file's blocks drawn at random (so every bit of q, the scales, Q4_1's offsets, Q5_0's fifth
    bits, the K-quants' packed 6-bit scales and mins and Q6_K's split weights must find its way back), odd
    block counts (the row layout's zero padding block) and ``n`` not a multiple of 16 (a partial group)."""
    rng = np.random.default_rng(seed)
    if kind in K_FORMATS:
        k = 256 * (1 + blocks % 3)
        raw = rng.integers(0, 256, (n, k // 256 * K_FORMATS[kind][1]), dtype=np.uint8)
    else:
        k = 32 * blocks
        raw = rng.integers(0, 256, (n, blocks * BLOCK_FORMATS[kind][1]), dtype=np.uint8)
    packed = pack_blocks(raw, kind, n, k)
    lanes = ext.quant_pack_lanes(packed, kind, n, k)
    assert torch.equal(ext.quant_unpack_lanes(lanes, kind, n, k), packed)


@pytest.mark.parametrize("impl", IMPLS + LANES)
def test_activation_rounding_matches_the_kernels(ext, impl):
    """Bitwise: the kernel multiplies by exactly ``quantize_activations(x)``. W is the identity, written
    by hand as Q8_0 blocks with d = 1: each output is one product dx * qx, rounded once on both sides."""
    k = 64
    raw = np.zeros((k, k // 32, 34), np.uint8)
    raw[:, :, 0:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    for n in range(k):
        raw[n, n // 32, 2 + n % 32] = 1
    packed = pack_blocks(raw.reshape(-1), int(T.Q8_0), k, k)
    assert torch.equal(dequantize_blocks(packed, int(T.Q8_0), k, k), torch.eye(k))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2)) * 5
    x_hat = quantize_activations(x)
    assert not torch.equal(x_hat, x)
    assert torch.equal(_linear(ext, impl, x, packed, int(T.Q8_0), k, k), x_hat)


def test_bad_arguments_are_refused(ext):
    """Specific errors, nothing computed: an unknown type, a wrong byte count, a K that is not blocks, x's width."""
    kind, n, k = int(T.Q4_1), 8, 64
    _, packed = quantized(kind, n, k, 0)
    x = torch.randn(2, k)
    with pytest.raises(ValueError, match="unsupported GGUF block type 7"):
        ext.quant_linear(x, packed, 7, n, k)
    with pytest.raises(ValueError, match="packed blocks hold"):
        ext.quant_linear(x, packed[:-1].contiguous(), kind, n, k)
    with pytest.raises(ValueError, match="multiple of 32"):
        ext.quant_linear(torch.randn(2, 48), packed, kind, n, 48)
    with pytest.raises(ValueError, match=r"x must be \[M, 64\]"):
        ext.quant_linear(torch.randn(2, 32), packed, kind, n, k)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        ext.quant_linear(x.double(), packed, kind, n, k)
    with pytest.raises(ValueError, match="impl must be 'auto', 'scalar', 'avx2' or 'avx512', got 'avx3'"):
        ext.quant_linear(x, packed, kind, n, k, impl="avx3")
    with pytest.raises(ValueError, match="block type 5"):
        QuantizedLinear(packed, 5, n, k)
    assert set(BLOCK_FORMATS) == set(KINDS)


def test_the_lanes_layout_refuses_what_it_cannot_hold(ext):
    """Specific errors, nothing computed: a format the kernel does not read, blocks of the wrong size (the row
    layout's, a byte short), a K-quant's K that is not super-blocks, x's width, an unknown loop or one not
    built; without the AVX2 loops, the layout itself."""
    kind, n, k = int(T.Q4_1), 20, 64
    _, packed = quantized(kind, n, k, 0)
    x = torch.randn(2, k)
    if not LANES:
        with pytest.raises(ValueError, match="needs a build for a CPU with AVX2, FMA and F16C"):
            ext.quant_pack_lanes(packed, kind, n, k)
        return
    lanes = ext.quant_pack_lanes(packed, kind, n, k)
    assert lanes.numel() == 2 * (k // 32) * (256 + 64)  # two groups of 16 rows, records of q | d | m
    with pytest.raises(ValueError, match="unsupported GGUF block type 7"):
        ext.quant_pack_lanes(packed, 7, n, k)
    with pytest.raises(ValueError, match="packed blocks hold"):
        ext.quant_pack_lanes(packed[:-1].contiguous(), kind, n, k)
    with pytest.raises(ValueError, match=f"contiguous CPU tensor of {lanes.numel()} bytes"):
        ext.quant_linear_lanes(x, packed, kind, n, k)  # the row layout: another size
    with pytest.raises(ValueError, match=f"contiguous CPU tensor of {lanes.numel()} bytes"):
        ext.quant_linear_lanes(x, lanes[:-1].contiguous(), kind, n, k)
    with pytest.raises(ValueError, match=r"x must be \[M, 64\]"):
        ext.quant_linear_lanes(torch.randn(2, 32), lanes, kind, n, k)
    with pytest.raises(ValueError, match="unsupported GGUF block type 7"):
        ext.quant_linear_lanes(x, lanes, 7, n, k)
    with pytest.raises(ValueError, match="multiple of 256"):
        ext.quant_linear_lanes(x, lanes, int(T.Q4_K), n, k)
    with pytest.raises(ValueError, match="impl must be 'auto', 'avx2' or 'avx512' for the lanes layout, got 'scalar'"):
        ext.quant_linear_lanes(x, lanes, kind, n, k, "scalar")
    if "lanes-avx2" not in LANES:  # no VNNI loop here
        with pytest.raises(ValueError, match="impl 'avx512' needs a build for a CPU with AVX-512 VNNI"):
            ext.quant_linear_lanes(x, lanes, kind, n, k, "avx512")


# -- the K-quants: super-blocks of 256 weights (paged/models/kquants.py, csrc/cpu/quant_linear_k.h) ------------
K_QUANTS = (int(T.Q2_K), int(T.Q3_K), int(T.Q4_K), int(T.Q5_K), int(T.Q6_K))
K_KERNEL = (int(T.Q4_K), int(T.Q6_K))
# where each K-quant keeps its float16 factors: d (and dmin) byte offsets in its super-block
_K_HALVES = {int(T.Q2_K): (80, 82), int(T.Q3_K): (108,), int(T.Q4_K): (0, 2), int(T.Q5_K): (0, 2), int(T.Q6_K): (208,)}


def k_quantized(kind: int, n: int, k: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """A random ``[n, k]`` K-quant weight, as the file's bytes: every scale, min and q byte drawn at random
    (any byte is valid there), the float16 factors drawn in ``scale * [0.002, 0.05]``."""
    rng = np.random.default_rng(seed)
    size = K_FORMATS[kind][1]
    raw = rng.integers(0, 256, (n * k // 256, size), dtype=np.uint8)
    for at in _K_HALVES[kind]:
        halves = (rng.uniform(0.002, 0.05, n * k // 256) * scale).astype(np.float16)
        raw[:, at:at + 2] = halves.view(np.uint8).reshape(-1, 2)
    return torch.from_numpy(raw.reshape(-1).copy())


def _k_magnitude(packed: torch.Tensor, kind: int, n: int, k: int) -> torch.Tensor:
    """Per weight, float64: |d sc| q_max + |dmin m| (Q4_K), |d sc| 32 (Q6_K): the size of the kernel's terms."""
    b = packed.reshape(-1, K_FORMATS[kind][1])
    if kind == int(T.Q4_K):
        d, dmin = (b[:, a:a + 2].contiguous().view(torch.float16).double() for a in (0, 2))
        sc, mn = k_scales_mins(b[:, 4:16])
        mag = (d * sc.double()).abs() * 15 + (dmin * mn.double()).abs()  # [S, 8] per 32 weights
        return mag.repeat_interleave(32, dim=1).reshape(n, k)
    d = b[:, 208:210].contiguous().view(torch.float16).double()
    mag = (d * b[:, 192:208].contiguous().view(torch.int8).double()).abs() * 32  # [S, 16] per 16 weights
    return mag.repeat_interleave(16, dim=1).reshape(n, k)


@pytest.mark.parametrize("kind", K_QUANTS, ids=[K_FORMATS[k][0] for k in K_QUANTS])
@pytest.mark.parametrize("n, k", [(1, 256), (5, 512), (7, 768)])
def test_kquant_dequantize_is_ggufs_bitwise(ext, kind, n, k):
    """Bitwise: the torch formulas (every K-quant) and the kernel's (Q4_K, Q6_K) give gguf's weights."""
    packed = k_quantized(kind, n, k, seed=n * k + kind)
    want = torch.from_numpy(gguf.quants.dequantize(packed.numpy(), T(kind)).reshape(n, k).astype(np.float32))
    assert torch.equal(dequantize_blocks(packed, kind, n, k), want)
    if kind in K_KERNEL:
        assert torch.equal(ext.quant_dequantize(packed, kind, n, k), want)


@pytest.mark.parametrize("impl", IMPLS + LANES)
@settings(max_examples=30)
@given(kind=st.sampled_from(K_KERNEL), m=st.integers(1, 6), n=st.integers(1, 40), supers=st.integers(1, 4),
       seed=st.integers(0, 2**31), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       scale=st.sampled_from([1e-2, 1.0, 30.0]))
def test_kquant_linear_equals_dequantize_then_multiply(ext, impl, kind, m, n, supers, seed, dtype, scale):
    """Toleranced, as for the block formats: against x̂ · Wᵀ in float64 within float32 rounding of its
    terms (two per block of 32: 4 (2B + 8) u T), then one rounding to x's dtype."""
    k = 256 * supers
    packed = k_quantized(kind, n, k, seed, scale)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)
    y = _linear(ext, impl, x, packed, kind, n, k)
    assert y.dtype == dtype and y.shape == (m, n)
    x_hat = quantize_activations(x)
    want = x_hat.double() @ dequantize_blocks(packed, kind, n, k).double().T
    terms = x_hat.abs().double() @ _k_magnitude(packed, kind, n, k).T
    out_rounding = (BF16_ULP if dtype == torch.bfloat16 else U32) * want.abs()
    assert ((y.double() - want).abs() <= 4 * (2 * k // 32 + 8) * U32 * terms + out_rounding).all()


@pytest.mark.parametrize("impl", IMPLS + LANES)
@pytest.mark.parametrize("kind", K_KERNEL, ids=["Q4_K", "Q6_K"])
def test_kquant_rows_do_not_depend_on_the_batch_or_the_threads(ext, impl, kind):
    """Bitwise: each row alone equals its row in a batch of 5, and a layer split between two threads
    (2048 x 1024) gives the one-thread bits; in float32, where a reordered sum shows, and in bfloat16."""
    n, k = 2048, 1024
    packed = k_quantized(kind, n, k, 3)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(5, k, generator=torch.Generator().manual_seed(3)).to(dtype)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(2)
            batch = _linear(ext, impl, x, packed, kind, n, k)
            torch.set_num_threads(1)
            single = _linear(ext, impl, x, packed, kind, n, k)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(batch, single)
        for i in range(5):
            assert torch.equal(_linear(ext, impl, x[i:i + 1], packed, kind, n, k), batch[i:i + 1])


def test_kquant_refuses_a_k_that_is_not_super_blocks(ext):
    """Specific error: a K-quant weight needs K a multiple of 256."""
    packed = k_quantized(int(T.Q4_K), 2, 256, 0)
    with pytest.raises(ValueError, match="multiple of 256"):
        ext.quant_linear(torch.randn(1, 128), packed, int(T.Q4_K), 4, 128)


@pytest.mark.parametrize("kind", KINDS + K_KERNEL)
def test_auto_takes_the_widest_implementation_compiled_in(ext, kind):
    """Bitwise: ``impl="auto"`` gives the bits of the last of ``IMPLS`` (the widest this CPU runs), on a layer
    where the implementations' different orders of adding do show in the last bits."""
    n, k = 64, 2048
    packed = k_quantized(kind, n, k, 5) if kind in K_KERNEL else quantized(kind, n, k, 5)[1]
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5))
    results = {impl: ext.quant_linear(x, packed, kind, n, k, impl=impl) for impl in IMPLS}
    assert torch.equal(ext.quant_linear(x, packed, kind, n, k), results[IMPLS[-1]])
    if len(IMPLS) > 1:
        assert not torch.equal(results["scalar"], results[IMPLS[-1]])


def _extreme_blocks(kind: int, n: int, k: int) -> torch.Tensor:
    """The packed blocks of an ``[n, k]`` weight whose every q is at its largest magnitude: 15 (Q4_0, Q4_1,
    Q4_K, with Q4_K's 6-bit scales and mins 63), 31 (Q5_0), -128 in even rows and 127 in odd ones (Q8_0), 63
    (Q6_K, its scales 127); the float16 factors 2**-10."""
    half = np.frombuffer(np.float16(2.0**-10).tobytes(), np.uint8)
    if kind in K_KERNEL:
        size = K_FORMATS[kind][1]
        raw = np.full((n * k // 256, size), 0xFF, np.uint8)
        if kind == int(T.Q6_K):
            raw[:, 192:208] = 127
        for at in _K_HALVES[kind]:
            raw[:, at:at + 2] = half
        return torch.from_numpy(raw.reshape(-1).copy())
    size = BLOCK_FORMATS[kind][1]
    raw = np.full((n, k // 32, size), 0xFF, np.uint8)
    if kind == int(T.Q8_0):
        raw[0::2, :, 2:], raw[1::2, :, 2:] = 0x80, 0x7F
    raw[:, :, 0:2] = half
    if kind == int(T.Q4_1):
        raw[:, :, 2:4] = half
    return pack_blocks(raw.reshape(-1), kind, n, k)


@pytest.mark.parametrize("impl", LANES)
@pytest.mark.parametrize("kind", KINDS + K_KERNEL)
def test_the_lanes_hold_the_largest_products_exactly(ext, impl, kind):
    """Toleranced, as above (float32 rounding of the terms): every weight at its largest magnitude times every
    x at +-127 after rounding, the case where the AVX2 loop's 16-bit partial sums come nearest their limit
    (a sum of more products in 16 bits, or Q8_0's stored q + 128 multiplied as it is, wraps or saturates
    and misses by thousands of times the bound)."""
    n, k = 20, 512
    packed = _extreme_blocks(kind, n, k)
    x = torch.tensor([[1.0], [-1.0], [3.0]]).repeat(1, k)
    y = _linear(ext, impl, x, packed, kind, n, k)
    x_hat = quantize_activations(x)
    w = dequantize_blocks(packed, kind, n, k).double()
    assert (w == w[:, :1]).all() and (w != 0).all()  # one weight a row, not zero
    want = x_hat.double() @ w.T
    terms = (x_hat.abs().double() @ _k_magnitude(packed, kind, n, k).T if kind in K_KERNEL
             else _term_bound(x_hat, packed, kind, n, k))
    assert ((y.double() - want).abs() <= 4 * (2 * k // 32 + 8) * U32 * terms + U32 * want.abs()).all()
