"""The engine of step05: FCFS scheduling with gang preemption, swap and recompute (paper §4.5).

The scheduling is ``PreemptingScheduler``'s (``scheduler.py``: three queues,
gang preemption, swap or recompute) over ``ChunkedPrefillScheduler``
(``chunked.py``: a prompt longer than the token budget is prefilled over
several iterations). This engine builds it with a host pool (``SwapSpace``:
``swap_space`` bytes) and hands the pool's cache to its runner, which moves
the blocks (swap-out before swap-in, both before the forward pass).

Budgets: ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens
(2048 by default) per iteration.

Extends: ``paged.step04_sharing.SharingEngine`` (``scheduler_class``,
``runner_class``, the swap pool).
"""

from __future__ import annotations

import logging

from paged.step02_block_table import KVCache
from paged.step04_sharing import SharingEngine
from paged.step04_sharing.snapshot import DEFAULT_MAX_CELLS
from paged.step05_preemption import policy, snapshot
from paged.step05_preemption.runner import PreemptingModelRunner
from paged.step05_preemption.scheduler import PreemptingScheduler
from paged.step05_preemption.swap import SwapSpace

logger = logging.getLogger("paged")

DEFAULT_SWAP_SPACE = 256 * 2**20  # bytes of host memory for swapped-out blocks
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


class PreemptingEngine(SharingEngine):
    """``SharingEngine`` with a scheduler that preempts instead of ending requests.

    Args:
        preemption_mode: ``"swap"``, ``"recompute"`` or ``"auto"`` (see ``policy.py``).
        swap_space: bytes of host memory for swapped-out blocks (0 disables swapping).
        **kwargs (object): as ``SharingEngine``; ``max_num_batched_tokens`` defaults to 2048
            and may be smaller than a prompt (chunked prefill).
    """

    runner_class = PreemptingModelRunner
    scheduler_class = PreemptingScheduler

    def __init__(self, model, *, preemption_mode: str = "auto", swap_space: int = DEFAULT_SWAP_SPACE,
                 **kwargs) -> None:
        if preemption_mode not in policy.MODES:
            raise ValueError(f"preemption_mode must be one of {policy.MODES}, got {preemption_mode!r}")
        if not isinstance(swap_space, (int, float)) or swap_space < 0:
            raise ValueError(f"swap_space must be a number of bytes >= 0, got {swap_space!r}")
        kwargs.setdefault("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)
        self.preemption_mode, self._swap_space = preemption_mode, swap_space
        super().__init__(model, **kwargs)
        self.runner.swap_cache = self.swap.cache
        logger.info("swap space: %d host blocks; preemption mode: %s", self.swap.allocator.num_blocks,
                    preemption_mode)

    def _scheduler_options(self) -> dict:
        """The host pool (its blocks from ``swap_space`` bytes) and what the swap-or-recompute rule weighs."""
        kv = self.kv_cache
        per_block = KVCache.bytes_per_block(kv.num_layers, kv.block_size, kv.num_kv_heads, kv.head_dim, kv.dtype)
        return {**super()._scheduler_options(), "swap": SwapSpace(int(self._swap_space) // per_block, kv),
                "preemption_mode": self.preemption_mode, "bytes_per_block": per_block,
                "num_params": sum(p.numel() for p in self.model.model.parameters()), "device_type": kv.device.type}

    # the scheduler's host pool and its counters, read through the engine
    @property
    def swap(self) -> SwapSpace:
        return self.scheduler.swap

    @property
    def swapped(self):
        return self.scheduler.swapped

    @property
    def preemptions(self) -> dict:
        return self.scheduler.preemptions

    def kv_snapshot(self, max_cells: int = DEFAULT_MAX_CELLS) -> dict:
        """Step04's snapshot with the host swap pool and the swapped queue."""
        return snapshot.take_snapshot(self, max_cells)

    def stats(self) -> dict:
        out = super().stats()
        out["swapped"] = len(self.swapped)  # (steps 03-04 have no swapped queue)
        out["preemptions"] = dict(self.preemptions)
        out["swap_blocks_used"] = self.swap.allocator.num_used
        out["swap_blocks_total"] = self.swap.allocator.num_blocks
        return out
