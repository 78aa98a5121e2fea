"""The fixed-order linear (``csrc/cpu/fixed_order_linear.cpp``) against its specification.

* The order, bitwise, for bfloat16: the kernel's output equals the documented order run here
  in torch (8 float32 lanes over K in steps of 8, the tail, the tree, the bias, one rounding).
  A product of two bfloat16 values is exact in float32, so the kernel's fused multiply-add and
  torch's multiply-then-add round alike: any other order, or a lost or repeated term, moves bits.
* The sums, toleranced, for float32 (a fused multiply-add rounds once where torch would round
  twice, so the order cannot be replayed bit for bit in torch): against the float64 product,
  within the float32 rounding of ``K / 8 + 4`` additions, ``(K / 8 + 4) u Σ|x||w|``.
* Batch invariance, bitwise: a row's output is the same alone, among other rows, split at any
  point, and on one thread or two. This is what batch-invariant mode asks of a linear.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.kernels import cpu

U32 = 2.0**-24


@pytest.fixture(scope="module")
def ext():
    return cpu.load(strict=True)


def operands(m: int, n: int, k: int, dtype: torch.dtype, seed: int, bias: bool):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(m, k, generator=gen)).to(dtype)
    w = (0.05 * torch.randn(n, k, generator=gen)).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x, w, b


def documented_order(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's order, step by step in float32: ``[M, N]`` in x's dtype."""
    xf, wf = x.float(), w.float()
    k = x.shape[1]
    full = k - k % 8
    lanes = torch.zeros(x.shape[0], w.shape[0], 8)
    for k0 in range(0, full, 8):
        lanes = lanes + xf[:, None, k0:k0 + 8] * wf[None, :, k0:k0 + 8]
    for lane in range(k % 8):
        lanes[:, :, lane] = lanes[:, :, lane] + xf[:, None, full + lane] * wf[None, :, full + lane]
    lanes = lanes[..., :4] + lanes[..., 4:]
    lanes = lanes[..., :2] + lanes[..., 2:]
    total = lanes[..., 0] + lanes[..., 1]
    if bias is not None:
        total = total + bias.float()
    return total.to(x.dtype)


shapes = st.tuples(st.integers(1, 20), st.integers(1, 13), st.integers(1, 80))


