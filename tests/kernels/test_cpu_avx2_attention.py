"""The AVX2 attention kernels (``csrc/cpu/paged_attention_avx2.cpp``): the scalar kernels' arithmetic.

Levels of equality: **bitwise** (``torch.equal``) against the scalar kernel (the
specification) on the same call, decode and prefill, float32 and bfloat16, with
windows and soft-caps, any query tile, one thread or two: the AVX2 file does the
scalar's operations on every row in the same order (the products rounded before
they are added, the scalar's lane tree, the same ``std::tanh``, the softmax exp of
``softmax_exp.h`` eight at a time), so nothing is toleranced; the exp itself is held
bitwise to its plain form and, toleranced, to float64's. (Against each token's decode alone the avx2 prefill is
checked in test_cpu_prefill.py and test_cpu_window.py, like every implementation.)
Float64 and head dims that are not a multiple of 16 are the scalar's only: ``impl="avx2"``
refuses them, ``impl="auto"`` runs the scalar.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from paged.kernels import cpu
from tests.kernels.test_cpu_kernel import _cpu_has_avx2
from tests.kernels.test_cpu_prefill import AVX512_DIMS, make_prefill
from tests.kernels.test_cpu_window import make_window, window_cases

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def ext():
    module = cpu.load(strict=True)
    if not module.avx2_compiled():
        pytest.skip("this CPU has no AVX2: the avx2 kernels are not compiled (the scalar ones run)")
    return module


def test_avx2_is_compiled_exactly_where_the_cpu_has_it():
    """Exact: ``-march=native`` builds the AVX2 file's vector code iff /proc/cpuinfo lists avx2 (every
    x86-64 CI machine does: the tests below then run, they do not skip)."""
    assert cpu.load(strict=True).avx2_compiled() == _cpu_has_avx2()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(data=st.data(), query_tile=st.sampled_from([1, 3, 32]))
def test_avx2_prefill_bitwise_equal_scalar(ext, dtype, data, query_tile):
    """Bitwise: windowed, soft-capped (or not) prefills, packed sequences of any query lengths."""
    case, window, softcap = data.draw(window_cases(st.sampled_from(AVX512_DIMS)), label="case")
    args, _ = make_window(case, window, dtype)
    want = ext.prefill(*args, None, "scalar", query_tile, window, softcap)
    got = ext.prefill(*args, None, "avx2", query_tile, window, softcap)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@given(data=st.data())
def test_avx2_decode_bitwise_equal_scalar(ext, dtype, data):
    """Bitwise: decode of up to 4 sequences, windowed, soft-capped (or not)."""
    case, window, softcap = data.draw(window_cases(st.sampled_from(AVX512_DIMS), max_seqs=4, decode=True),
                                      label="case")
    query, key_cache, value_cache, tables, context_lens, _, scale = make_window(case, window, dtype)[0]
    want = ext.decode(query, key_cache, value_cache, tables, context_lens, scale, None, "scalar", 0, window, softcap)
    got = ext.decode(query, key_cache, value_cache, tables, context_lens, scale, None, "avx2", 0, window, softcap)
    assert torch.equal(got, want)


def test_avx2_smollm2_shapes_bitwise_equal_scalar_on_one_or_two_threads(ext):
    """Bitwise, at SmolLM2's shapes (9 / 3 heads, D = 64, B = 16, bfloat16): a 300-token prompt, a 33-token
    tail over a cached prefix and a decode token in one call; one thread and two; and the decode of the
    three sequences' last tokens, alone (a call small enough to run on one thread whatever torch's count)
    and eight times over in one call (work enough for two)."""
    case = (16, 9, 3, 64, [(300, 300), (70, 33), (17, 1)], list(range(30))[::-1], 8.0, 5)
    args, _ = make_prefill(case, torch.bfloat16)
    want = ext.prefill(*args, None, "scalar", 32)
    query, key_cache, value_cache, tables, context_lens, _, scale = args
    last = query[[299, 332, 333]]
    decode_lens = torch.tensor([300, 70, 17], dtype=torch.int32)
    want_decode = ext.decode(last, key_cache, value_cache, tables, decode_lens, scale, None, "scalar", 0)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert torch.equal(ext.prefill(*args, None, "avx2", 32), want), threads
            assert torch.equal(ext.decode(last, key_cache, value_cache, tables, decode_lens, scale, None, "avx2", 0),
                               want_decode), threads
            eight = ext.decode(last.repeat(8, 1, 1), key_cache, value_cache, tables.repeat(8, 1),
                               decode_lens.repeat(8), scale, None, "avx2", 0)
            assert torch.equal(eight, want_decode.repeat(8, 1, 1)), threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype, d, says", [(torch.float64, 64, "Double"), (torch.float32, 40, "D = 40"),
                                            (torch.bfloat16, 24, "D = 24")])
def test_avx2_refuses_what_it_does_not_take_and_auto_runs_the_scalar(ext, dtype, d, says):
    """Exact: ``impl="avx2"`` on float64 or a head dim that is not a multiple of 16 is a ValueError naming
    it and writes nothing; ``impl="auto"`` gives the scalar's bits."""
    args, _ = make_prefill((16, 4, 2, d, [(40, 40)], list(range(4)), 1.0, 3), dtype)
    out = torch.full_like(args[0], 7.0)
    with pytest.raises(ValueError, match=f"impl 'avx2' needs .*{says}"):
        ext.prefill(*args, out, "avx2", 32)
    assert (out == 7.0).all()
    assert torch.equal(ext.prefill(*args, None, "auto", 32), ext.prefill(*args, None, "scalar", 32))


