"""The attention seam (``backends.attention_path``): what ``PagedAttention`` calls per layer.

``PagedAttention.__call__`` is the plain path (write the new K/V by slot, then
each sequence's queries over its blocks); the backend decides which kernel runs
and how batch-invariant mode is kept. Proven here, for every backend
(``reference``, ``blockwise``, ``cpu``, and ``emulated-cuda`` where it builds):

* toleranced (``FLOAT64``, float64: the same arithmetic reordered; ``FLOAT32``
  for the emulated CUDA kernels, which take float32) against the oracle, in
  both modes, on mixed batches of decode tokens, whole prompts and prompt
  tails over a cached prefix;
* bitwise (``torch.equal``), in batch-invariant mode: each token's output in
  the mixed batch equals the same token computed alone (a 1-token decode over
  its context) and in a chunk of its prompt. Control: without the mode the
  cpu backend's prompt rows (SDPA's kernel) differ from the decode kernel's;
  and its rows of a prompt over a cached prefix are the prefill kernel's
  (bitwise), not the reference path's.
* the default cpu path builds no per-token tables, and the quoted
  ``__call__`` has no mode branch.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from paged.step03_attention import AttentionMetadata, PagedAttention
from paged.step03_attention.backends import attention_path
from tests.oracle import contiguous_attention
from tests.step03_attention.test_attention_paths import SCALE, _paged_batch, batches
from tests.tolerances import CUDA_FLOAT32, FLOAT64

BACKENDS = ["reference", "blockwise", "cpu",
            pytest.param("emulated-cuda", marks=pytest.mark.emulated, id="emulated-cuda")]


def _batch(backend, batch, batch_invariant):
    """The batch of test_attention_paths (float64; float32 with head dim 32 and B in 8, 16,
    32 for the CUDA kernels), its metadata in the given mode."""
    b, h, h_kv, ctx, q_lens, order = batch
    if backend == "emulated-cuda":
        import tests.step03_attention.test_attention_paths as paths

        assume(b in (8, 16, 32))  # the block sizes csrc/cuda is compiled for
        d, paths.D = paths.D, 32  # the CUDA kernels take head dims from 32, in float32
        try:
            cache, meta, query, new_k, new_v, expected = _paged_batch(b, h, h_kv, ctx, q_lens, order, torch.float32)
        finally:
            paths.D = d
        scale = 32**-0.5
        expected = _oracle(cache, meta, query, scale)
    else:
        cache, meta, query, new_k, new_v, expected = _paged_batch(b, h, h_kv, ctx, q_lens, order)
        scale = SCALE
    return cache, dataclasses.replace(meta, batch_invariant=batch_invariant), query, new_k, new_v, expected, scale


def _oracle(cache, meta, query, scale):
    """contiguous_attention over each sequence's gathered K/V (the values written to the cache)."""
    out, start = [], 0
    for s, (q_len, c) in enumerate(zip(meta.query_lens, meta.context_lens_host)):
        blocks = meta.block_tables[s, : -(-c // cache.block_size)].long()
        k = cache.key(0)[blocks].flatten(0, 1)[:c]
        v = cache.value(0)[blocks].flatten(0, 1)[:c]
        out.append(contiguous_attention(query[start : start + q_len], k, v, scale))
        start += q_len
    return torch.cat(out)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["fastest", "batch-invariant"])
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20)
@given(batch=batches())
def test_paged_attention_equals_contiguous_in_both_modes_toleranced(backend, batch_invariant, batch):
    """Write + attend through PagedAttention, as the model calls it: FLOAT64 (CUDA_FLOAT32 for
    the emulated CUDA kernels, float32) against the oracle."""
    cache, meta, query, new_k, new_v, expected, scale = _batch(backend, batch, batch_invariant)
    out = PagedAttention(cache, meta, backend)(0, query, new_k, new_v, scale)
    torch.testing.assert_close(out, expected, **(CUDA_FLOAT32 if backend == "emulated-cuda" else FLOAT64))


