"""The worker of step04: fused block copies and one prompt sampled by many sequences.

Two additions to step03's ``ModelRunner``:

* ``blocks_to_copy`` (copy-on-write) runs before the forward pass as ONE
  indexed copy over every layer, keys and values — the paper's fused block
  copy. Every copy reads the cache as it was before any of them writes.
* ``fanout``: after a prompt is computed once, each of its parallel samples
  draws its first token from that same row of logits with its own generator.

Extends: ``paged.step03_attention.ModelRunner`` and ``StepPlan``.
"""

from __future__ import annotations


import torch

from paged.step02_block_table import KVCache
from paged.step03_attention import ModelRunner, StepPlan
from paged.step03_attention.backends import native_copy


# --8<-- [start:copy]
def copy_blocks(kv_cache: KVCache, pairs: list[tuple[int, int]], native=None) -> None:
    """Copy block ``src`` to ``dst`` for every pair, in all layers at once (one indexed copy),
    or with ``native``, a backend's fused copy kernel (``backends.native_copy``), in one launch."""
    if native is not None:
        native(kv_cache.data, torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2))
        return
    src = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=kv_cache.device)
    dst = torch.tensor([d for _, d in pairs], dtype=torch.int64, device=kv_cache.device)
    kv_cache.data[:, :, dst] = kv_cache.data[:, :, src]  # [L, 2, P, B, H_kv, D]
# --8<-- [end:copy]


class SharingModelRunner(ModelRunner):
    def execute_memory_ops(self, plan: StepPlan) -> None:
        if plan.blocks_to_swap_out or plan.blocks_to_swap_in:
            raise NotImplementedError("swaps arrive with step05's runner (its host pool)")
        if plan.blocks_to_copy:
            copy_blocks(self.kv_cache, plan.blocks_to_copy, native_copy(self.backend))

    def _sample_rows(self, plan: StepPlan):
        rows = super()._sample_rows(plan)
        if plan.fanout:
            row_of = {r[0]: r for r in rows}
            rows += [(child, row_of[parent][1], row_of[parent][2], seed) for parent, child, seed in plan.fanout]
        return rows