def _exp_inputs() -> torch.Tensor:
    """Every kind of x the softmax gives its exp: a sweep of [-87, 0], random values, tiny ones,
    the edges, below the edge, -inf (the first block's running maximum) and NaN (a lane count
    that is not a multiple of 8, so the scalar tail runs too)."""
    sweep = torch.linspace(-87.0, 0.0, 200_001)
    spread = -torch.rand(100_000, generator=torch.Generator().manual_seed(0)) * 87.0
    tiny = -torch.logspace(-30, 0, 1_000)
    edges = torch.tensor([0.0, -0.0, -87.0, -86.99999, -87.00001, -88.0, -103.0, -1e30,
                          float("-inf"), float("nan"), -0.6931472, -0.3465736, -1e-7])
    return torch.cat([sweep, spread, tiny, edges]).float()


def test_softmax_exp_avx2_bitwise_equal_scalar_and_within_2_ulp_of_libm(ext):
    """The kernels' exp (``csrc/cpu/softmax_exp.h``): the AVX2 vector one bitwise the scalar one on
    every input (so the two kernels' probabilities agree bit for bit); both within 2 float32 ulp
    of exp computed in float64 on [-87, 0] (the Cephes polynomial: a toleranced check of the
    formula, as libm is itself within an ulp); exactly 0 below -87 and for -inf; NaN stays NaN."""
    x = _exp_inputs()
    scalar, vector = ext.softmax_exp(x, "scalar"), ext.softmax_exp(x, "avx2")
    nan = x.isnan()
    assert torch.equal(vector[~nan], scalar[~nan]) and vector[nan].isnan().all() and scalar[nan].isnan().all()
    kept = x >= -87.0
    want = torch.exp(x[kept].double())
    ulp = (torch.nextafter(want.float(), torch.tensor(float("inf"))) - want.float()).double()
    error = (scalar[kept].double() - want).abs() / ulp
    assert error.max() <= 2.0, f"{error.max():.2f} ulp at x = {x[kept][error.argmax()].item()!r}"
    assert (scalar[(x < -87.0) & ~nan] == 0).all()
    assert scalar[x == 0].eq(1.0).all()


def test_softmax_exp_refuses_what_it_does_not_take(ext):
    with pytest.raises(TypeError, match="x must be float32"):
        ext.softmax_exp(torch.zeros(4, dtype=torch.float64), "scalar")
    with pytest.raises(ValueError, match="impl must be 'scalar' or 'avx2', got 'avx512'"):
        ext.softmax_exp(torch.zeros(4), "avx512")