def _alone_and_in_chunks(backend, cache, meta, query, scale, **options):
    """Each token attended alone (a 1-token decode over the context it sees), and each
    sequence's tokens in two chunks (its first half, then the rest over it); ``options``: the
    layer's ``window`` / ``softcap``."""
    attend = attention_path(backend, True)
    alone, chunked, start = torch.empty_like(query), torch.empty_like(query), 0
    for s, (q_len, c) in enumerate(zip(meta.query_lens, meta.context_lens_host)):
        table = [meta.block_tables[s].tolist()]
        for i in range(q_len):
            one = AttentionMetadata.build([0], table, [c - q_len + i + 1], [1], "cpu", batch_invariant=True)
            alone[start + i : start + i + 1] = attend(query[start + i : start + i + 1], cache.key(0), cache.value(0),
                                                      one, scale, **options)
        half = q_len // 2
        for lo, hi in [(0, half), (half, q_len)]:
            if hi > lo:
                part = AttentionMetadata.build([0] * (hi - lo), table, [c - q_len + hi], [hi - lo], "cpu",
                                               batch_invariant=True)
                chunked[start + lo : start + hi] = attend(query[start + lo : start + hi], cache.key(0), cache.value(0),
                                                          part, scale, **options)
        start += q_len
    return alone, chunked


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=20)
@given(batch=batches(), low_precision=st.booleans())
def test_batch_invariant_token_bitwise_equal_alone_and_in_chunks(backend, batch, low_precision):
    """Bitwise: in batch-invariant mode a token's output is the same whether it is computed in
    the mixed batch, alone as a 1-token decode, or in a chunk of its prompt (float64, and
    bfloat16 / float32 where the backend takes it: where reorderings do show)."""
    cache, meta, query, _, _, _, scale = _batch(backend, batch, True)
    if low_precision and backend != "emulated-cuda":
        cache.data, query = cache.data.to(torch.bfloat16), query.to(torch.bfloat16)
    batched = attention_path(backend, True)(query, cache.key(0), cache.value(0), meta, scale)
    alone, chunked = _alone_and_in_chunks(backend, cache, meta, query, scale)
    assert torch.equal(batched, alone)
    assert torch.equal(batched, chunked)


def test_without_batch_invariance_cpu_prompt_rows_differ_from_decode():
    """The control: with the mode off, the cpu backend attends a fresh prompt with SDPA's kernel,
    whose rows differ from the decode kernel's for the same tokens (float32), so the bitwise
    test above can fail."""
    batch = (16, 4, 2, [200], [200], list(range(14)))
    cache, meta, query, _, _, _, scale = _batch("cpu", batch, False)
    cache.data, query = cache.data.float(), query.float()
    fast = attention_path("cpu", False)(query, cache.key(0), cache.value(0), meta, scale)
    alone, _ = _alone_and_in_chunks("cpu", cache, meta, query, scale)
    assert not torch.equal(fast, alone)


def test_without_batch_invariance_cpu_prompt_over_a_cached_prefix_runs_the_prefill_kernel():
    """Bitwise: with the mode off, the cpu backend attends a prompt's tail over a cached prefix (a
    chunk of a long prompt) with the prefill kernel, not the reference path's gather: its rows are
    the kernel's (float32), and differ from the reference path's, so the check can tell them apart.
    (That they equal the oracle, toleranced, is the both-modes test above.)"""
    from paged.kernels import cpu

    batch = (16, 4, 2, [200], [60], list(range(14)))
    cache, meta, query, _, _, _, scale = _batch("cpu", batch, False)
    cache.data, query = cache.data.float(), query.float()
    fast = attention_path("cpu", False)(query, cache.key(0), cache.value(0), meta, scale)
    kernel = cpu.paged_attention_prefill(query, cache.key(0), cache.value(0), meta.block_tables, meta.context_lens,
                                         meta.query_lens_tensor, scale)
    gathered = attention_path("reference", False)(query, cache.key(0), cache.value(0), meta, scale)
    assert torch.equal(fast, kernel)
    assert not torch.equal(fast, gathered)


def test_cpu_batch_invariant_path_builds_no_per_token_tables():
    """The default CPU path (batch-invariant, the cpu backend) runs the prefill kernel over the
    sequences' own tables: no per-token table is ever built."""
    batch = (16, 4, 2, [40, 9], [40, 1], list(range(6)))
    cache, meta, query, new_k, new_v, expected, scale = _batch("cpu", batch, True)
    out = PagedAttention(cache, meta, "cpu")(0, query, new_k, new_v, scale)
    torch.testing.assert_close(out, expected, **FLOAT64)
    assert "per_token" not in vars(meta)  # the cached property was never computed


def test_paged_attention_quoted_code_has_no_mode_branch():
    """The code the step 03 page quotes is the plain path: no branch on the mode or the backend."""
    source = inspect.getsource(PagedAttention.__call__)
    for word in ("batch_invariant", "per_token", "token_tables", "if ", "backend"):
        assert word not in source, word
