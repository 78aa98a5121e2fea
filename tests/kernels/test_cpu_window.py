"""The C++ CPU kernels (``csrc/cpu``) with a sliding window and soft-capped scores.

Cases are test_cpu_prefill's (a paged cache over a shuffled free list, NaN in
unused slots, -1 in unused table entries) with a window W drawn from the
edges (1, below the block size, multiples of the block size and one either
side, longer than every context) and a soft-cap (none; 2, where it bends the
scores of tens that sharpness 8 makes; 50, Gemma 2's). Each sequence's table
entries before the block holding its first query's window start are set to a
block id far past the cache (``FAR``) and those blocks to NaN: a kernel that
read one would crash, a binding that checked them would refuse them (they are
what a KV manager could free, docs/models.md).

Levels of equality:

* **bitwise** (``torch.equal``): every row of a windowed, soft-capped prefill
  equals the decode kernel run for that token alone with the same window and
  soft-cap (both implementations, any query tile); a prompt prefilled in
  chunks equals the prompt prefilled whole. The window's first block is fixed
  by the token's absolute position, so batch invariance holds.
* **toleranced** against ``causal_attention(q, k, v, scale, window, softcap)``
  over each sequence's contiguous K/V: ``FLOAT64`` in float64 (the same
  arithmetic reordered; ``std::tanh`` against ``torch.tanh``),
  ``CPU_ATTENTION_FLOAT32`` in float32 (the kernel's polynomial tanh is within
  2 ulp: a score error of ~cap * 1e-7, far inside it), ``CPU_BFLOAT16`` in
  bfloat16; decode (scalar, avx512, avx512 split into partitions) and prefill.
* bad windows and soft-caps get a specific error and write nothing.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.kernels import cpu
from paged.kernels.contiguous import causal_attention
from tests.kernels.test_cpu_kernel import _cpu_has_avx512f
from tests.kernels.test_cpu_prefill import DIMS, IMPL_DTYPES, IMPLS, TOLERANCE, make_prefill, prefill_cases
from tests.strategies import shuffled_free_list, softcaps, windows

FAR = 2**31 - 1  # a block id no cache has: reading block FAR faults, it is ~2^31 blocks past the cache


@pytest.fixture(scope="module")
def ext():
    """The compiled extension (built once; a failed build fails the tests)."""
    return cpu.load(strict=True)


@st.composite
def window_cases(draw, dims=DIMS["scalar"], max_seqs=3, max_blocks=5, decode=False):
    """(prefill case, window, softcap); ``decode``: one query per sequence, contexts >= 1."""
    b, h, h_kv, d, seqs, order, sharpness, seed = draw(prefill_cases(dims, max_seqs, max_blocks))
    if decode:
        seqs = [(max(ctx, 1), 1) for ctx, _ in seqs]
        order = draw(shuffled_free_list(sum(-(-c // b) for c, _ in seqs) + 2))
    window = draw(windows(b, max(c for c, _ in seqs)))
    return (b, h, h_kv, d, seqs, order, sharpness, seed), window, draw(softcaps)


def make_window(case, window, dtype):
    """make_prefill's inputs and K/V, with each sequence's blocks before its first query's window
    taken out: table entries FAR, cache blocks NaN."""
    args, kv = make_prefill(case, dtype)
    query, key_cache, value_cache, tables, context_lens, query_lens, scale = args
    block_size = key_cache.shape[1]
    for s, (ctx, q) in enumerate(zip(context_lens.tolist(), query_lens.tolist())):
        first = max(0, ctx - q - window + 1) // block_size  # the block holding the first query's window start
        for j in range(first):
            key_cache[tables[s, j]] = float("nan")
            value_cache[tables[s, j]] = float("nan")
            tables[s, j] = FAR
    return args, kv


def decode_alone(ext, args, impl, window, softcap):
    """Every query row through the decode kernel, one call per token (context = its position + 1,
    no partitions), with the same window and soft-cap."""
    query, key_cache, value_cache, tables, context_lens, query_lens, scale = args
    out, row = torch.empty_like(query), 0
    for s, (ctx, q_len) in enumerate(zip(context_lens.tolist(), query_lens.tolist())):
        for i in range(q_len):
            seen = torch.tensor([ctx - q_len + i + 1], dtype=torch.int32)
            out[row : row + 1] = ext.decode(query[row : row + 1], key_cache, value_cache, tables[s : s + 1], seen,
                                            scale, None, impl, 0, window, softcap)
            row += 1
    return out


def oracle(args, kv, window, softcap):
    """causal_attention over each sequence's contiguous K/V (float32 for bfloat16 inputs)."""
    query, scale, query_lens = args[0], args[6], args[5].tolist()
    dtype = torch.float32 if query.dtype == torch.bfloat16 else query.dtype
    outs, rows = [], 0
    for (k, v), q_len in zip(kv, query_lens):
        q = query[rows : rows + q_len].to(dtype)
        outs.append(causal_attention(q, k.to(dtype), v.to(dtype), scale, window, softcap))
        rows += q_len
    return torch.cat(outs)


