"""Lab 03 with one mistake: no causal mask, so every query of a prompt sees the keys after it."""

import torch


def attend_one_sequence(q, key_cache, value_cache, blocks, context_len, scale, window=None, softcap=None):
    t_q, h, d = q.shape
    block_size, h_kv = key_cache.shape[1], key_cache.shape[2]
    qg = q.reshape(t_q, h_kv, h // h_kv, d)  # [T_q, H_kv, G, D]
    m = torch.full(qg.shape[:3], float("-inf"), dtype=q.dtype)
    l = torch.zeros(qg.shape[:3], dtype=q.dtype)
    acc = torch.zeros(qg.shape, dtype=q.dtype)
    for j in range(-(-context_len // block_size)):
        n = min(block_size, context_len - j * block_size)
        k, v = key_cache[int(blocks[j]), :n], value_cache[int(blocks[j]), :n]
        s = torch.einsum("qhgd,nhd->qhgn", qg, k) * scale  # the mistake: no mask of keys after the query
        m_new = torch.maximum(m, s.amax(dim=-1))
        p = torch.exp(s - m_new[..., None])
        correction = torch.exp(m - m_new)
        l = l * correction + p.sum(dim=-1)
        acc = acc * correction[..., None] + torch.einsum("qhgn,nhd->qhgd", p, v)
        m = m_new
    return (acc / l[..., None]).reshape(t_q, h, d)
