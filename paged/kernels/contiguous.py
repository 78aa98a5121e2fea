"""``causal_attention``: plain causal attention over one sequence's contiguous keys and values.

The specification every attention path is measured against (docs/architecture.md,
the one oracle): the kernels' fallback (``paged.kernels.cpu``), the models'
``ContiguousAttention``, step03's reference path and the tests all call this one
function. It sits with the kernels, the bottom of the ladder, so each of them
imports it without climbing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_attention(
    q: torch.Tensor,  # [T_q, H, D]   queries of the last T_q positions
    k: torch.Tensor,  # [T_k, H_kv, D] every key of the sequence, oldest first
    v: torch.Tensor,  # [T_k, H_kv, D]
    scale: float,
) -> torch.Tensor:  # [T_q, H, D]
    """Query ``i`` sits at position ``T_k - T_q + i`` and sees keys ``0..`` that position.

    Grouped-query attention by repeating each KV head ``H // H_kv`` times.
    """
    t_q, h, _ = q.shape
    t_k, h_kv, _ = k.shape
    k = k.repeat_interleave(h // h_kv, dim=1)  # [T_k, H, D]
    v = v.repeat_interleave(h // h_kv, dim=1)
    mask = torch.arange(t_k, device=q.device)[None, :] <= torch.arange(t_k - t_q, t_k, device=q.device)[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )  # [H, T_q, D]
    return out.transpose(0, 1)
