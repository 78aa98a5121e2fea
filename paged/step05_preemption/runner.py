"""The worker of step05: the host block pool, and swaps before copies before the forward pass.

The scheduler decides which blocks move (``blocks_to_swap_out`` ``(device,
host)`` and ``blocks_to_swap_in`` ``(host, device)`` in the plan); the memory
they move into is this runner's: a second ``KVCache`` in host memory with the
device cache's block shape, ``host_blocks`` blocks of it. A move of many blocks
across all layers is one indexed copy (``copy_between``).

Extends: ``paged.step04_sharing.SharingModelRunner`` with the host pool.
"""

from __future__ import annotations

import torch

from paged.step02_block_table import KVCache
from paged.step03_attention import StepPlan
from paged.step03_attention.backends import native_copy
from paged.step04_sharing import SharingModelRunner, copy_blocks


# --8<-- [start:copy_between]
def copy_between(src: KVCache, dst: KVCache, pairs: list[tuple[int, int]]) -> None:
    """Copy block ``s`` of ``src`` to block ``d`` of ``dst`` for every pair, all layers at once."""
    s = torch.tensor([a for a, _ in pairs], dtype=torch.int64, device=src.device)
    d = torch.tensor([b for _, b in pairs], dtype=torch.int64, device=dst.device)
    dst.data[:, :, d] = src.data[:, :, s].to(dst.device)  # [L, 2, P, B, H_kv, D]
# --8<-- [end:copy_between]


class PreemptingModelRunner(SharingModelRunner):
    """Executes ``blocks_to_swap_out``, then ``blocks_to_swap_in``, then ``blocks_to_copy``.

    Out before in: a device block freed by a swap-out may be the destination of
    a swap-in in the same iteration, so its data must leave first.

    Args:
        *args (object): as ``ModelRunner``.
        host_blocks: blocks of the host pool (0: none; the scheduler then never swaps).
        **kwargs (object): as ``ModelRunner``.
    """

    def __init__(self, *args, host_blocks: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        kv = self.kv_cache
        self.swap_cache = KVCache(kv.num_layers, host_blocks, kv.block_size, kv.num_kv_heads, kv.head_dim,
                                  kv.dtype, "cpu") if host_blocks > 0 else None

    # --8<-- [start:memory_ops]
    def execute_memory_ops(self, plan: StepPlan) -> None:
        if plan.blocks_to_swap_out:
            copy_between(self.kv_cache, self.swap_cache, plan.blocks_to_swap_out)
        if plan.blocks_to_swap_in:
            copy_between(self.swap_cache, self.kv_cache, plan.blocks_to_swap_in)
        if plan.blocks_to_copy:
            copy_blocks(self.kv_cache, plan.blocks_to_copy, native_copy(self.backend))
    # --8<-- [end:memory_ops]
