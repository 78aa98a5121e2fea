"""The engine of step05: FCFS scheduling with gang preemption, swap and recompute (paper §4.5).

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

One rule drives prefill, chunked prefill, decode and recompute alike: a
sequence has ``num_tokens - block_table.num_tokens`` pending tokens (those
without K/V yet); this iteration computes up to the token budget of them, and
the sequence samples only when none remain. A group of several sequences is
computed whole in one iteration, so beams stay in lockstep.

Budgets: ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens per
iteration; a prompt longer than the token budget is prefilled over several
iterations while running sequences keep decoding in the same iterations.

Extends: ``paged.step04_sharing.SharingEngine``. The scheduler's loop is
step03's; this step overrides three of its hooks: ``_fit_to_budget`` (chunked
prefill, groups whole), ``_evict`` (preempt by swap or recompute instead of
ending the request) and ``_admit`` (swapped groups come back first).
"""

from __future__ import annotations

import logging
from collections import deque

from paged.step02_block_table import KVCache, SequenceStatus
from paged.step04_sharing import SharingEngine
from paged.step04_sharing.snapshot import DEFAULT_MAX_CELLS
from paged.step05_preemption import policy, snapshot
from paged.step05_preemption.runner import PreemptingModelRunner
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

    def __init__(self, model, *, preemption_mode: str = "auto", swap_space: int = DEFAULT_SWAP_SPACE,
                 **kwargs) -> None:
        if preemption_mode not in policy.MODES:
            raise ValueError(f"preemption_mode must be one of {policy.MODES}, got {preemption_mode!r}")
        if not isinstance(swap_space, (int, float)) or swap_space < 0:
            raise ValueError(f"swap_space must be a number of bytes >= 0, got {swap_space!r}")
        kwargs.setdefault("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)
        super().__init__(model, **kwargs)
        self.preemption_mode = preemption_mode
        kv = self.kv_cache
        per_block = KVCache.bytes_per_block(kv.num_layers, kv.block_size, kv.num_kv_heads, kv.head_dim, kv.dtype)
        self.swap = SwapSpace(int(swap_space) // per_block, kv)
        self.runner.swap_cache = self.swap.cache
        self._bytes_per_block = per_block
        self._num_params = sum(p.numel() for p in model.model.parameters())
        self.swapped: deque = deque()
        self.preemptions = {"swap": 0, "recompute": 0}
        logger.info("swap space: %d host blocks; preemption mode: %s", self.swap.allocator.num_blocks,
                    preemption_mode)

    def _check_prompt_fits_iteration(self, n: int) -> None:
        """Any prompt fits: it is prefilled in chunks of the token budget."""

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def kv_snapshot(self, max_cells: int = DEFAULT_MAX_CELLS) -> dict:
        """Step04's snapshot with the host swap pool and the swapped queue."""
        return snapshot.take_snapshot(self, max_cells)

    def stats(self) -> dict:
        out = super().stats()
        out["swapped"] = len(self.swapped)
        out["preemptions"] = dict(self.preemptions)
        out["swap_blocks_used"] = self.swap.allocator.num_used
        out["swap_blocks_total"] = self.swap.allocator.num_blocks
        return out

    # -- scheduler hooks: budgets, victims, swap / recompute, chunked prefill ------
    # --8<-- [start:fit_to_budget]
    def _fit_to_budget(self, req, budget, plan):
        """A lone sequence takes what the token budget leaves (a long prompt is prefilled in chunks,
        while the others keep decoding); a group of several runs whole, so beams stay in lockstep
        — over the budget only when it would otherwise never run (the plan is still empty)."""
        live = [s for s in req.seqs if not s.is_finished]
        if not live or len(live) > budget.seqs:
            return None
        pending = [s.num_tokens - s.block_table.num_tokens for s in live]
        if len(live) == 1:
            n = min(pending[0], budget.tokens)
            return [(live[0], n)] if n > 0 else None
        if sum(pending) > budget.tokens and plan.seq_ids:
            return None
        return list(zip(live, pending))
    # --8<-- [end:fit_to_budget]

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
                             self.swap.allocator.num_free, self._num_params, self._bytes_per_block,
                             self.kv_cache.device.type)
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
