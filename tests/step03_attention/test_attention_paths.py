"""Every attention path equals contiguous attention over the same keys and values.

Sequences write their K/V into a paged cache through real block tables over a
shuffled free list (so tables are non-monotone); each path then attends for a
mix of decode tokens, whole prompts and prompt chunks over a cached prefix.

* ``reference``: bitwise (``torch.equal``) — it gathers and then runs the
  oracle's own arithmetic, so any difference is a gather bug.
* ``blockwise``: toleranced (``FLOAT64``) — the online softmax sums in block
  order, a reordering of the same float64 arithmetic.
* ``PagedAttention`` with the ``cpu`` backend on a mixed batch: toleranced
  (``FLOAT64``), the C++ kernel and SDPA's causal path reorder the sums.
"""

from typing import NamedTuple

import pytest
import torch
from hypothesis import given, strategies as st

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table import BlockTable, KVCache
from paged.step03_attention import (
    AttentionMetadata,
    PagedAttention,
    blockwise_attention,
    reference_attention,
)
from tests.attention_rows import assert_rows_close
from tests.oracle import contiguous_attention
from tests.strategies import block_sizes, gqa_heads, seq_lens, shuffled_free_list
from tests.tolerances import FLOAT64

D = 16
SCALE = D**-0.5


class Batch(NamedTuple):
    """One drawn batch, printed whole in a failing example (a lab replays it from the printout)."""

    block_size: int
    heads: int
    kv_heads: int
    context_lens: list[int]  # keys each sequence's last query sees
    query_lens: list[int]  # rows per sequence: 1 = a decode row, more = prompt rows (causal)
    free_order: list[int]  # the allocator's shuffled free list


@st.composite
def batches(draw, max_seqs=4):
    """Block size, heads, and per sequence (context_len, query_len) with 1 <= q <= ctx."""
    b = draw(block_sizes)
    h, h_kv = draw(gqa_heads())
    n = draw(st.integers(1, max_seqs))
    ctx = [draw(seq_lens(b, max_blocks=4, min_len=1)) for _ in range(n)]
    q = [draw(st.sampled_from([1, c, max(1, c // 2)])) for c in ctx]
    total_blocks = sum(-(-c // b) for c in ctx) + 2
    order = draw(shuffled_free_list(total_blocks))
    return Batch(b, h, h_kv, ctx, q, order)


def _paged_batch(b, h, h_kv, ctx, q_lens, order, dtype=torch.float64):
    """Write every sequence's K/V through its block table; return inputs and the oracle's output."""
    g = torch.Generator().manual_seed(sum(ctx) * 7 + b)
    alloc = BlockAllocator(len(order), order)
    cache = KVCache(1, len(order), b, h_kv, D, dtype)
    tables, ks, vs, qs, slots = [], [], [], [], []
    for c in ctx:
        k = torch.randn(c, h_kv, D, dtype=dtype, generator=g)
        v = torch.randn(c, h_kv, D, dtype=dtype, generator=g)
        t = BlockTable(alloc, b)
        slot = t.append(c)
        cache.write(0, k, v, torch.tensor(slot))
        tables.append(t)
        ks.append(k), vs.append(v), slots.append(slot)
    for c, ql in zip(ctx, q_lens):
        qs.append(torch.randn(ql, h, D, dtype=dtype, generator=g))
    query = torch.cat(qs)
    expected = torch.cat([contiguous_attention(qq, k, v, SCALE) for qq, k, v in zip(qs, ks, vs)])
    meta = AttentionMetadata.build(
        [s for slot, ql in zip(slots, q_lens) for s in slot[-ql:]],
        [t.blocks for t in tables], ctx, q_lens, "cpu",
    )
    new_k = torch.cat([k[-ql:] for k, ql in zip(ks, q_lens)])
    new_v = torch.cat([v[-ql:] for v, ql in zip(vs, q_lens)])
    return cache, meta, query, new_k, new_v, expected


@given(batches())
def test_reference_equals_contiguous_bitwise(batch):
    cache, meta, query, _, _, expected = _paged_batch(*batch)
    out = reference_attention(query, cache.key(0), cache.value(0), meta.block_tables,
                              meta.context_lens, meta.query_lens, SCALE)
    assert torch.equal(out, expected)


@given(batches())
def test_blockwise_equals_contiguous_toleranced(batch):
    """The block-wise attention of every row (decode rows, whole prompts, prompt chunks over a cached
    prefix) equals contiguous attention over the same keys and values, within FLOAT64 (the online
    softmax sums the same float64 terms in another order)."""
    cache, meta, query, _, _, expected = _paged_batch(*batch)
    out = blockwise_attention(query, cache.key(0), cache.value(0), meta.block_tables,
                              meta.context_lens, meta.query_lens, SCALE)
    assert_rows_close(out, expected, batch.context_lens, batch.query_lens, **FLOAT64, what="block-wise attention")


@pytest.mark.parametrize("backend", ["reference", "blockwise", "cpu"])
@given(batch=batches())
def test_paged_attention_mixed_batch_equals_contiguous(backend, batch):
    """Write + attend in one call, as the model does, for a batch mixing decode rows and prompt rows:
    bitwise for reference, else within FLOAT64 row by row."""
    cache, meta, query, new_k, new_v, expected = _paged_batch(*batch)
    attn = PagedAttention(cache, meta, backend)
    out = attn(0, query, new_k, new_v, SCALE)
    if backend == "reference":
        assert torch.equal(out, expected)
    else:
        assert_rows_close(out, expected, batch.context_lens, batch.query_lens, **FLOAT64, what=f"the {backend} path's attention")


def test_reference_rejects_inconsistent_lengths():
    cache = KVCache(1, 4, 4, 1, D)
    q = torch.zeros(3, 1, D)
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="query_len"):
        reference_attention(q, cache.key(0), cache.value(0), table, torch.tensor([2]), [3], SCALE)
    with pytest.raises(ValueError, match="sum to"):
        reference_attention(q, cache.key(0), cache.value(0), table, torch.tensor([4]), [2], SCALE)