@pytest.mark.parametrize("impl,dtype", IMPL_DTYPES, ids=str)
@given(data=st.data(), query_tile=st.sampled_from([1, 2, 5, 32]))
def test_window_prefill_rows_bitwise_equal_decode_of_each_token_alone(ext, impl, dtype, data, query_tile):
    """Bitwise: every row of a windowed, soft-capped prefill equals the decode kernel for that
    token alone, for any query tile."""
    case, window, softcap = data.draw(window_cases(DIMS[impl]), label="case")
    args, _ = make_window(case, window, dtype)
    got = ext.prefill(*args, None, impl, query_tile, window, softcap)
    assert torch.equal(got, decode_alone(ext, args, impl, window, softcap))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_window_prefill_in_chunks_bitwise_equal_whole_prompt(ext, impl, dtype, data):
    """Bitwise: a windowed, soft-capped prompt prefilled in chunks (any split points) equals the
    prompt prefilled whole."""
    case, window, softcap = data.draw(window_cases(DIMS[impl], max_seqs=1, max_blocks=6), label="case")
    b, h, h_kv, d, seqs, order, sharpness, seed = case
    ctx = seqs[0][0]
    args, _ = make_prefill((b, h, h_kv, d, [(ctx, ctx)], order, sharpness, seed), dtype)
    query, key_cache, value_cache, tables, context_lens, query_lens, scale = args
    whole = ext.prefill(*args, None, impl, 32, window, softcap)
    cuts = sorted(data.draw(st.lists(st.integers(0, ctx), max_size=4), label="cuts"))
    start = 0
    for stop in cuts + [ctx]:
        chunk = ext.prefill(query[start:stop], key_cache, value_cache, tables, torch.tensor([stop], dtype=torch.int32),
                            torch.tensor([stop - start], dtype=torch.int32), scale, None, impl, 32, window, softcap)
        assert torch.equal(chunk, whole[start:stop]), (start, stop)
        start = stop


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@settings(max_examples=40)
@given(data=st.data())
def test_window_prefill_equals_causal_attention_toleranced(ext, dtype, data):
    """The public prefill entry point vs ``causal_attention(..., window, softcap)``: FLOAT64 /
    CPU_ATTENTION_FLOAT32 / CPU_BFLOAT16 (see the module doc), into ``out=``."""
    case, window, softcap = data.draw(window_cases(), label="case")
    args, kv = make_window(case, window, dtype)
    out = torch.empty_like(args[0])
    assert cpu.paged_attention_prefill(*args, out=out, window=window, softcap=softcap) is out
    torch.testing.assert_close(out.to(torch.float32 if dtype == torch.bfloat16 else dtype),
                               oracle(args, kv, window, softcap), **TOLERANCE[dtype])
    assert not out.isnan().any()


DECODE_IMPLS = [("scalar", dtype, 0) for dtype in (torch.float64, torch.float32, torch.bfloat16)]
if _cpu_has_avx512f():  # partitions of 1 and 2 blocks: split-context over the window's blocks only
    DECODE_IMPLS += [("avx512", dtype, p) for dtype in (torch.float32, torch.bfloat16) for p in (0, 1, 2)]


@pytest.mark.parametrize("impl,dtype,partition_blocks", DECODE_IMPLS, ids=str)
@given(data=st.data())
def test_window_decode_equals_causal_attention_toleranced(ext, impl, dtype, partition_blocks, data):
    """The decode kernel (scalar; avx512 whole or split into partitions) vs ``causal_attention(...,
    window, softcap)``: FLOAT64 / CPU_ATTENTION_FLOAT32 / CPU_BFLOAT16."""
    case, window, softcap = data.draw(window_cases(DIMS[impl], max_seqs=4, decode=True), label="case")
    args, kv = make_window(case, window, dtype)
    query, key_cache, value_cache, tables, context_lens, _, scale = args
    got = ext.decode(query, key_cache, value_cache, tables, context_lens, scale, None, impl, partition_blocks,
                     window, softcap)
    torch.testing.assert_close(got.to(torch.float32 if dtype == torch.bfloat16 else dtype),
                               oracle(args, kv, window, softcap), **TOLERANCE[dtype])


