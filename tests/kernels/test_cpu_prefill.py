"""The C++ CPU prefill kernel (``csrc/cpu``): each token's bits are the decode kernel's.

Each case writes sequences' K/V into a paged cache through block tables over a
shuffled free list (tables are non-monotone; unused slots hold NaN and unused
table entries -1, so reading past ``#filled`` or past a sequence's blocks
fails), then attends with many new query tokens per sequence, packed.

Levels of equality:

* **bitwise** (``torch.equal``) against the decode kernel run for each token
  alone (one sequence, context = its position + 1, never split into
  partitions), for every implementation (scalar, avx2, avx512), any query tile and
  thread count: the prefill kernel walks the KV blocks at absolute positions
  in the decode kernel's order and arithmetic. Hence also bitwise: a prompt
  prefilled in chunks, or its tail after a prefix-cache hit, equals the whole
  prompt.
* **toleranced** against the oracle (``tests/oracle.py``, contiguous SDPA over
  the same values): each row is the decode kernel's computation, reordered
  against SDPA's: ``FLOAT64`` in float64 (the same arithmetic reordered),
  ``CPU_ATTENTION_FLOAT32`` in float32 (sums over up to 160 keys),
  ``CPU_BFLOAT16`` in bfloat16 against the float32 oracle (float32
  accumulation, then one rounding of the output).

The control: the same K/V in blocks of half the size (KV tile boundaries
moved) gives other bits, so the bitwise tests would catch a kernel that put
its boundaries anywhere but at the decode kernel's. A build failure fails these
tests (``load(strict=True)``), it never skips them.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.kernels import cpu
from tests import tolerances
from tests.kernels.test_cpu_kernel import _cpu_has_avx2, _cpu_has_avx512f, _swap
from tests.oracle import contiguous_attention
from tests.strategies import block_sizes, gqa_heads, head_dims, model_head_dims, seq_lens, shuffled_free_list

TOLERANCE = {
    torch.float64: tolerances.FLOAT64,
    torch.float32: tolerances.CPU_ATTENTION_FLOAT32,
    torch.bfloat16: tolerances.CPU_BFLOAT16,
}
IMPLS = ["scalar"] + (["avx2"] if _cpu_has_avx2() else []) + (["avx512"] if _cpu_has_avx512f() else [])
AVX512_DIMS = [16, 32, 48, 64, 80, 96, 128]


@pytest.fixture(scope="module")
def ext():
    """The compiled extension (built once; a failed build fails the tests)."""
    return cpu.load(strict=True)


ANY_DIMS = st.one_of(head_dims, model_head_dims, st.sampled_from(AVX512_DIMS))
DIMS = {"scalar": ANY_DIMS, "avx2": st.sampled_from(AVX512_DIMS),
        "avx512": st.sampled_from(AVX512_DIMS)}  # avx2, avx512: multiples of 16


@st.composite
def prefill_cases(draw, dims=ANY_DIMS, max_seqs=3, max_blocks=5):
    """(B, H, H_kv, D, [(context_len, query_len)], free-list order, sharpness, seed): query
    lengths from 0 (nothing new) through 1 (a decode token) to the whole context."""
    b = draw(block_sizes)
    h, h_kv = draw(gqa_heads())
    d = draw(dims)
    seqs = []
    for _ in range(draw(st.integers(1, max_seqs))):
        ctx = draw(seq_lens(b, max_blocks=max_blocks, min_len=0))
        q = draw(st.sampled_from([0, 1, ctx, max(0, ctx - b), ctx // 2, max(0, ctx - 7)]))
        seqs.append((ctx, min(q, ctx)))
    order = draw(shuffled_free_list(sum(-(-c // b) for c, _ in seqs) + 2))
    # x8 makes scores of tens, so the running maximum jumps between blocks and
    # the rescaling of the accumulator matters.
    return b, h, h_kv, d, seqs, order, draw(st.sampled_from([1.0, 8.0])), draw(st.integers(0, 2**16))


def make_prefill(case, dtype):
    """A paged cache holding the case's sequences; returns the kernel's inputs and, per
    sequence, its contiguous K/V (for the oracle)."""
    b, h, h_kv, d, seqs, order, sharpness, seed = case
    g = torch.Generator().manual_seed(seed)
    key_cache = torch.full((len(order), b, h_kv, d), float("nan"), dtype=dtype)
    value_cache = torch.full((len(order), b, h_kv, d), float("nan"), dtype=dtype)
    m = max(-(-c // b) for c, _ in seqs) + 1  # a spare column of -1: never read
    tables = torch.full((len(seqs), m), -1, dtype=torch.int32)
    free, kv = list(order), []
    for s, (ctx, _) in enumerate(seqs):
        k = torch.randn(ctx, h_kv, d, generator=g).to(dtype)
        v = torch.randn(ctx, h_kv, d, generator=g).to(dtype)
        for j in range(-(-ctx // b)):
            block = free.pop(0)
            tables[s, j] = block
            rows = slice(j * b, min(ctx, (j + 1) * b))
            key_cache[block, : rows.stop - rows.start] = k[rows]
            value_cache[block, : rows.stop - rows.start] = v[rows]
        kv.append((k, v))
    query = torch.randn(sum(q for _, q in seqs), h, d, generator=g).to(dtype)
    context_lens = torch.tensor([c for c, _ in seqs], dtype=torch.int32)
    query_lens = torch.tensor([q for _, q in seqs], dtype=torch.int32)
    return (query, key_cache, value_cache, tables, context_lens, query_lens, sharpness * d**-0.5), kv


def decode_alone(ext, args, impl):
    """Every query row through the decode kernel, one call per token: the token's own sequence
    row of the table, context = its position + 1, no split into partitions."""
    query, key_cache, value_cache, tables, context_lens, query_lens, scale = args
    out, row = torch.empty_like(query), 0
    for s, (ctx, q_len) in enumerate(zip(context_lens.tolist(), query_lens.tolist())):
        for i in range(q_len):
            seen = torch.tensor([ctx - q_len + i + 1], dtype=torch.int32)
            out[row : row + 1] = ext.decode(query[row : row + 1], key_cache, value_cache, tables[s : s + 1], seen,
                                            scale, None, impl, 0)
            row += 1
    return out


# (implementation, dtype): avx2 and avx512 take float32 and bfloat16
IMPL_DTYPES = [(impl, dtype) for impl in IMPLS for dtype in (torch.float32, torch.bfloat16, torch.float64)
               if impl == "scalar" or dtype != torch.float64]


@pytest.mark.parametrize("impl,dtype", IMPL_DTYPES, ids=str)
@given(data=st.data(), query_tile=st.sampled_from([1, 2, 5, 32]))
def test_prefill_rows_bitwise_equal_decode_of_each_token_alone(ext, impl, dtype, data, query_tile):
    """Bitwise: every row of the packed prefill equals the decode kernel run for that token
    alone, for any query tile."""
    args, _ = make_prefill(data.draw(prefill_cases(DIMS[impl]), label="case"), dtype)
    got = ext.prefill(*args, None, impl, query_tile)
    assert torch.equal(got, decode_alone(ext, args, impl))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_prefill_in_chunks_bitwise_equal_whole_prompt(ext, impl, dtype, data):
    """Bitwise: a prompt prefilled in chunks (any split points, as chunked prefill or a
    prefix-cache hit followed by its tail would compute it) equals the prompt prefilled whole."""
    case = data.draw(prefill_cases(DIMS[impl], max_seqs=1, max_blocks=6), label="case")
    b, h, h_kv, d, seqs, order, sharpness, seed = case
    ctx = seqs[0][0]
    case = (b, h, h_kv, d, [(ctx, ctx)], order, sharpness, seed)
    args, _ = make_prefill(case, dtype)
    query, key_cache, value_cache, tables, context_lens, query_lens, scale = args
    whole = ext.prefill(*args, None, impl, 32)
    cuts = sorted(data.draw(st.lists(st.integers(0, ctx), max_size=4), label="cuts"))
    start = 0
    for stop in cuts + [ctx]:
        chunk = ext.prefill(query[start:stop], key_cache, value_cache, tables, torch.tensor([stop], dtype=torch.int32),
                            torch.tensor([stop - start], dtype=torch.int32), scale, None, impl, 32)
        assert torch.equal(chunk, whole[start:stop]), (start, stop)
        start = stop


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@settings(max_examples=25)
@given(case=prefill_cases())
def test_prefill_equals_contiguous_oracle_toleranced(ext, dtype, case):
    """The public entry point (whichever implementation it picks) vs the oracle over each
    sequence's contiguous K/V: FLOAT64 / CPU_ATTENTION_FLOAT32 / CPU_BFLOAT16 (see the module
    doc), into ``out=``."""
    args, kv = make_prefill(case, dtype)
    out = torch.empty_like(args[0])
    assert cpu.paged_attention_prefill(*args, out=out) is out
    oracle_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    rows = 0
    for (k, v), q_len in zip(kv, args[5].tolist()):
        if q_len:
            q = args[0][rows : rows + q_len].to(oracle_dtype)
            want = contiguous_attention(q, k.to(oracle_dtype), v.to(oracle_dtype), args[6])
            torch.testing.assert_close(out[rows : rows + q_len].to(oracle_dtype), want, **TOLERANCE[dtype])
        rows += q_len
    assert not out.isnan().any()


@pytest.mark.parametrize("impl", IMPLS)
def test_prefill_smollm2_shapes_bitwise_equal_decode_on_one_or_two_threads(ext, impl):
    """Bitwise, at SmolLM2's attention shapes (9 query heads, 3 KV heads, D = 64, B = 16,
    bfloat16): a 300-token prompt, a 33-token tail over a cached prefix and a decode token in
    one call, on one thread and on two, equal the decode kernel token by token."""
    case = (16, 9, 3, 64, [(300, 300), (70, 33), (17, 1)], list(range(30))[::-1], 8.0, 5)
    args, _ = make_prefill(case, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ext.prefill(*args, None, impl, 32)
        torch.set_num_threads(2)
        two = ext.prefill(*args, None, impl, 32)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert torch.equal(one, decode_alone(ext, args, impl))


@pytest.mark.parametrize("impl", IMPLS)
def test_prefill_moved_tile_boundary_changes_the_bits(ext, impl):
    """The control: the same sequence in blocks of 8 instead of 16 (every other KV tile
    boundary moved) gives other bits in float32, so the bitwise tests above would catch a
    kernel whose boundaries sat anywhere but at the decode kernel's. (In bfloat16 the one
    rounding of the output hides most such differences: the float32 cases are the sharp ones.)"""
    n, h, h_kv, d = 200, 4, 2, 64
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(n, h_kv, d, generator=g), torch.randn(n, h_kv, d, generator=g)
    q = torch.randn(n, h, d, generator=g)
    outs = []
    for b in (16, 8):
        blocks = -(-n // b)
        kc = torch.zeros(blocks, b, h_kv, d)
        vc = torch.zeros(blocks, b, h_kv, d)
        kc.view(-1, h_kv, d)[:n], vc.view(-1, h_kv, d)[:n] = k, v
        table = torch.arange(blocks, dtype=torch.int32)[None]
        lens = torch.tensor([n], dtype=torch.int32)
        outs.append(ext.prefill(q, kc, vc, table, lens, lens, 8 * d**-0.5, None, impl, 32))
    assert not torch.equal(outs[0], outs[1])


def _errors_case():
    args, _ = make_prefill((4, 4, 2, 16, [(3, 3), (9, 4)], list(range(5)), 1.0, 0), torch.float32)
    return args


ERRORS = {
    "float16-query": (lambda a: _swap(a, 0, a[0].half()), TypeError, "query must be float32, bfloat16 or float64"),
    "cache-dtype-differs": (lambda a: _swap(a, 1, a[1].double()), TypeError, "key_cache must have dtype"),
    "int64-query-lens": (lambda a: _swap(a, 5, a[5].long()), TypeError, "query_lens must be int32"),
    "int64-context-lens": (lambda a: _swap(a, 4, a[4].long()), TypeError, "context_lens must be int32"),
    "query-2d": (lambda a: _swap(a, 0, a[0][0]), ValueError, r"query must be \[T, H, D\]"),
    "context-lens-2d": (lambda a: _swap(a, 4, a[4][None]), ValueError, r"context_lens must be \[S\]"),
    "query-lens-shape": (lambda a: _swap(a, 5, a[5][:1]), ValueError, r"query_lens must be \[S\] with S = 2"),
    "tables-rows": (lambda a: _swap(a, 3, a[3][:1]), ValueError, r"block_tables must be \[S, M\]"),
    "query-past-context": (lambda a: _swap(a, 5, torch.tensor([4, 3], dtype=torch.int32)), ValueError,
                           r"query_lens\[0\] = 4 must be in \[0, context_lens\[0\]\] = \[0, 3\]"),
    "negative-query": (lambda a: _swap(a, 5, torch.tensor([-1, 8], dtype=torch.int32)), ValueError,
                       r"query_lens\[0\] = -1 must be in"),
    "rows-differ": (lambda a: _swap(a, 5, torch.tensor([2, 4], dtype=torch.int32)), ValueError,
                    "query_lens sum to 6 but query has 7 token rows"),
    "context-past-table": (lambda a: _swap(a, 4, torch.tensor([3, 17], dtype=torch.int32)), ValueError,
                           r"context_lens\[1\] = 17 must be in \[0, M \* B\] = \[0, 16\]"),
    "block-out-of-range": (lambda a: _swap(a, 3, a[3].masked_fill(a[3] == a[3][1, 2], 5)), ValueError,
                           r"block_tables\[1, 2\] = 5 is not a physical block"),
    "heads-not-multiple": (lambda a: _swap(a, 0, a[0][:, :3].contiguous()), ValueError,
                           "must be a multiple of the cache's KV heads"),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_prefill_rejects_bad_input_with_a_specific_error_and_writes_nothing(ext, name):
    mutate, error, message = ERRORS[name]
    args = mutate(_errors_case())
    out = torch.full(args[0].shape, 7.0, dtype=args[0].dtype) if args[0].dim() == 3 else None
    with pytest.raises(error, match=message):
        cpu.paged_attention_prefill(*args, out=out)
    assert out is None or bool((out == 7).all())


def test_prefill_rejects_bad_out_tile_and_impl(ext):
    args = _errors_case()
    with pytest.raises(ValueError, match="out must have the query's shape"):
        cpu.paged_attention_prefill(*args, out=torch.empty(2, 4, 16))
    with pytest.raises(TypeError, match="out must have dtype"):
        cpu.paged_attention_prefill(*args, out=torch.empty(7, 4, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="query_tile must be >= 1, got 0"):
        cpu.paged_attention_prefill(*args, query_tile=0)
    with pytest.raises(ValueError, match="impl must be 'auto', 'scalar', 'avx2' or 'avx512'"):
        ext.prefill(*args, None, "fast", 32)


def test_prefill_without_the_extension_falls_back_to_the_gathered_path(monkeypatch):
    """A failed build: the gathered reference path (FLOAT64 against the oracle), with errors
    for bad lengths."""
    monkeypatch.setattr(cpu, "_build", lambda verbose: (_ for _ in ()).throw(RuntimeError("no compiler here")))
    monkeypatch.setattr(cpu, "_module", None)
    monkeypatch.setattr(cpu, "_error", None)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert cpu.load() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args, kv = make_prefill((4, 4, 2, 16, [(9, 9), (11, 3), (5, 0)], list(range(8)), 1.0, 0), torch.float64)
        got = cpu.paged_attention_prefill(*args)
        want = torch.cat([contiguous_attention(args[0][:9], *kv[0], args[6]),
                          contiguous_attention(args[0][9:], *kv[1], args[6])])
        torch.testing.assert_close(got, want, **tolerances.FLOAT64)
        with pytest.raises(ValueError, match=r"needs 0 <= query_lens \(4\) <= context_lens \(3\)"):
            cpu.paged_attention_prefill(*_swap(args, 5, torch.tensor([4, 8, 0], dtype=torch.int32))[:4],
                                        torch.tensor([3, 11, 5], dtype=torch.int32),
                                        torch.tensor([4, 8, 0], dtype=torch.int32), args[6])
