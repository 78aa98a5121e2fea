"""The C++ CPU decode kernel (``csrc/cpu``) equals contiguous attention (paper §4.1).

Each case writes sequences' K/V into a paged cache through block tables over a
shuffled free list (tables are non-monotone), one query token per sequence, and
compares the kernel with ``tests/oracle.py::contiguous_attention`` over the
gathered contiguous K/V. Unused cache slots hold NaN and unused block-table
entries hold -1, so a kernel that reads past ``#filled`` or past a sequence's
blocks fails.

Levels of equality, all toleranced because the kernel reorders the sums (block by
block with an online softmax) and, for avx512, uses a polynomial exp:

* float64 (scalar): ``FLOAT64`` — the same float64 arithmetic reordered.
* float32 (scalar, avx512): ``FLOAT32`` against the float32 oracle.
* bfloat16 (scalar, avx512): ``CPU_BFLOAT16`` against the float32 oracle over the same
  bfloat16 values — float32 accumulation, then one rounding of the output.
* ``write_kv``: bitwise (``torch.equal``) against advanced indexing: a pure copy.

Implementations: scalar and avx512 are each checked, avx512 also with every
sequence split into partitions (split-context), and so is the dispatcher users
call. The extension is built once per session; a build
failure fails these tests (``load(strict=True)``), it never skips them.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.kernels import cpu
from tests import tolerances
from tests.oracle import contiguous_attention
from tests.strategies import block_sizes, gqa_heads, head_dims, model_head_dims, seq_lens, shuffled_free_list

TOLERANCE = {
    torch.float64: tolerances.FLOAT64,
    torch.float32: tolerances.FLOAT32,
    torch.bfloat16: tolerances.CPU_BFLOAT16,
}


@pytest.fixture(scope="module")
def ext():
    """The compiled extension (built once; a failed build fails the tests)."""
    return cpu.load(strict=True)


@st.composite
def decode_cases(draw, dims=st.one_of(head_dims, model_head_dims), max_seqs=4):
    """(B, H, H_kv, D, context_lens, free-list order, score multiplier, seed)."""
    b = draw(block_sizes)
    h, h_kv = draw(gqa_heads())
    d = draw(dims)
    lens = draw(st.lists(seq_lens(b, max_blocks=5, min_len=1), min_size=1, max_size=max_seqs))
    order = draw(shuffled_free_list(sum(-(-n // b) for n in lens) + 2))
    # x8 makes scores of tens, so the running maximum jumps between blocks and
    # the rescaling of the accumulator matters.
    sharpness = draw(st.sampled_from([1.0, 8.0]))
    return b, h, h_kv, d, lens, order, sharpness, draw(st.integers(0, 2**16))


def make_batch(case, dtype):
    """A paged cache holding the case's sequences; returns kernel inputs and the oracle's output."""
    b, h, h_kv, d, lens, order, sharpness, seed = case
    g = torch.Generator().manual_seed(seed)
    n_blocks = len(order)
    key_cache = torch.full((n_blocks, b, h_kv, d), float("nan"), dtype=dtype)
    value_cache = torch.full((n_blocks, b, h_kv, d), float("nan"), dtype=dtype)
    m = max(-(-n // b) for n in lens) + 1  # a spare column of -1: never read
    tables = torch.full((len(lens), m), -1, dtype=torch.int32)
    free = list(order)
    oracle_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    query = torch.randn(len(lens), h, d, generator=g).to(dtype)
    scale = sharpness * d**-0.5
    expected = []
    for s, n in enumerate(lens):
        k = torch.randn(n, h_kv, d, generator=g).to(dtype)
        v = torch.randn(n, h_kv, d, generator=g).to(dtype)
        for j in range(-(-n // b)):
            block = free.pop(0)
            tables[s, j] = block
            rows = slice(j * b, min(n, (j + 1) * b))
            key_cache[block, : rows.stop - rows.start] = k[rows]
            value_cache[block, : rows.stop - rows.start] = v[rows]
        q = query[s : s + 1].to(oracle_dtype)
        expected.append(contiguous_attention(q, k.to(oracle_dtype), v.to(oracle_dtype), scale))
    context_lens = torch.tensor(lens, dtype=torch.int32)
    return (query, key_cache, value_cache, tables, context_lens, scale), torch.cat(expected)


def check(out, expected, dtype):
    assert out.dtype == dtype and out.shape == expected.shape
    assert not out.isnan().any()
    torch.testing.assert_close(out.to(expected.dtype), expected, **TOLERANCE[dtype])


def _cpu_has_avx2() -> bool:
    """What ``-march=native`` will see: the CPU's own feature flags, AVX2 and FMA (the AVX2 kernels'
    exp is built of fused multiply-adds; every AVX2 x86-64 CPU has both)."""
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " avx2" in line and " fma" in line for line in f)


def _cpu_has_avx512f() -> bool:
    """What ``-march=native`` will see: the CPU's own feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return torch.backends.cpu.get_cpu_capability() == "AVX512"


