"""PagedAttention as the model sees it: write new K/V by slot, attend through block tables.

The models in ``paged.models`` call ``attention(layer, q, k, v, scale)`` with
the new tokens of every sequence packed together. ``PagedAttention`` is that
callable for a paged ``KVCache``: the paper's fused "reshape and write" (store
each new key and value at its slot, ``block * B + offset``), then attention of
each sequence's new queries over its blocks (paper §4.1, Figure 5), the query
at position p seeing keys 0 .. p (p - W + 1 .. p in a layer with a sliding
window W; scores soft-capped in a layer with a ``softcap``). Which kernel runs is the backend's choice
(``backends.attention_path``), and so is how a token's result is kept
independent of the batch when the engine asks for that (batch-invariant mode).

``AttentionMetadata`` is built once per iteration from the ``StepPlan``: the
plan's lists become tensors here, once, not once per layer (docs/architecture.md, StepPlan).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from paged.step02_block_table import KVCache
from paged.step03_attention.backends import attention_path, kv_writer


@dataclass
class AttentionMetadata:
    """Where this iteration's tokens go and what each sequence attends over."""

    slot_mapping: torch.Tensor  # [T] int64, cache slot of each new token
    block_tables: torch.Tensor  # [S, M] int32, padded with 0
    context_lens: torch.Tensor  # [S] int32, cached tokens incl. the new ones
    query_lens: list[int]  # new tokens of each sequence (host copy)
    context_lens_host: list[int]
    query_lens_tensor: torch.Tensor  # [S] int32, query_lens on the device
    decode_seqs: torch.Tensor | None  # [S_d] one-token sequences of a mixed batch
    decode_rows: torch.Tensor | None  # [S_d] their token rows in the packed batch
    prompts: list[tuple[int, int, int, int]]  # (seq, first token, q_len, ctx_len) of the others
    batch_invariant: bool = False  # a token's result must not depend on the rest of the batch

    @property
    def all_decode(self) -> bool:
        return not self.prompts

    @cached_property
    def per_token(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each new token as a sequence of its own: its sequence's table ``[T, M]`` int32 and
        the context it sees ``[T]`` int32 (its position + 1). Built on first use, for the
        backends that keep batch invariance one query per row."""
        device = self.block_tables.device
        lens = torch.tensor([c - q + 1 + i for q, c in zip(self.query_lens, self.context_lens_host)
                             for i in range(q)], dtype=torch.int32, device=device)
        tables = self.block_tables.repeat_interleave(self.query_lens_tensor.long(), dim=0,
                                                     output_size=len(lens))  # [T, M]
        return tables, lens

    @classmethod
    def build(cls, slot_mapping, block_tables, context_lens, query_lens, device,
              batch_invariant: bool = False) -> "AttentionMetadata":
        """From the plan's lists: slot_mapping [T], block_tables S lists, context_lens [S], query_lens [S]."""
        width = max((len(t) for t in block_tables), default=0) or 1
        table = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
        decode, rows, prompts, start = [], [], [], 0
        for s, (q, c) in enumerate(zip(query_lens, context_lens)):
            if q == 1:
                decode.append(s)
                rows.append(start)
            else:
                prompts.append((s, start, q, c))
            start += q
        mixed = bool(prompts and decode)
        return cls(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            block_tables=table.to(device),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            query_lens=list(query_lens),
            context_lens_host=list(context_lens),
            query_lens_tensor=torch.tensor(query_lens, dtype=torch.int32, device=device),
            decode_seqs=torch.tensor(decode, dtype=torch.int64, device=device) if mixed else None,
            decode_rows=torch.tensor(rows, dtype=torch.int64, device=device) if mixed else None,
            prompts=prompts,
            batch_invariant=batch_invariant,
        )


class PagedAttention:
    """The ``Attention`` callable of ``paged.models`` over a paged KV cache.

    Args:
        kv_cache: the cache of every layer.
        meta: this iteration's metadata.
        backend: ``reference``, ``blockwise``, ``cpu``, ``cuda`` or ``emulated-cuda`` (see backends.py).
    """

    def __init__(self, kv_cache: KVCache, meta: AttentionMetadata, backend: str) -> None:
        self.kv_cache, self.meta, self.backend = kv_cache, meta, backend
        self._write = kv_writer(backend, kv_cache)
        self._attend = attention_path(backend, meta.batch_invariant)

    # --8<-- [start:paged_attention]
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *,
                 window: int | None = None, softcap: float | None = None):
        """q [T, H, D], k/v [T, H_kv, D] -> [T, H, D]; ``window`` and ``softcap`` as in the models'
        ``Attention`` protocol (a sliding window, soft-capped scores)."""
        m = self.meta
        self._write(layer, k, v, m.slot_mapping)  # each new token's key and value at its slot
        kc, vc = self.kv_cache.key(layer), self.kv_cache.value(layer)  # [N, B, H_kv, D]
        # each sequence's queries over its blocks (m.block_tables, m.context_lens, m.query_lens)
        return self._attend(q, kc, vc, m, scale, window, softcap)
    # --8<-- [end:paged_attention]
