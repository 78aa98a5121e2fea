"""The one oracle (STYLE §3): plain contiguous attention over one sequence.

Every equivalence test, at every step, compares a paged result with this
function applied to the contiguous keys and values of the same sequence.
It works in any dtype (float64 for tight bounds).
"""

import torch
import torch.nn.functional as F


def contiguous_attention(
    q: torch.Tensor,  # [T_q, H, D]   the new tokens' queries
    k: torch.Tensor,  # [T_k, H_kv, D] every key of the sequence, oldest first
    v: torch.Tensor,  # [T_k, H_kv, D]
    scale: float,
) -> torch.Tensor:  # [T_q, H, D]
    """Causal attention of the last ``T_q`` positions of a ``T_k``-token sequence.

    Query ``i`` sits at position ``T_k - T_q + i`` and sees keys ``0 ..`` that
    position. Grouped-query attention: query head ``h`` reads KV head
    ``h // (H // H_kv)``.
    """
    t_q, h, _ = q.shape
    t_k, h_kv, _ = k.shape
    group = h // h_kv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    pos_q = torch.arange(t_k - t_q, t_k).unsqueeze(1)  # [T_q, 1]
    pos_k = torch.arange(t_k).unsqueeze(0)  # [1, T_k]
    mask = pos_k <= pos_q  # [T_q, T_k]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )  # [H, T_q, D]
    return out.transpose(0, 1)
