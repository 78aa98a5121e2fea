"""The pluggable attention of every model in ``paged.models`` (the seam step03 swaps).

A model computes queries, keys and values for the T new tokens of one forward
pass — all sequences of the batch packed together — and hands them to an
``Attention`` object together with the layer index and the softmax scale. The
object owns everything about the past: it knows which new token belongs to
which sequence, stores the new keys and values in its cache (contiguous in
step02, paged from step03 on), and attends causally over cache + new tokens.
The model code never changes when the cache does.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

# --8<-- [start:protocol]
@runtime_checkable
class Attention(Protocol):
    """Causal attention over a KV cache, called once per layer per forward pass."""

    def __call__(
        self,
        layer: int,
        q: torch.Tensor,  # [T, H, D]    queries of the T new tokens, all sequences packed
        k: torch.Tensor,  # [T, H_kv, D] their keys (already rotated for RoPE models)
        v: torch.Tensor,  # [T, H_kv, D] their values
        scale: float,  # softmax scale, usually D**-0.5
    ) -> torch.Tensor:  # [T, H, D]
        """Store ``k``/``v`` in the cache of layer ``layer`` and attend.

        Each new token at position ``p`` of its sequence attends to positions
        ``0..p`` of that sequence only. Query head ``h`` reads KV head
        ``h // (H // H_kv)`` (grouped-query attention).
        """
        ...


# --8<-- [end:protocol]
