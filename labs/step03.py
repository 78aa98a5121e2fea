"""Lab 03 — PagedAttention, block by block, with an online softmax (paper §4.1).

Write ``attend_one_sequence``: one sequence's queries attend to its keys and values, which
sit in the blocks its block table names, one block at a time, never gathered into one tensor.
``make lab STEP=03`` runs step 03's block-wise attention tests with it in place of the
reference (``paged/step03_attention/blockwise.py``): the output must equal contiguous
attention (``torch.nn.functional.scaled_dot_product_attention``) up to the reordering of the
sums.

The online softmax keeps, per query row and head, a running maximum ``m``, a running sum ``l``
of ``exp(s - m)`` and an unnormalised output ``acc``; a block that raises the maximum rescales
what came before by ``exp(m_old - m_new)``; at the end the output is ``acc / l``.
``online_softmax_update`` below does those three updates for one block, if you want it.
"""

import torch  # noqa: F401

from paged.step03_attention.blockwise import online_softmax_update  # noqa: F401


def attend_one_sequence(q, key_cache, value_cache, blocks, context_len, scale):
    """Attention of one sequence's last ``T_q`` positions over its ``context_len`` tokens.

    Args:
        q: ``[T_q, H, D]``, the queries of positions ``context_len - T_q .. context_len - 1``.
        key_cache, value_cache: ``[N, B, H_kv, D]``, one layer's pool of blocks.
        blocks: the block table, ``blocks[j]`` = physical block of logical block ``j``.
        context_len: tokens of the sequence whose K/V are in the cache (the queries' own included).
        scale: multiply the scores ``q · k`` by it.

    Returns:
        ``[T_q, H, D]`` in ``q``'s dtype. Query head ``h`` reads KV head ``h // (H // H_kv)``;
        query at position ``p`` sees keys ``0 .. p`` (causal); logical block ``j`` holds
        ``min(B, context_len - j * B)`` tokens.
    """
    return torch.zeros_like(q)  # your code here
