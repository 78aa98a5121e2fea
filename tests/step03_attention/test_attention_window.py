"""Sliding windows and soft-capped scores through every attention path (``window`` / ``softcap``).

The batches of test_attention_paths (decode rows, whole prompts, prompt tails
over a cached prefix; float64; tables over a shuffled free list) with a window
drawn from the edges (1, below the block size, multiples of it and one either
side, longer than every context) and a soft-cap (none, 2, 50). The oracle is
``causal_attention(q, k, v, scale, window, softcap)`` over each sequence's
keys and values as written to the cache.

* ``reference``: bitwise (``torch.equal``): it gathers and calls the oracle.
* ``blockwise`` and ``PagedAttention`` on every backend, in both modes:
  toleranced (``FLOAT64``: the same float64 arithmetic reordered).
* batch-invariant mode: bitwise, a token's output in the mixed batch equals
  the token alone (a 1-token decode) and in a chunk of its prompt, windowed
  and soft-capped (float64 and bfloat16 / float32).
* the CUDA backends route a windowed or soft-capped layer to the reference
  path (bitwise the reference), warning once, and the other layers to their
  kernels; bad options get a specific error on every path.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paged.kernels.contiguous import causal_attention
from paged.step03_attention import PagedAttention, blockwise_attention, reference_attention
from paged.step03_attention import backends
from paged.step03_attention.backends import attention_path
from tests.step03_attention.test_attention_paths import SCALE, _paged_batch, batches
from tests.step03_attention.test_attention_seam import _alone_and_in_chunks
from tests.strategies import softcaps, windows
from tests.tolerances import FLOAT64

BACKENDS = ["reference", "blockwise", "cpu"]


@st.composite
def window_batches(draw):
    """(batch, window, softcap)."""
    batch = draw(batches())
    return batch, draw(windows(batch.block_size, max(batch.context_lens))), draw(softcaps)


def _setup(batch, batch_invariant=False):
    cache, meta, query, new_k, new_v, _ = _paged_batch(*batch)
    return cache, dataclasses.replace(meta, batch_invariant=batch_invariant), query, new_k, new_v


def _oracle(cache, meta, query, window, softcap):
    """causal_attention over each sequence's K/V read out of the cache by plain indexing."""
    out, start = [], 0
    for s, (q_len, c) in enumerate(zip(meta.query_lens, meta.context_lens_host)):
        blocks = meta.block_tables[s, : -(-c // cache.block_size)].long()
        k = cache.key(0)[blocks].flatten(0, 1)[:c]
        v = cache.value(0)[blocks].flatten(0, 1)[:c]
        out.append(causal_attention(query[start : start + q_len], k, v, SCALE, window, softcap))
        start += q_len
    return torch.cat(out)


@given(case=window_batches())
def test_window_reference_equals_causal_attention_bitwise(case):
    batch, window, softcap = case
    cache, meta, query, _, _ = _setup(batch)
    out = reference_attention(query, cache.key(0), cache.value(0), meta.block_tables, meta.context_lens,
                              meta.query_lens, SCALE, window, softcap)
    assert torch.equal(out, _oracle(cache, meta, query, window, softcap))


@given(case=window_batches())
def test_window_blockwise_equals_causal_attention_toleranced(case):
    """FLOAT64: the online softmax over the window's blocks only, the same float64 terms reordered."""
    batch, window, softcap = case
    cache, meta, query, _, _ = _setup(batch)
    out = blockwise_attention(query, cache.key(0), cache.value(0), meta.block_tables, meta.context_lens,
                              meta.query_lens, SCALE, window, softcap)
    torch.testing.assert_close(out, _oracle(cache, meta, query, window, softcap), **FLOAT64)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["fastest", "batch-invariant"])
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30)
@given(case=window_batches())
def test_window_paged_attention_equals_causal_attention_in_both_modes_toleranced(backend, batch_invariant, case):
    """Write + attend through PagedAttention with the layer's keywords, as a model calls it: FLOAT64."""
    batch, window, softcap = case
    cache, meta, query, new_k, new_v = _setup(batch, batch_invariant)
    out = PagedAttention(cache, meta, backend)(0, query, new_k, new_v, SCALE, window=window, softcap=softcap)
    torch.testing.assert_close(out, _oracle(cache, meta, query, window, softcap), **FLOAT64)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30)
@given(case=window_batches(), low_precision=st.booleans())
def test_window_batch_invariant_token_bitwise_equal_alone_and_in_chunks(backend, case, low_precision):
    """Bitwise: in batch-invariant mode a windowed, soft-capped token's output is the same in the
    mixed batch, alone as a 1-token decode and in a chunk of its prompt (float64; bfloat16)."""
    batch, window, softcap = case
    cache, meta, query, _, _ = _setup(batch, True)
    if low_precision:
        cache.data, query = cache.data.to(torch.bfloat16), query.to(torch.bfloat16)
    batched = attention_path(backend, True)(query, cache.key(0), cache.value(0), meta, SCALE, window, softcap)
    alone, chunked = _alone_and_in_chunks(backend, cache, meta, query, SCALE, window=window, softcap=softcap)
    assert torch.equal(batched, alone)
    assert torch.equal(batched, chunked)


class _FakeCudaKernels:
    """A native kernel module whose attention kernels record their calls and return zeros."""

    def __init__(self):
        self.calls = []

    def paged_attention_v1(self, q, *args):
        self.calls.append("v1")
        return torch.zeros_like(q)

    def paged_attention_decode(self, q, *args):
        self.calls.append("decode")
        return torch.zeros_like(q)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["fastest", "batch-invariant"])
def test_cuda_backends_route_windowed_and_softcapped_layers_to_the_reference_path(monkeypatch, batch_invariant):
    """Explicit routing: on ``cuda`` (and ``emulated-cuda``, the same code) a layer with a window or a
    soft-cap runs the reference path (bitwise its output), with one warning per process; a layer
    with neither reaches the CUDA kernel."""
    fake = _FakeCudaKernels()
    monkeypatch.setattr(backends, "_kernels", lambda name: fake)
    monkeypatch.setattr(backends, "_ROUTED", set())
    batch = (4, 4, 2, [9, 6], [1, 1], list(range(6)))
    cache, meta, query, _, _ = _setup(batch, batch_invariant)
    attend = attention_path("cuda", batch_invariant)
    reference = attention_path("reference", batch_invariant)
    args = (query, cache.key(0), cache.value(0), meta, SCALE)
    with pytest.warns(UserWarning, match="no sliding window or soft-capping yet"):
        assert torch.equal(attend(*args, 3, None), reference(*args, 3, None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert torch.equal(attend(*args, None, 2.0), reference(*args, None, 2.0))
        assert not fake.calls
        attend(*args)
    assert fake.calls == ["v1" if batch_invariant else "decode"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options, message", [
    (dict(window=0), "window must be >= 1"),
    (dict(softcap=-2.0), "softcap must be a finite number > 0"),
    (dict(softcap=float("nan")), "softcap must be a finite number > 0"),
], ids=["window-0", "softcap-negative", "softcap-nan"])
def test_window_bad_options_get_a_specific_error_on_every_path(backend, options, message):
    batch = (4, 4, 2, [9, 6], [9, 1], list(range(6)))
    cache, meta, query, new_k, new_v = _setup(batch)
    with pytest.raises(ValueError, match=message):
        PagedAttention(cache, meta, backend)(0, query, new_k, new_v, SCALE, **options)
