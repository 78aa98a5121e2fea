"""The worker of step05: swaps before copies before the forward pass.

Extends: ``paged.step04_sharing.SharingModelRunner`` with the host pool.
"""

from __future__ import annotations

from paged.step03_attention.backends import native_copy
from paged.step04_sharing import SharingModelRunner, copy_blocks
from paged.step05_preemption.plan import PreemptingStepPlan
from paged.step05_preemption.swap import copy_between


class PreemptingModelRunner(SharingModelRunner):
    """Executes ``blocks_to_swap_out``, then ``blocks_to_swap_in``, then ``blocks_to_copy``.

    Out before in: a device block freed by a swap-out may be the destination of
    a swap-in in the same iteration, so its data must leave first.
    """

    swap_cache = None  # the host KVCache, set by the engine

    # --8<-- [start:memory_ops]
    def execute_memory_ops(self, plan: PreemptingStepPlan) -> None:
        if plan.blocks_to_swap_out:
            copy_between(self.kv_cache, self.swap_cache, plan.blocks_to_swap_out)
        if plan.blocks_to_swap_in:
            copy_between(self.swap_cache, self.kv_cache, plan.blocks_to_swap_in)
        if plan.blocks_to_copy:
            copy_blocks(self.kv_cache, plan.blocks_to_copy, native_copy(self.backend))
    # --8<-- [end:memory_ops]
