"""The pluggable attention of every model in ``paged.models`` (the seam step03 swaps).

A model computes queries, keys and values for the T new tokens of one forward
pass — all sequences of the batch packed together — and hands them to an
``Attention`` object together with the layer index and the softmax scale. The
object owns everything about the past: it knows which new token belongs to
which sequence, stores the new keys and values in its cache (contiguous in
step02, paged from step03 on), and attends causally over cache + new tokens.
The model code never changes when the cache does.

Two optional keywords change what a layer's queries see, and a layer passes
them only when they change something (``attention_options``), so an attention
object written before them still runs every model within their bounds:
``window`` (sliding-window layers: Mistral, Phi-3, Gemma 2 / 3), passed only
when a query of the pass sits at a position the window cuts short; and
``softcap`` (Gemma 2's soft-capped scores).
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
        *,
        window: int | None = None,  # W: attend to positions p - W + 1 .. p only
        softcap: float | None = None,  # scores s become softcap * tanh(s / softcap) before the softmax
    ) -> torch.Tensor:  # [T, H, D]
        """Store ``k``/``v`` in the cache of layer ``layer`` and attend.

        Each new token at position ``p`` of its sequence attends to positions
        ``0..p`` of that sequence only (``p - W + 1 .. p`` with a window).
        Query head ``h`` reads KV head ``h // (H // H_kv)`` (grouped-query
        attention).
        """
        ...


# --8<-- [end:protocol]


def attention_options(window: int | None, longest: int, softcap: float | None) -> dict:
    """The keywords a layer hands its attention: ``window`` when a query of this pass sits at a
    position ``>= window`` (below, the window holds every earlier position: it changes nothing),
    ``softcap`` when set.

    Args:
        window: the layer's sliding window, or None.
        longest: one past the largest position among the pass's queries.
        softcap: the layer's score soft-capping, or None.
    """
    options = {}
    if window is not None and longest > window:
        options["window"] = window
    if softcap is not None:
        options["softcap"] = softcap
    return options