AVX512_DTYPES = [torch.float32, torch.bfloat16]
avx512_dims = st.sampled_from([16, 32, 64, 80, 96, 128])
needs_avx512 = pytest.mark.skipif(not _cpu_has_avx512f(), reason="this CPU has no AVX-512")


def test_cpu_kernel_avx512_compiled_where_the_cpu_has_it(ext):
    """The fast path is not silently missing on the machines it is meant for."""
    assert ext.avx512_compiled() == _cpu_has_avx512f()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@given(case=decode_cases())
def test_cpu_kernel_scalar_equals_contiguous_toleranced(ext, dtype, case):
    """scalar vs the oracle: reordered sums, so toleranced (float64 tight)."""
    args, expected = make_batch(case, dtype)
    check(ext.decode(*args, None, "scalar"), expected, dtype)


@needs_avx512
@pytest.mark.parametrize("dtype", AVX512_DTYPES, ids=str)
@given(case=decode_cases(dims=avx512_dims))
def test_cpu_kernel_avx512_equals_contiguous_toleranced(ext, dtype, case):
    """avx512 vs the oracle: reordered sums and a polynomial exp, toleranced."""
    args, expected = make_batch(case, dtype)
    check(ext.decode(*args, None, "avx512"), expected, dtype)


@needs_avx512
@pytest.mark.parametrize("dtype", AVX512_DTYPES, ids=str)
@given(case=decode_cases(dims=avx512_dims), partition_blocks=st.integers(1, 3))
def test_cpu_kernel_avx512_split_context_equals_contiguous_toleranced(ext, dtype, case, partition_blocks):
    """avx512 with each sequence split into partitions of 1-3 blocks, merged by their maxima and sums."""
    args, expected = make_batch(case, dtype)
    check(ext.decode(*args, None, "avx512", partition_blocks), expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@settings(max_examples=15)
@given(case=decode_cases())
def test_cpu_kernel_dispatch_equals_contiguous_toleranced(ext, dtype, case):
    """The public entry point (whichever implementation it picks) vs the oracle, into ``out=``."""
    args, expected = make_batch(case, dtype)
    out = torch.empty_like(args[0])
    assert cpu.paged_attention_decode(*args, out=out) is out
    check(out, expected, dtype)


@pytest.mark.parametrize("dtype", AVX512_DTYPES, ids=str)
@pytest.mark.parametrize("impl", ["scalar", "avx2", "avx512"])
def test_cpu_kernel_strided_query_from_fused_qkv(ext, impl, dtype):
    """A query sliced out of a fused QKV projection (row stride != H * D) is read in place."""
    if impl == "avx512" and not _cpu_has_avx512f():
        pytest.skip("this CPU has no AVX-512")
    if impl == "avx2" and not ext.avx2_compiled():
        pytest.skip("this CPU has no AVX2")
    case = (16, 8, 2, 64, [1, 15, 16, 17, 40], list(range(9))[::-1], 1.0, 3)
    args, expected = make_batch(case, dtype)
    query = args[0]
    fused = torch.zeros(query.shape[0], query.shape[1] + 4, query.shape[2], dtype=dtype)  # [S, H + 2 H_kv, D]
    fused[:, : query.shape[1]] = query
    strided = fused[:, : query.shape[1]]
    assert not strided.is_contiguous()
    check(ext.decode(strided, *args[1:], None, impl), expected, dtype)


@needs_avx512
def test_avx512_decode_takes_a_second_thread_only_from_a_million_multiply_adds(ext):
    """Bitwise, at SmolLM2's shapes (9 / 3 heads, D = 64, B = 16; float32, whose outputs show a
    reordered sum where bfloat16's rounding mostly hides it), torch on two threads.

    Below the attention kernels' bound (a million multiply-adds: keys x query heads x D) a call runs
    on one thread, where waking a second costs more than it saves; from it, on torch's threads. Seen
    through the automatic split (``partition_blocks=-1``), which cuts a sequence into partitions only
    for a second thread: a sequence of 600 keys (0.35 M) is not split, so its bits are the
    whole-sequence call's; one of 8 192 keys (4.7 M) is, so its bits differ (within the float32
    tolerance). And a whole-sequence call (0) gives the same bits on one thread and on two."""
    heads, kv_heads, d, b = 9, 3, 64, 16
    torch.manual_seed(0)
    before = torch.get_num_threads()
    try:
        for keys, splits in ((600, False), (8192, True)):
            blocks = -(-keys // b)
            key_cache = torch.randn(blocks, b, kv_heads, d)
            value_cache = torch.randn(blocks, b, kv_heads, d)
            query = torch.randn(1, heads, d) * 4
            tables = torch.randperm(blocks, dtype=torch.int32)[None]
            lens = torch.tensor([keys], dtype=torch.int32)
            args = (query, key_cache, value_cache, tables, lens, 0.125, None, "avx512")
            torch.set_num_threads(1)
            whole = ext.decode(*args, 0)
            torch.set_num_threads(2)
            assert torch.equal(ext.decode(*args, 0), whole), keys
            auto = ext.decode(*args, -1)
            assert torch.equal(auto, whole) != splits, keys
            check(auto, whole, torch.float32)
    finally:
        torch.set_num_threads(before)


def _errors_case():
    case = (4, 4, 2, 16, [3, 9], list(range(5)), 1.0, 0)
    args, _ = make_batch(case, torch.float32)
    return args


def _swap(args, i, value):
    args = list(args)
    args[i] = value
    return args


ERRORS = {
    "float16-query": (lambda a: _swap(a, 0, a[0].half()), TypeError, "query must be float32, bfloat16 or float64"),
    "cache-dtype-differs": (lambda a: _swap(a, 1, a[1].double()), TypeError, "key_cache must have dtype"),
    "int64-block-tables": (lambda a: _swap(a, 3, a[3].long()), TypeError, "block_tables must be int32"),
    "int64-context-lens": (lambda a: _swap(a, 4, a[4].long()), TypeError, "context_lens must be int32"),
    "query-2d": (lambda a: _swap(a, 0, a[0][0]), ValueError, r"query must be \[S, H, D\]"),
    "cache-3d": (lambda a: _swap(a, 1, a[1][0]), ValueError, r"key_cache must be \[N, B, H_kv, D\]"),
    "cache-not-contiguous": (lambda a: _swap(a, 2, a[2].transpose(0, 1).contiguous().transpose(0, 1)),
                             ValueError, "value_cache must be contiguous"),
    "head-dim-differs": (lambda a: _swap(a, 0, a[0][..., :8].contiguous()), ValueError, "head dim of key_cache"),
    "heads-not-multiple": (lambda a: _swap(a, 0, a[0][:, :3].contiguous()), ValueError,
                           "must be a multiple of the cache's KV heads"),
    "tables-rows": (lambda a: _swap(a, 3, a[3][:1]), ValueError, r"block_tables must be \[S, M\]"),
    "context-zero": (lambda a: _swap(a, 4, torch.tensor([0, 9], dtype=torch.int32)), ValueError,
                     r"context_lens\[0\] = 0 must be in \[1, M \* B\]"),
    "context-past-table": (lambda a: _swap(a, 4, torch.tensor([3, 17], dtype=torch.int32)), ValueError,
                           r"context_lens\[1\] = 17 must be in \[1, M \* B\] = \[1, 16\]"),
    "block-out-of-range": (lambda a: _swap(a, 3, a[3].masked_fill(a[3] == a[3][1, 2], 5)), ValueError,
                           r"block_tables\[1, 2\] = 5 is not a physical block"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_cpu_kernel_rejects_bad_input_with_a_specific_error(ext, name):
    mutate, error, message = ERRORS[name]
    with pytest.raises(error, match=message):
        cpu.paged_attention_decode(*mutate(_errors_case()))


def test_cpu_kernel_rejects_bad_out(ext):
    args = _errors_case()
    with pytest.raises(ValueError, match="out must have the query's shape"):
        cpu.paged_attention_decode(*args, out=torch.empty(2, 4, 8))
    with pytest.raises(TypeError, match="out must have dtype"):
        cpu.paged_attention_decode(*args, out=torch.empty(2, 4, 16, dtype=torch.float64))


@given(
    n_blocks=st.integers(1, 6),
    b=block_sizes,
    heads=gqa_heads(),
    d=head_dims,
    data=st.data(),
)
def test_cpu_write_kv_equals_indexing_bitwise(ext, n_blocks, b, heads, d, data):
    """``write_kv`` is a copy, so it equals advanced indexing bit for bit; slots < 0 are skipped."""
    _, h_kv = heads
    n_slots = n_blocks * b
    slots = data.draw(st.lists(st.integers(-1, n_slots - 1), max_size=n_slots, unique=True))
    t = len(slots)
    g = torch.Generator().manual_seed(t)
    key_cache = torch.randn(n_blocks, b, h_kv, d, generator=g)
    value_cache = torch.randn(n_blocks, b, h_kv, d, generator=g)
    fused = torch.randn(t, 2 * h_kv + 1, d, generator=g)  # k and v as strided views
    k, v = fused[:, :h_kv], fused[:, h_kv : 2 * h_kv]
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    want_k, want_v = key_cache.clone(), value_cache.clone()
    keep = slot_mapping >= 0
    want_k.view(-1, h_kv, d)[slot_mapping[keep]] = k[keep]
    want_v.view(-1, h_kv, d)[slot_mapping[keep]] = v[keep]
    cpu.write_kv(key_cache, value_cache, k, v, slot_mapping)
    assert torch.equal(key_cache, want_k) and torch.equal(value_cache, want_v)


def test_cpu_write_kv_rejects_bad_input(ext):
    kc, vc = torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8)
    k = torch.ones(3, 2, 8)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 8 is past the cache's last slot"):
        cpu.write_kv(kc, vc, k, k, torch.tensor([0, 8, 1]))
    with pytest.raises(TypeError, match="slot_mapping must be int64"):
        cpu.write_kv(kc, vc, k, k, torch.tensor([0, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"k must be \[T, H_kv, D\]"):
        cpu.write_kv(kc, vc, torch.ones(3, 1, 8), torch.ones(3, 1, 8), torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="key_cache must have dtype"):
        cpu.write_kv(kc, vc, k.double(), k.double(), torch.tensor([0, 1, 2]))


def test_cpu_load_failure_warns_once_and_falls_back(monkeypatch):
    """A failed build warns once, returns None, and attention falls back to the reference path."""
    def broken(verbose):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(cpu, "_build", broken)
    monkeypatch.setattr(cpu, "_module", None)
    monkeypatch.setattr(cpu, "_error", None)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert cpu.load() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu.load() is None and not cpu.available()
        args, expected = make_batch((4, 4, 2, 16, [3, 9], list(range(5)), 1.0, 0), torch.float64)
        torch.testing.assert_close(cpu.paged_attention_decode(*args), expected, **tolerances.FLOAT64)
    with pytest.raises(RuntimeError, match="no compiler here"):
        cpu.load(strict=True)