@pytest.mark.parametrize("impl", IMPLS)
def test_window_smollm2_shapes_bitwise_equal_decode_on_one_or_two_threads(ext, impl):
    """Bitwise, at SmolLM2's attention shapes in bfloat16 (9 / 3 heads, D = 64, B = 16) with a window
    of 100 (mid-block) and a soft-cap of 50: a 300-token prompt, a 33-token tail over a cached prefix
    and a decode token in one call, one thread and two, equal the decode kernel token by token."""
    case = (16, 9, 3, 64, [(300, 300), (170, 33), (117, 1)], list(range(40))[::-1], 8.0, 5)
    args, _ = make_window(case, 100, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ext.prefill(*args, None, impl, 32, 100, 50.0)
        torch.set_num_threads(2)
        two = ext.prefill(*args, None, impl, 32, 100, 50.0)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert torch.equal(one, decode_alone(ext, args, impl, 100, 50.0))


def test_window_and_softcap_change_the_result(ext):
    """The control: the same inputs with no window, or no soft-cap, give other outputs (so the
    options reach the kernels), and a window longer than the context gives the unwindowed bits."""
    case = (16, 4, 2, 64, [(90, 90)], list(range(8)), 8.0, 1)
    args, _ = make_prefill(case, torch.float32)
    base = ext.prefill(*args, None, "auto", 32, None, None)
    assert not torch.equal(ext.prefill(*args, None, "auto", 32, 20, None), base)
    assert not torch.equal(ext.prefill(*args, None, "auto", 32, None, 2.0), base)
    assert torch.equal(ext.prefill(*args, None, "auto", 32, 90, None), base)


BAD_OPTIONS = {
    "window-0": (dict(window=0), "window must be >= 1"),
    "window-negative": (dict(window=-3), "window must be >= 1"),
    "softcap-0": (dict(softcap=0.0), "softcap must be a finite number > 0"),
    "softcap-negative": (dict(softcap=-1.0), "softcap must be a finite number > 0"),
    "softcap-inf": (dict(softcap=float("inf")), "softcap must be a finite number > 0"),
    "softcap-nan": (dict(softcap=float("nan")), "softcap must be a finite number > 0"),
}


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("name", list(BAD_OPTIONS))
def test_window_bad_options_get_a_specific_error_and_write_nothing(ext, kernel, name):
    options, message = BAD_OPTIONS[name]
    args, _ = make_prefill((4, 4, 2, 16, [(9, 1), (5, 1)], list(range(6)), 1.0, 0), torch.float32)
    out = torch.full(args[0].shape, 7.0)
    with pytest.raises(ValueError, match=message):
        if kernel == "decode":
            cpu.paged_attention_decode(*args[:5], args[6], out=out, **options)
        else:
            cpu.paged_attention_prefill(*args, out=out, **options)
    assert bool((out == 7).all())


def test_window_table_entries_before_the_window_are_not_checked_but_inside_are(ext):
    """A table entry before the block holding the first query's window start may hold anything (-1:
    a freed block); one inside the window must be a block of the cache."""
    args, kv = make_window((4, 4, 2, 16, [(20, 2)], list(range(7)), 1.0, 0), 6, torch.float64)
    tables = args[3]
    assert (tables[0, :3] == FAR).all() and tables[0, 3] < 7  # blocks 0-2 (positions 0-11) precede 13 .. 18
    tables[0, :3] = -1
    torch.testing.assert_close(cpu.paged_attention_prefill(*args, window=6), oracle(args, kv, 6, None),
                               **TOLERANCE[torch.float64])
    with pytest.raises(ValueError, match=r"block_tables\[0, 2\] = -1 is not a physical block"):
        cpu.paged_attention_prefill(*args, window=8)  # the first query's window now starts at position 11


def test_window_without_the_extension_falls_back_to_causal_attention(monkeypatch):
    """A failed build: the gathered path masks and caps too (bitwise ``causal_attention``, which it
    calls), and refuses bad options alike."""
    monkeypatch.setattr(cpu, "_build", lambda verbose: (_ for _ in ()).throw(RuntimeError("no compiler here")))
    monkeypatch.setattr(cpu, "_module", None)
    monkeypatch.setattr(cpu, "_error", None)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert cpu.load() is None
    args, kv = make_prefill((4, 4, 2, 16, [(19, 19), (11, 3)], list(range(10)), 8.0, 0), torch.float64)
    assert torch.equal(cpu.paged_attention_prefill(*args, window=5, softcap=2.0), oracle(args, kv, 5, 2.0))
    with pytest.raises(ValueError, match="window must be >= 1"):
        cpu.paged_attention_prefill(*args, window=0)
