"""The scheduler of step05: FCFS with gang preemption, swap and recompute (paper §4.5).

Every iteration the scheduler walks three queues, oldest request first:

1. ``running`` — each group gets its pending tokens (one per decoding
   sequence; the next chunk of a prompt or a recomputation). When the free
   blocks do not cover a group, the most recently arrived running group is
   preempted *whole* (its sequences share blocks: all or nothing) until it
   fits; if the group itself is the newest left, it is preempted.
2. ``swapped`` — only if nobody was preempted this iteration: groups come
   back from host memory, oldest first, while their blocks fit.
3. ``waiting`` — only if nobody is swapped out: new requests, and groups
   preempted by recomputation (kept in arrival order, so a preempted request
   resumes before later arrivals), while blocks and budgets allow.

Budgets: ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens per
iteration; a prompt longer than the token budget is prefilled over several
iterations (``chunked.py``).

Extends: ``ChunkedPrefillScheduler`` (``chunked.py``). The loop is step03's;
this class overrides two of its hooks: ``_evict`` (preempt by swap or
recompute instead of ending the request) and ``_admit`` (swapped groups come
back first), and retires from the swapped queue too.
"""

from __future__ import annotations

import logging
from collections import deque

from paged.step02_block_table import SequenceStatus
from paged.step05_preemption import policy
from paged.step05_preemption.chunked import ChunkedPrefillScheduler
from paged.step05_preemption.plan import PreemptingStepPlan
from paged.step05_preemption.swap import SwapSpace

logger = logging.getLogger("paged")


class PreemptingScheduler(ChunkedPrefillScheduler):
    """A scheduler that preempts instead of ending requests: a swapped queue beside waiting and running.

    Args:
        swap: the host block pool (``SwapSpace``; ``SwapSpace(0)``: no swapping).
        preemption_mode: ``"swap"``, ``"recompute"`` or ``"auto"`` (see ``policy.py``).
        num_params: the model's size, which ``policy.choose`` ranks swap against recompute by.
        bytes_per_block: a block's bytes (the same ranking).
        device_type: the device (the same ranking).
        **kwargs (object): as ``ChunkedPrefillScheduler``.
    """

    def __init__(self, num_blocks: int, block_size: int, *, swap: SwapSpace, preemption_mode: str = "auto",
                 num_params: int = 1, bytes_per_block: int = 1, device_type: str = "cpu", **kwargs) -> None:
        if preemption_mode not in policy.MODES:
            raise ValueError(f"preemption_mode must be one of {policy.MODES}, got {preemption_mode!r}")
        super().__init__(num_blocks, block_size, **kwargs)
        self.swap = swap
        self.preemption_mode = preemption_mode
        self._cost = (num_params, bytes_per_block, device_type)
        self.swapped: deque = deque()  # arrival order
        self.preemptions = {"swap": 0, "recompute": 0}

    def _empty_plan(self) -> PreemptingStepPlan:
        return PreemptingStepPlan()

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # --8<-- [start:evict]
    def _evict(self, req, plan) -> None:
        """Preempt ``req`` instead of ending it — unless it is alone on the device and still does
        not fit: then it outgrew the whole pool and can never continue."""
        if self.running == [req]:
            logger.warning("request %s needs more KV blocks than the cache has (%d); ending it",
                           req.request_id, self.allocator.num_blocks)
            self._end(req, "length")
        else:
            self._preempt(req, plan)
    # --8<-- [end:evict]

    # --8<-- [start:preempt]
    def _preempt(self, req, plan) -> None:
        """Evict a whole group: to host memory or for recomputation (``policy.choose``)."""
        live = [s for s in req.seqs if not s.is_finished]
        tables = [s.block_table for s in live]
        blocks = SwapSpace.distinct_blocks(tables)
        mode = policy.choose(self.preemption_mode, len(live), sum(s.num_tokens for s in live), blocks,
                             self.swap.allocator.num_free, *self._cost)
        self.running.remove(req)
        self.preemptions[mode] += 1
        self._record("preempted", req, mode=mode)
        if mode == "swap":
            moves = self.swap.swap_out(tables, self.allocator)
            plan.blocks_to_swap_out.extend(moves)
            self._record("swapped_out", req, blocks=moves)
            for s in live:
                s.status = SequenceStatus.SWAPPED
            self._insert(self.swapped, req)
        else:  # its K/V is dropped; its tokens (prompt and output) are computed again later
            for s in live:
                self.block_manager.free(s.block_table)
                s.block_table.allocator = self.allocator
                s.status = SequenceStatus.WAITING
            self._insert(self.waiting, req)
        logger.debug("preempted %s by %s", req.request_id, mode)
    # --8<-- [end:preempt]

    # --8<-- [start:resume]
    def _admit(self, plan, budget) -> None:
        """Swapped groups come back first, oldest first; new requests and recomputations (the
        waiting queue, in arrival order) only when nobody is left swapped out."""
        self._resume_swapped(plan, budget)
        if not self.swapped:
            super()._admit(plan, budget)

    def _resume_swapped(self, plan, budget) -> None:
        while self.swapped:
            req = self.swapped[0]
            tables = [s.block_table for s in req.seqs if not s.is_finished]
            work = self._fit_to_budget(req, budget, plan)  # the budgets as for any running group
            # its blocks back, plus one new block per sequence for the next token (at most); a group
            # alone on the device needs only its blocks back: if its next tokens then do not fit,
            # it is ended below, where waiting for room that never comes would hang
            reserve = len(tables) if self.running else 0
            if work is None or SwapSpace.distinct_blocks(tables) + reserve > self.allocator.num_free:
                return
            moves = self.swap.swap_in(tables, self.allocator)
            plan.blocks_to_swap_in.extend(moves)
            self._record("swapped_in", req, blocks=moves)
            self.swapped.popleft()
            self._insert(self.running, req)
            if self._blocks_needed(work) <= self.allocator.num_free:
                self._give_slots(plan, req, work, budget)
            elif self.running == [req]:  # alone, its blocks back, and its next tokens still do not fit
                self._evict(req, plan)
    # --8<-- [end:resume]

    def _retire(self, req) -> None:
        super()._retire(req)
        if req in self.swapped:
            self.swapped.remove(req)
