"""Block-wise paged attention with an online softmax: the paper's equation (§4.1).

The paper writes attention over the KV blocks of a sequence,
\\(K_j = (k_{(j-1)B+1}, \\dots, k_{jB})\\) and \\(V_j\\) likewise:

    A_ij = exp(q_i K_j^T / sqrt(d)) / sum_t exp(q_i K_t^T 1 / sqrt(d))
    o_i  = sum_j V_j A_ij^T

Computed literally this needs the denominator before any block is finished.
The online softmax gets the same result in one pass over the blocks: keep a
running maximum ``m``, a running sum ``l`` of ``exp(score - m)`` and an
unnormalised output ``acc``; when a block raises the maximum, rescale what was
accumulated by ``exp(m_old - m_new)``. At the end ``o = acc / l``. This is the
loop every kernel (``csrc/cpu``, ``csrc/cuda``) runs, written readably. It is
slow on purpose: one Python iteration per block.

A sliding window starts the loop at the block holding the first query's
window start and masks the keys a query's window has left behind; a soft-cap
bends each score before the mask. Same arguments and result as
``reference.reference_attention``; equal to it up to the reordering of the
sums (tests: toleranced, float64 for tight bounds).
"""

from __future__ import annotations

import torch

from paged.kernels.contiguous import check_window_and_softcap
from paged.step03_attention.reference import _lens


# --8<-- [start:update]
def online_softmax_update(m, l, acc, s, v):
    """Fold one block into the running state: the three updates of the online softmax.

    ``s [..., n]`` are the block's scores, ``v [n, H_kv, D]`` its values; ``m``, ``l``
    and ``acc`` are the running maximum, sum of exponentials and unnormalised
    output. Returns the new ``(m, l, acc)``.
    """
    m_new = torch.maximum(m, s.amax(dim=-1))  # m' = max(m, max s)
    # a row whose keys are all masked so far (scores -inf) keeps m = -inf: use 0 in the exps
    m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p = torch.exp(s - m_safe[..., None])  # e^(s - m')
    correction = torch.exp(m - m_safe)  # e^(m - m'): rescales what came before
    l = l * correction + p.sum(dim=-1)  # l' = l e^(m - m') + sum e^(s - m')
    acc = acc * correction[..., None] + torch.einsum("qhgn,nhd->qhgd", p, v)  # a' = a e^(m - m') + V^T e^(s - m')
    return m_new, l, acc
# --8<-- [end:update]


# --8<-- [start:blockwise]
def _one_sequence(q, key_cache, value_cache, blocks, context_len, scale, window=None, softcap=None):
    """q [T_q, H, D] for the last T_q of ``context_len`` positions -> [T_q, H, D]."""
    t_q, h, d = q.shape
    block_size, h_kv = key_cache.shape[1], key_cache.shape[2]
    group = h // h_kv
    qg = q.float() if q.dtype in (torch.float16, torch.bfloat16) else q
    qg = qg.reshape(t_q, h_kv, group, d)  # [T_q, H_kv, G, D]
    pos_q = torch.arange(context_len - t_q, context_len)  # [T_q]
    m = torch.full((t_q, h_kv, group), float("-inf"), dtype=qg.dtype)  # running max
    l = torch.zeros((t_q, h_kv, group), dtype=qg.dtype)  # running sum of exp
    acc = torch.zeros((t_q, h_kv, group, d), dtype=qg.dtype)  # unnormalised output
    # with a window, no query sees a key before the first query's window start p - W + 1
    first = 0 if window is None else max(0, context_len - t_q - window + 1)
    for j in range(first // block_size, -(-context_len // block_size)):  # logical block j
        phys = int(blocks[j])
        n = min(block_size, context_len - j * block_size)  # #filled of block j
        k = key_cache[phys, :n].to(qg.dtype)  # [n, H_kv, D]
        v = value_cache[phys, :n].to(qg.dtype)  # [n, H_kv, D]
        s = torch.einsum("qhgd,nhd->qhgn", qg, k) * scale  # [T_q, H_kv, G, n]
        if softcap is not None:  # Gemma 2: scores bent into (-softcap, softcap) before the mask
            s = torch.tanh(s / softcap) * softcap
        # causal mask: query at position p sees keys 0 .. p (only prompt rows, T_q > 1, have any masked),
        # with a window keys p - W + 1 .. p
        pos_k = torch.arange(j * block_size, j * block_size + n)
        hidden = pos_k[None, :] > pos_q[:, None]  # [T_q, n]
        if window is not None:
            hidden |= pos_k[None, :] <= pos_q[:, None] - window
        s = s.masked_fill(hidden[:, None, None, :], float("-inf"))
        m, l, acc = online_softmax_update(m, l, acc, s, v)
    return (acc / l[..., None]).reshape(t_q, h, d).to(q.dtype)
# --8<-- [end:blockwise]


def blockwise_attention(query, key_cache, value_cache, block_tables, context_lens, query_lens, scale,
                        window=None, softcap=None):
    """Paged attention block by block with an online softmax (see module doc)."""
    check_window_and_softcap(window, softcap)
    q_lens, ctx = _lens(query, context_lens, query_lens)
    out = torch.empty_like(query)
    start = 0
    for s, (q_len, c) in enumerate(zip(q_lens, ctx)):
        out[start : start + q_len] = _one_sequence(
            query[start : start + q_len], key_cache, value_cache, block_tables[s], c, scale, window, softcap
        )
        start += q_len
    return out
