"""The pair-order linear (``csrc/cpu/pair_order_linear.cpp``) against its specification.

* The order, bitwise: the kernel's output equals the documented order replayed here in torch (one
  float32 sum over K, a pair of positions at a time, the odd one first; the bias; one rounding). A
  product of two bfloat16 values is exact in float32, so the instruction's multiply-add and torch's
  multiply-then-add round alike: another order, or a lost or repeated term, moves bits. Probes whose
  sums cancel 2**24 tell each rule of the order apart with exact values.
* The sums, toleranced: within the float32 rounding of K + 1 additions of the float64 product.
* Batch invariance, bitwise: a row's output is the same alone, among other rows, split at any point,
  and on one thread or two, which is what batch-invariant mode asks of a linear.
* The layout ``pair_order_pack`` writes, exactly; and which layers take the kernel (``paged.models.layers``).

The loop needs AVX512_BF16; on a CPU without it these tests skip, saying so, except the one that checks
the kernel then refuses with a clear error.
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


@pytest.fixture(scope="module")
def loop(ext):
    if not ext.pair_order_compiled():
        pytest.skip("this CPU has no AVX512_BF16: the pair-order loop is not built here")
    return ext


def operands(m: int, n: int, k: int, seed: int, bias: bool):
    gen = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(m, k, generator=gen)).bfloat16()
    w = (0.05 * torch.randn(n, k, generator=gen)).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    return x, w, b


def pair_order(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's order, step by step in float32: ``[M, N]`` bfloat16."""
    xf, wf = x.float(), w.float()
    if x.shape[1] % 2:  # the last pair of an odd K: a 0 at position K
        xf, wf = torch.nn.functional.pad(xf, (0, 1)), torch.nn.functional.pad(wf, (0, 1))
    total = torch.zeros(x.shape[0], w.shape[0])
    for p in range(xf.shape[1] // 2):
        total = total + xf[:, None, 2 * p + 1] * wf[None, :, 2 * p + 1]
        total = total + xf[:, None, 2 * p] * wf[None, :, 2 * p]
    if bias is not None:
        total = total + bias.float()
    return total.bfloat16()


def run(ext, x, w, b=None, second_thread_bytes=2 << 20):
    return ext.pair_order_linear(x, ext.pair_order_pack(w), w.shape[0], b, second_thread_bytes)


shapes = st.tuples(st.integers(1, 20), st.integers(1, 40), st.integers(1, 80))


@settings(max_examples=30, deadline=None)
@given(shape=shapes, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_output_is_the_documented_order_bitwise(loop, shape, bias, seed):
    x, w, b = operands(*shape, seed, bias)
    assert torch.equal(run(loop, x, w, b), pair_order(x, w, b))


def test_documented_order_at_model_shapes(loop):
    """Bitwise, at SmolLM2's shapes (K = 576 and 1536) and rows that fill whole 6 x 64 tiles and leave
    some over, columns that leave a part of a vector, and an odd K."""
    for m, n, k in [(1, 1536, 576), (9, 577, 1536), (70, 64, 576), (6, 130, 576), (13, 17, 83)]:
        x, w, b = operands(m, n, k, m, bias=True)
        assert torch.equal(run(loop, x, w, b), pair_order(x, w, b)), (m, n, k)


BIG = 2.0**12  # BIG * BIG = 2**24: adding 1 to it rounds the 1 away (ties to even), subtracting it back is exact

# (products x[k] * w[k] by position k, bias, what the documented order gives): each probe cancels 2**24
# in the order the kernel documents, so an order that takes a pair's even position first, walks K
# otherwise, or adds the bias earlier keeps or loses the 1 and gives the other answer.
PROBES = {
    "a pair's odd position before its even one": ({0: BIG * BIG, 3: -BIG * BIG, 2: 1.0}, 0.0, 1.0),
    "and its even one after": ({0: BIG * BIG, 2: -BIG * BIG, 3: 1.0}, 0.0, 0.0),
    "one running sum, pair after pair": ({0: BIG * BIG, 2: 1.0, 4: -BIG * BIG}, 0.0, 0.0),
    "no lanes: k = 0 and k = 32 meet in one sum": ({0: BIG * BIG, 32: -BIG * BIG, 40: 1.0}, 0.0, 1.0),
    "the bias is added after the sum": ({0: BIG * BIG, 2: -BIG * BIG}, 1.0, 1.0),
}


@pytest.mark.parametrize("probe", list(PROBES))
def test_the_order_decides_cancelling_sums_as_documented(loop, probe):
    """Exact values: a sum of 2**24, 1 and -2**24 is 0 or 1 by the order alone. Each probe runs as every
    row of a 7-row call by 20 output columns (a full tile, an edge row tile, part of a vector) and as a
    lone row, with K just past its last product (odd or even) and one longer."""
    products, bias, expected = PROBES[probe]
    for k in (max(products) + 1, max(products) + 2):
        x, w = torch.zeros(k), torch.zeros(k)
        for position, product in products.items():
            x[position], w[position] = (BIG, product / BIG) if abs(product) > 1 else (1.0, product)
        xs, ws = x.expand(7, k).bfloat16(), w.expand(20, k).contiguous().bfloat16()
        bs = torch.full((20,), bias, dtype=torch.bfloat16)
        want = torch.full((7, 20), expected, dtype=torch.bfloat16)
        assert torch.equal(pair_order(xs, ws, bs), want), k
        assert torch.equal(run(loop, xs, ws, bs), want), k
        assert run(loop, xs[:1], ws[:1], bs[:1]).item() == expected, k


def test_an_input_below_the_normal_range_counts_as_zero(loop):
    """Exact: the instruction reads a bfloat16 below float32's normal range as 0 (the order's rule), so
    2**-130 * 2**100 adds nothing, where a plain float32 product would give 2**-30."""
    tiny, huge = torch.tensor([2.0**-130]).bfloat16(), torch.tensor([2.0**100]).bfloat16()
    assert tiny.item() == 2.0**-130 and (tiny.float() * huge.float()).item() == 2.0**-30
    x, w = torch.cat([tiny, torch.ones(1).bfloat16()])[None], torch.cat([huge, torch.zeros(1).bfloat16()])[None]
    assert run(loop, x, w).item() == 0.0


@settings(max_examples=30, deadline=None)
@given(shape=shapes, bias=st.booleans(), seed=st.integers(0, 2**16))
def test_sums_within_the_rounding_of_their_order(loop, shape, bias, seed):
    """Toleranced: K + 1 float32 additions from the float64 product (at most (K + 1) u Σ|x||w|), then
    one rounding to bfloat16 (at most its unit roundoff, 2**-8, of the float32 sum)."""
    x, w, b = operands(*shape, seed, bias)
    k = x.shape[1]
    exact = x.double() @ w.double().T + (b.double() if b is not None else 0)
    magnitude = x.double().abs() @ w.double().abs().T + (b.double().abs() if b is not None else 0)
    float32_error = (k + 1) * U32 * magnitude
    error = (run(loop, x, w, b).double() - exact).abs()
    assert (error <= float32_error + 2.0**-8 * (exact.abs() + float32_error) + 1e-30).all()


def test_a_row_gets_the_same_bits_alone_among_others_and_on_one_thread(loop):
    """Bitwise: 150 rows at once, each alone, in uneven slices, and on one thread instead of two."""
    x, w, b = operands(150, 1000, 576, 7, bias=True)
    packed = loop.pair_order_pack(w)
    among = loop.pair_order_linear(x, packed, 1000, b)
    alone = torch.cat([loop.pair_order_linear(x[i:i + 1], packed, 1000, b) for i in range(150)])
    sliced = torch.cat([loop.pair_order_linear(x[lo:hi], packed, 1000, b)
                        for lo, hi in [(0, 3), (3, 67), (67, 68), (68, 150)]])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one_thread = loop.pair_order_linear(x, packed, 1000, b)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, among) and torch.equal(sliced, among) and torch.equal(one_thread, among)


@pytest.mark.parametrize("rows", [1, 5])
def test_the_second_thread_rule_changes_no_bit(loop, rows):
    x, w, b = operands(rows, 960, 576, 11, bias=True)
    split = [run(loop, x, w, b, second_thread_bytes) for second_thread_bytes in (0, 2 << 20, 1 << 62)]
    assert torch.equal(split[0], split[1]) and torch.equal(split[0], split[2])


def test_a_strided_x_reads_its_own_rows(loop):
    x, w, _ = operands(20, 30, 64, 3, bias=False)
    for view in (x[::2], torch.cat([x, x], dim=1)[:, 64:]):
        assert torch.equal(run(loop, view, w), run(loop, view.contiguous(), w))


def test_the_packed_layout(ext):
    """Exact: ``packed[b, p, c, h] = w[16 b + c, 2 p + h]``, zeros past N and K (runs on any CPU)."""
    w = torch.arange(1, 35 * 7 + 1, dtype=torch.float32).reshape(35, 7).bfloat16()
    packed = ext.pair_order_pack(w)
    assert packed.shape == (3, 4, 16, 2) and packed.dtype == torch.bfloat16
    want = torch.zeros(48, 8, dtype=torch.bfloat16)
    want[:35, :7] = w
    assert torch.equal(packed, want.reshape(3, 16, 4, 2).permute(0, 2, 1, 3))


def test_no_rows_or_no_columns(loop):
    x, w, _ = operands(4, 5, 16, 0, bias=False)
    assert run(loop, x[:0], w).shape == (0, 5)
    assert loop.pair_order_linear(x, loop.pair_order_pack(w[:0]), 0).shape == (4, 0)


def test_bad_arguments_are_named(loop):
    x, w, b = operands(4, 5, 16, 0, bias=True)
    packed = loop.pair_order_pack(w)
    with pytest.raises(TypeError, match="x and packed w must be bfloat16, got Float and BFloat16"):
        loop.pair_order_linear(x.float(), packed, 5)
    with pytest.raises(ValueError, match=r"pair_order_pack's \[ceil\(N/16\), ceil\(K/2\), 16, 2\] for N = 5 and "
                                         r"x's K = 18, got shape \[1, 8, 16, 2\]"):
        loop.pair_order_linear(torch.cat([x, x[:, :2]], dim=1), packed, 5)
    with pytest.raises(ValueError, match="for N = 17"):
        loop.pair_order_linear(x, packed, 17)
    with pytest.raises(ValueError, match=r"bias must be a contiguous CPU \[5\], got shape \[4\]"):
        loop.pair_order_linear(x, packed, 5, b[:4])
    with pytest.raises(TypeError, match="w must be bfloat16, got Float"):
        loop.pair_order_pack(w.float())


def test_amx_is_read_from_the_cpu_flags(monkeypatch):
    """Exact: ``cpu_flags`` reads the words after ``flags :`` in /proc/cpuinfo (a flags line stood in for,
    so AMX is seen on a CPU without it), and ``cpu_has_amx`` is whether ``amx_bf16`` is among them."""
    from paged.models import layers

    line = "flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n"
    monkeypatch.setattr(cpu, "_flags_line", lambda: line)
    assert cpu.cpu_flags() == {"fpu", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert layers.cpu_has_amx()
    monkeypatch.setattr(cpu, "_flags_line", lambda: line.replace(" amx_bf16", ""))
    assert not layers.cpu_has_amx()
    monkeypatch.setattr(cpu, "_flags_line", lambda: None)  # no /proc/cpuinfo
    assert cpu.cpu_flags() == frozenset() and not layers.cpu_has_amx()


def test_the_loop_is_compiled_where_the_cpu_has_avx512_bf16(ext):
    flags = cpu.cpu_flags()
    assert ext.pair_order_compiled() == all(f in flags for f in ("avx512f", "avx512bw", "avx512_bf16"))
    if not ext.pair_order_compiled():  # and where it is not, a call says why instead of giving zeros
        x, w, _ = operands(2, 3, 8, 0, bias=False)
        with pytest.raises(RuntimeError, match="no AVX512_BF16 loop"):
            ext.pair_order_linear(x, ext.pair_order_pack(w), 3)


def test_which_layers_run_the_pair_order(ext, monkeypatch):
    """``layers.use_pair_order``: bfloat16 CPU weights where the loop is built and the CPU has no AMX; such
    layers count as fixed-order (``use_fixed_order_linears``) in either mode, and ``pack_pair_order_linears`` gives them
    the packed copy, not above ``PREPACK_MAX_BYTES`` nor with ``PAGED_PREPACK_WEIGHTS=0``."""
    from paged.models import layers

    monkeypatch.delenv("PAGED_FIXED_ORDER_LINEAR", raising=False)
    monkeypatch.delenv("PAGED_PREPACK_WEIGHTS", raising=False)
    monkeypatch.setattr(layers, "cpu_has_amx", lambda: False)
    w = torch.zeros(4, 8)
    built = ext.pair_order_compiled()
    assert layers.use_pair_order(w.bfloat16()) == built
    assert not layers.use_pair_order(w) and not layers.use_pair_order(w.half())
    assert not layers.use_pair_order(w.bfloat16().to("meta"))
    for mode in (True, False):
        assert layers.use_fixed_order_linears(w.bfloat16(), batch_invariant=mode) == (
            built or (not layers.cpu_has_bf16_gemm() and ext.fixed_order_avx2_compiled()))
    monkeypatch.setenv("PAGED_FIXED_ORDER_LINEAR", "0")  # off means off, this kernel too
    assert not layers.use_fixed_order_linears(w.bfloat16())
    monkeypatch.delenv("PAGED_FIXED_ORDER_LINEAR")
    monkeypatch.setattr(layers, "cpu_has_amx", lambda: True)  # a Xeon with AMX keeps oneDNN's GEMM
    assert not layers.use_pair_order(w.bfloat16())
    assert layers.use_fixed_order_linears(w.bfloat16()) == (not layers.cpu_has_bf16_gemm()
                                                            and ext.fixed_order_avx2_compiled())
    monkeypatch.setattr(layers, "cpu_has_amx", lambda: False)

    monkeypatch.setattr(layers, "use_pair_order", lambda weight: weight.dtype == torch.bfloat16)
    model = torch.nn.Sequential(layers.Linear(8, 4, bias=False), layers.Linear(8, 4, bias=False)).bfloat16()
    model[0].fixed_order, model[1].fixed_order = True, False
    assert layers.pack_pair_order_linears(model) == 1
    assert torch.equal(model[0].pair_weight, ext.pair_order_pack(model[0].weight)) and model[1].pair_weight is None
    monkeypatch.setenv("PAGED_PREPACK_WEIGHTS", "0")
    assert layers.pack_pair_order_linears(model) == 0 and model[0].pair_weight is None
    monkeypatch.setenv("PAGED_PREPACK_WEIGHTS", "auto")
    monkeypatch.setattr(layers, "PREPACK_MAX_BYTES", 8 * 4 * 2 - 1)
    assert layers.pack_pair_order_linears(model) == 0
    monkeypatch.setenv("PAGED_PREPACK_WEIGHTS", "1")
    assert layers.pack_pair_order_linears(model) == 1


def test_gemm_runs_the_pair_order_by_the_packed_weight(loop):
    """``layers.gemm`` of a fixed-order layer with a ``pair_weight``: bitwise the kernel's product for
    any row count (no lone row padded), with the bias; without the copy, ``fixed_order_linear``'s."""
    from paged.models import layers

    torch.manual_seed(3)
    layer = layers.Linear(40, 24).bfloat16()
    layer.fixed_order = True
    with torch.no_grad():
        for rows in (1, 7, 300):
            x = torch.randn(rows, 40).bfloat16()
            layer.pair_weight = None
            assert torch.equal(layer(x), loop.fixed_order_linear(x, layer.weight, layer.bias)), rows
            layer.pair_weight = loop.pair_order_pack(layer.weight)
            assert torch.equal(layer(x), pair_order(x, layer.weight, layer.bias)), rows
