"""Reference paged attention: gather through the block table, then SDPA (paper §4.1).

This is the executable specification of PagedAttention. For each sequence it
copies the sequence's blocks out of the paged cache into one contiguous tensor
(``KVCache.gather`` does the same thing for one layer) and runs ordinary
``scaled_dot_product_attention`` over it. Because the arithmetic after the
gather is exactly that of contiguous attention, the result is bitwise equal to
contiguous attention over the same keys and values; the tests prove it with
``torch.equal``.

Every attention path of step03 takes the same arguments:

    query         [T, H, D]       new tokens of all sequences, packed in order
    key_cache     [N, B, H_kv, D] one layer's keys (``KVCache.key(layer)``)
    value_cache   [N, B, H_kv, D]
    block_tables  [S, M] int32    row s: physical blocks of sequence s (padded)
    context_lens  [S] int32       tokens of sequence s in the cache, new ones included
    query_lens    [S] or None     new tokens of sequence s (None: one each, decode)
    scale         float
    window        int or None     sliding window W (keyword; None: none)
    softcap       float or None   score soft-cap (keyword; None: none)

Query ``i`` of sequence ``s`` sits at position ``context_lens[s] - query_lens[s] + i``
and attends causally to every cached token up to that position. This covers
decode (one new token), prefill (all tokens new) and prefill over a cached
prefix (step04's shared prefixes, step05's recomputation) with one rule. A
window W keeps the query at position p to keys ``p - W + 1 .. p``; a soft-cap
turns each score s into ``softcap * tanh(s / softcap)`` before the softmax
(``causal_attention`` defines both).
"""

from __future__ import annotations

import torch

from paged.models.contiguous import causal_attention


def _lens(query: torch.Tensor, context_lens: torch.Tensor, query_lens) -> tuple[list[int], list[int]]:
    ctx = context_lens.tolist()
    q_lens = [1] * len(ctx) if query_lens is None else [int(x) for x in query_lens]
    if len(q_lens) != len(ctx):
        raise ValueError(f"query_lens has {len(q_lens)} entries, context_lens {len(ctx)}")
    if sum(q_lens) != query.shape[0]:
        raise ValueError(f"query has {query.shape[0]} tokens but query_lens sum to {sum(q_lens)}")
    for s, (q, c) in enumerate(zip(q_lens, ctx)):
        if not 1 <= q <= c:
            raise ValueError(f"sequence {s}: needs 1 <= query_len ({q}) <= context_len ({c})")
    return q_lens, ctx


# --8<-- [start:gather]
def gather_blocks(
    cache: torch.Tensor,  # [N, B, H_kv, D]
    blocks: torch.Tensor,  # [M] int, physical block of each logical block
    num_tokens: int,
) -> torch.Tensor:  # [num_tokens, H_kv, D]
    """Copy one sequence's tokens out of the paged cache, oldest first."""
    block_size = cache.shape[1]
    num_blocks = -(-num_tokens // block_size)  # ceil
    picked = cache.index_select(0, blocks[:num_blocks].long())  # [n, B, H_kv, D]
    return picked.flatten(0, 1)[:num_tokens]
# --8<-- [end:gather]


# The contiguous causal attention every path is measured against lives with the
# models (``paged.models.contiguous``), which step03 builds on; the name here is
# the one the attention paths use.
causal_sdpa = causal_attention


# --8<-- [start:reference]
def reference_attention(query, key_cache, value_cache, block_tables, context_lens, query_lens, scale,
                        window=None, softcap=None):
    """Paged attention by gathering each sequence into a contiguous tensor (see module doc)."""
    q_lens, ctx = _lens(query, context_lens, query_lens)
    out = torch.empty_like(query)
    start = 0
    for s, (q_len, c) in enumerate(zip(q_lens, ctx)):
        k = gather_blocks(key_cache, block_tables[s], c)  # [c, H_kv, D]
        v = gather_blocks(value_cache, block_tables[s], c)
        out[start : start + q_len] = causal_sdpa(query[start : start + q_len], k, v, scale, window, softcap)
        start += q_len
    return out
# --8<-- [end:reference]
