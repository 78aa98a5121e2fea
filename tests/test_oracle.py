"""The oracle itself, against softmax attention written out by hand (float64, toleranced:
SDPA and the explicit formula sum in different orders)."""

import math

import torch
from hypothesis import given, strategies as st

from tests.oracle import contiguous_attention
from tests.strategies import gqa_heads
from tests.tolerances import FLOAT64


def _by_hand(q, k, v, scale):
    t_q, h, _ = q.shape
    t_k, h_kv, _ = k.shape
    out = torch.empty_like(q)
    for i in range(t_q):
        pos = t_k - t_q + i
        for head in range(h):
            kv = head // (h // h_kv)
            scores = [float(q[i, head] @ k[j, kv]) * scale for j in range(pos + 1)]
            top = max(scores)
            w = [math.exp(s - top) for s in scores]
            out[i, head] = sum(wj * v[j, kv] for j, wj in enumerate(w)) / sum(w)
    return out


@given(heads=gqa_heads(), t_k=st.integers(1, 12), data=st.data())
def test_oracle_matches_softmax_by_hand_toleranced(heads, t_k, data):
    h, h_kv = heads
    t_q = data.draw(st.integers(1, t_k))
    g = torch.Generator().manual_seed(t_k * 31 + t_q)
    q = torch.randn(t_q, h, 8, dtype=torch.float64, generator=g)
    k = torch.randn(t_k, h_kv, 8, dtype=torch.float64, generator=g)
    v = torch.randn(t_k, h_kv, 8, dtype=torch.float64, generator=g)
    torch.testing.assert_close(contiguous_attention(q, k, v, 0.3), _by_hand(q, k, v, 0.3), **FLOAT64)
