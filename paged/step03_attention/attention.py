"""PagedAttention as the model sees it: write new K/V by slot, attend through block tables.

The models in ``paged.models`` call ``attention(layer, q, k, v, scale)`` with
the new tokens of every sequence packed together. ``PagedAttention`` is that
callable for a paged ``KVCache``: the paper's fused "reshape and write" (store
each new key and value at its slot, ``block * B + offset``), then attention of
each new query over its sequence's blocks (paper §4.1, Figure 5).

``AttentionMetadata`` is built once per iteration from the ``StepPlan``: the
plan's lists become tensors here, once, not once per layer (docs/architecture.md, StepPlan).

Batch-invariant mode (``per_token``): every new token, prompt or decode, is
attended as a query of its own over the cache, through the same kernel and the
same order over blocks, with the context it sees (``token_tables``,
``token_lens``). A token's result then depends only on its sequence's K/V, not
on how many other tokens share the pass, whether its prompt's prefix came from
the prefix cache, where a chunk of the prompt ended, or whether it is being
recomputed after a preemption (docs/architecture.md, batch invariance).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged.step02_block_table import KVCache
from paged.step03_attention.backends import NATIVE, native_decode, native_write, prefill_attention
from paged.step03_attention.blockwise import blockwise_attention
from paged.step03_attention.reference import reference_attention


@dataclass
class AttentionMetadata:
    """Where this iteration's tokens go and what each sequence attends over."""

    slot_mapping: torch.Tensor  # [T] int64, cache slot of each new token
    block_tables: torch.Tensor  # [S, M] int32, padded with 0
    context_lens: torch.Tensor  # [S] int32, cached tokens incl. the new ones
    query_lens: list[int]  # new tokens of each sequence (host copy)
    context_lens_host: list[int]
    decode_seqs: torch.Tensor | None  # [S_d] one-token sequences of a mixed batch
    decode_rows: torch.Tensor | None  # [S_d] their token rows in the packed batch
    prompts: list[tuple[int, int, int, int]]  # (seq, first token, q_len, ctx_len) of the others
    token_tables: torch.Tensor | None = None  # [T, M] int32, batch-invariant mode: each token's table
    token_lens: torch.Tensor | None = None  # [T] int32, the context each token sees (its position + 1)

    @property
    def all_decode(self) -> bool:
        return not self.prompts

    @classmethod
    def build(cls, slot_mapping, block_tables, context_lens, query_lens, device,
              per_token: bool = False) -> "AttentionMetadata":
        """From the plan's lists: slot_mapping [T], block_tables S lists, context_lens [S], query_lens [S];
        ``per_token`` adds each token's own table and context length (batch-invariant mode)."""
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
        token_tables = token_lens = None
        if per_token:
            token_lens = torch.tensor([c - q + 1 + i for q, c in zip(query_lens, context_lens) for i in range(q)],
                                      dtype=torch.int32, device=device)
            token_tables = table.to(device).repeat_interleave(
                torch.tensor(list(query_lens), device=device), dim=0)  # [T, M]
        return cls(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            block_tables=table.to(device),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            query_lens=list(query_lens),
            context_lens_host=list(context_lens),
            decode_seqs=torch.tensor(decode, dtype=torch.int64, device=device) if mixed else None,
            decode_rows=torch.tensor(rows, dtype=torch.int64, device=device) if mixed else None,
            prompts=prompts,
            token_tables=token_tables,
            token_lens=token_lens,
        )


class PagedAttention:
    """The ``Attention`` callable of ``paged.models`` over a paged KV cache.

    Args:
        kv_cache: the cache of every layer.
        meta: this iteration's metadata.
        backend: ``reference``, ``blockwise``, ``cpu``, ``cuda`` or ``emulated-cuda`` (see backends.py).

    With ``meta.token_tables`` set (batch-invariant mode) every token goes through
    the backend's one-query-per-row path; otherwise prompts take the faster
    prompt paths below.
    """

    def __init__(self, kv_cache: KVCache, meta: AttentionMetadata, backend: str) -> None:
        self.kv_cache, self.meta, self.backend = kv_cache, meta, backend
        self._decode = native_decode(backend, fixed_split=meta.token_tables is not None) \
            if backend in NATIVE else None
        self._write = native_write(backend)

    # --8<-- [start:paged_attention]
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
        """q [T, H, D], k/v [T, H_kv, D] -> [T, H, D]."""
        m = self.meta
        kc, vc = self.kv_cache.key(layer), self.kv_cache.value(layer)  # [N, B, H_kv, D]
        if self._write is None:
            self.kv_cache.write(layer, k, v, m.slot_mapping)
        else:  # the C++ row copy: no index tensors, no host check of the slots
            self._write(kc, vc, k, v, m.slot_mapping)
        if m.token_tables is not None:  # batch-invariant: each token a query of its own, one path
            if self._decode is not None:
                return self._decode(q, kc, vc, m.token_tables, m.token_lens, scale)
            fn = blockwise_attention if self.backend == "blockwise" else reference_attention
            return fn(q, kc, vc, m.token_tables, m.token_lens, None, scale)
        if self._decode is None:  # the pure-PyTorch paths take every sequence as it comes
            fn = blockwise_attention if self.backend == "blockwise" else reference_attention
            q_lens = None if m.all_decode else m.query_lens
            return fn(q, kc, vc, m.block_tables, m.context_lens, q_lens, scale)
        if m.all_decode:
            return self._decode(q, kc, vc, m.block_tables, m.context_lens, scale)
        out = torch.empty_like(q)
        for s, start, q_len, ctx in m.prompts:
            rows = slice(start, start + q_len)
            if q_len == ctx:  # nothing cached before this prompt: attend over its own K/V
                out[rows] = prefill_attention(q[rows], k[rows], v[rows], scale)
            else:  # a cached prefix (step04) or a recomputation chunk (step05)
                out[rows] = reference_attention(
                    q[rows], kc, vc, m.block_tables[s : s + 1], m.context_lens[s : s + 1], [q_len], scale
                )
        if m.decode_seqs is not None:
            rows = m.decode_rows
            out[rows] = self._decode(
                q[rows], kc, vc, m.block_tables[m.decode_seqs], m.context_lens[m.decode_seqs], scale
            )
        return out
    # --8<-- [end:paged_attention]