@settings(max_examples=30)
@given(shape=shapes, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_bfloat16_output_is_the_documented_order_bitwise(ext, shape, bias, seed):
    x, w, b = operands(*shape, torch.bfloat16, seed, bias)
    assert torch.equal(ext.fixed_order_linear(x, w, b), documented_order(x, w, b))


def test_bfloat16_documented_order_at_model_shapes(ext):
    """Bitwise, at SmolLM2's shapes (K = 576 and 1536) and rows that fill whole tiles and leave some over;
    four rows alone (a bfloat16 tile of 4 rows runs its 3 columns as 2 + 1), with and without a tail of K."""
    for m, n, k in [(1, 1536, 576), (9, 577, 1536), (70, 64, 576), (4, 577, 576), (4, 13, 83)]:
        x, w, b = operands(m, n, k, torch.bfloat16, m, bias=False)
        assert torch.equal(ext.fixed_order_linear(x, w, b), documented_order(x, w, b)), (m, n, k)


BIG = 2.0**12  # BIG * BIG = 2**24: adding 1 to it rounds the 1 away (ties to even), subtracting it back is exact

# (products x[k] * w[k] by position k, bias, what the documented order gives): each probe cancels 2**24
# in the order the kernel documents, so an order that pairs other lanes, walks K otherwise, puts the
# tail in another lane or adds the bias earlier loses or keeps the 1 and gives the other answer.
PROBES = {
    "the tree pairs lane l with lane l + 4 first": ({0: BIG * BIG, 1: 1.0, 4: -BIG * BIG}, 0.0, 1.0),
    "then lane l with lane l + 2": ({0: BIG * BIG, 1: 1.0, 2: -BIG * BIG}, 0.0, 1.0),
    "lane 0 sums k = 0, 8, 16 in that order": ({0: BIG * BIG, 8: 1.0, 16: -BIG * BIG}, 0.0, 0.0),
    "the tail of K goes to lanes 0, 1, ...": ({0: BIG * BIG, 4: -BIG * BIG, 8: 1.0}, 0.0, 0.0),
    "the bias is added after the tree": ({0: BIG * BIG, 4: -BIG * BIG}, 1.0, 1.0),
}


@pytest.mark.parametrize("whole_eights", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("probe", list(PROBES))
def test_the_order_decides_cancelling_sums_as_documented(ext, probe, dtype, whole_eights):
    """Exact values: a sum of 2**24, 1 and -2**24 is 0 or 1 by the order alone. Each probe runs as every
    row of a 5-row call by 4 output columns (a full 4 x 3 tile and the edge tiles) and as a lone row,
    with K just past its last product and with K padded by zeros to a whole number of 8s (no tail: the
    AVX2 loop then takes the tree in registers instead of in ``finish``)."""
    products, bias, expected = PROBES[probe]
    k = max(products) + 1
    if whole_eights:
        k = -(-k // 8) * 8
    x, w = torch.zeros(k), torch.zeros(k)
    for position, product in products.items():
        x[position], w[position] = (BIG, product / BIG) if abs(product) > 1 else (1.0, product)
    xs, ws, bs = x.expand(5, k).to(dtype), w.expand(4, k).contiguous().to(dtype), torch.full((4,), bias, dtype=dtype)
    assert torch.equal(documented_order(xs, ws, bs), torch.full((5, 4), expected, dtype=dtype))
    assert torch.equal(ext.fixed_order_linear(xs, ws, bs), torch.full((5, 4), expected, dtype=dtype))
    assert ext.fixed_order_linear(xs[:1], ws[:1], bs[:1]).item() == expected


@settings(max_examples=30)
@given(shape=shapes, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_float32_sums_within_the_rounding_of_their_order(ext, shape, bias, seed):
    x, w, b = operands(*shape, torch.float32, seed, bias)
    k = x.shape[1]
    exact = x.double() @ w.double().T + (b.double() if b is not None else 0)
    magnitude = x.double().abs() @ w.double().abs().T + (b.double().abs() if b is not None else 0)
    error = (ext.fixed_order_linear(x, w, b).double() - exact).abs()
    assert (error <= (k // 8 + 4) * U32 * magnitude + 1e-30).all(), float((error / magnitude).max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_row_gets_the_same_bits_alone_among_others_and_on_one_thread(ext, dtype):
    """Bitwise: 150 rows at once, each alone, in uneven slices, and on one thread instead of two."""
    x, w, b = operands(150, 1000, 576, dtype, 7, bias=True)
    among = ext.fixed_order_linear(x, w, b)
    alone = torch.cat([ext.fixed_order_linear(x[i:i + 1], w, b) for i in range(150)])
    sliced = torch.cat([ext.fixed_order_linear(x[lo:hi], w, b) for lo, hi in [(0, 3), (3, 67), (67, 68), (68, 150)]])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one_thread = ext.fixed_order_linear(x, w, b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, among) and torch.equal(sliced, among) and torch.equal(one_thread, among)


@pytest.mark.parametrize("rows", [1, 5])
def test_the_second_thread_rule_changes_no_bit(ext, rows):
    """Bitwise: a call split over the threads from any size of work (``second_thread_bytes`` 0: every
    tile a task; 2 MB, the default; never) gives the same outputs, one row or a few."""
    x, w, b = operands(rows, 960, 576, torch.bfloat16, 11, bias=True)
    split = [ext.fixed_order_linear(x, w, b, second_thread_bytes) for second_thread_bytes in (0, 2 << 20, 1 << 62)]
    assert torch.equal(split[0], split[1]) and torch.equal(split[0], split[2])


def test_a_strided_x_reads_its_own_rows(ext):
    """Bitwise: a view of every other row, and of a column slice, gives the result of its contiguous copy."""
    x, w, _ = operands(20, 30, 64, torch.bfloat16, 3, bias=False)
    for view in (x[::2], torch.cat([x, x], dim=1)[:, 64:]):
        assert torch.equal(ext.fixed_order_linear(view, w), ext.fixed_order_linear(view.contiguous(), w))


def test_no_rows_or_no_columns(ext):
    x, w, _ = operands(4, 5, 16, torch.float32, 0, bias=False)
    assert ext.fixed_order_linear(x[:0], w).shape == (0, 5)
    assert ext.fixed_order_linear(x, w[:0]).shape == (4, 0)


def test_bad_arguments_are_named(ext):
    x, w, b = operands(4, 5, 16, torch.float32, 0, bias=True)
    with pytest.raises(TypeError, match="w must have x's dtype"):
        ext.fixed_order_linear(x, w.bfloat16())
    with pytest.raises(TypeError, match="x must be float32 or bfloat16, got Half"):
        ext.fixed_order_linear(x.half(), w.half())
    with pytest.raises(ValueError, match=r"the same K, got shapes \[4, 16\] and \[5, 15\]"):
        ext.fixed_order_linear(x, w[:, :15].contiguous())
    with pytest.raises(ValueError, match="w must be contiguous"):
        ext.fixed_order_linear(x, torch.cat([w, w], dim=1)[:, :16])
    with pytest.raises(ValueError, match=r"bias must be a contiguous CPU \[5\], got shape \[4\]"):
        ext.fixed_order_linear(x, w, b[:4])
    with pytest.raises(TypeError, match="bias must have x's dtype"):
        ext.fixed_order_linear(x, w, b.double())


def test_the_vector_loop_is_compiled_where_the_cpu_has_avx2_and_fma(ext):
    flags = cpu.cpu_flags()  # what -march=native sees
    assert ext.fixed_order_avx2_compiled() == ("avx2" in flags and "fma" in flags)


def test_which_linears_take_the_kernel(ext, monkeypatch):
    """``layers.use_fixed_order_linears``: by default where the AVX2 loop is built, in either mode, for float32
    weights, and for bfloat16 ones where this CPU has no bfloat16 GEMM; forced on (batch-invariant mode) or off (both)
    by ``PAGED_FIXED_ORDER_LINEAR``; float32 and bfloat16 CPU weights only; never without the kernels.
    ``layers.fixed_order_rows``: any row count but for float32 with the mode off. (A CPU with AVX512_BF16
    runs bfloat16 layers in the pair order instead: test_pair_order_linear.py; left out here.)"""
    from paged.models import layers

    w = torch.zeros(2, 8)
    monkeypatch.delenv("PAGED_FIXED_ORDER_LINEAR", raising=False)
    monkeypatch.setattr(layers, "use_pair_order", lambda weight: False)
    assert layers.use_fixed_order_linears(w) == ext.fixed_order_avx2_compiled()
    assert layers.use_fixed_order_linears(w.bfloat16()) == (not layers.cpu_has_bf16_gemm()
                                                            and ext.fixed_order_avx2_compiled())
    for has_bf16_gemm in (False, True):
        monkeypatch.setattr(layers, "cpu_has_bf16_gemm", lambda: has_bf16_gemm)
        for mode in (True, False):  # the default rule: bfloat16 where this CPU has no bfloat16 GEMM, float32 always
            assert layers.use_fixed_order_linears(w.bfloat16(), batch_invariant=mode) == (not has_bf16_gemm)
            assert layers.use_fixed_order_linears(w, batch_invariant=mode)
        monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "1")
        assert layers.use_fixed_order_linears(w) and layers.use_fixed_order_linears(w.bfloat16())
        assert not layers.use_fixed_order_linears(w.half()) and not layers.use_fixed_order_linears(w.to("meta"))
        # forcing it on is for batch-invariant mode; with the mode off the default rule still decides
        assert layers.use_fixed_order_linears(w, batch_invariant=False)
        assert layers.use_fixed_order_linears(w.bfloat16(), batch_invariant=False) == (not has_bf16_gemm)
        monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "0")
        assert not layers.use_fixed_order_linears(w) and not layers.use_fixed_order_linears(w.bfloat16())
        assert not layers.use_fixed_order_linears(w.bfloat16(), batch_invariant=False)
        monkeypatch.delenv("PAGED_FIXED_ORDER_LINEAR")
    assert layers.fixed_order_rows(w, batch_invariant=False) == layers.FLOAT32_FIXED_ORDER_ROWS
    assert layers.fixed_order_rows(w, batch_invariant=True) is None
    assert layers.fixed_order_rows(w.bfloat16(), batch_invariant=False) is None
    monkeypatch.setattr(layers, "cpu_has_bf16_gemm", lambda: False)

    class ScalarOnly:  # a CPU without AVX2 + FMA: the scalar loop, only when asked for
        fixed_order_avx2_compiled = staticmethod(lambda: False)

    monkeypatch.setattr(layers, "load_cpu_kernels", ScalarOnly)
    assert not layers.use_fixed_order_linears(w.bfloat16())
    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "1")
    assert layers.use_fixed_order_linears(w.bfloat16())
    monkeypatch.setattr(layers, "load_cpu_kernels", lambda: None)  # no compiler: the padded path
    assert not layers.use_fixed_order_linears(w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_takes_the_kernel_up_to_the_layers_row_limit(ext, monkeypatch, dtype):
    """``layers.gemm`` of a fixed-order layer: bitwise the kernel's product for calls of up to
    ``fixed_order_rows`` rows (every call when it is None), bitwise the stock ``F.linear`` above; which
    one ran is also seen by counting the kernel's calls."""
    from paged.models import layers

    torch.manual_seed(3)
    layer = layers.Linear(40, 24).to(dtype)
    layer.fixed_order = True
    calls = []
    kernels = layers.load_cpu_kernels()

    class Counting:
        @staticmethod
        def fixed_order_linear(*args):
            calls.append(args[0].shape[0])
            return kernels.fixed_order_linear(*args)

    monkeypatch.setattr(layers, "load_cpu_kernels", Counting)
    with torch.no_grad():
        for most, rows in ((None, 300), (4, 4), (4, 5), (128, 1), (128, 129)):
            layer.fixed_order_rows = most
            x = torch.randn(rows, 40).to(dtype)
            took_kernel = most is None or rows <= most
            want = (ext.fixed_order_linear(x, layer.weight, layer.bias) if took_kernel
                    else torch.nn.functional.linear(x, layer.weight, layer.bias))
            calls.clear()
            assert torch.equal(layer(x), want), (most, rows)
            assert calls == ([rows] if took_kernel else []), (most, rows)
