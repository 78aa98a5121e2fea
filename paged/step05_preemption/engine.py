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

Extends: ``paged.step04_sharing.SharingEngine`` (replaces step03's "end the
newest request" with preemption).
"""

from __future__ import annotations

import bisect
import logging
from collections import deque

from paged.step02_block_table import KVCache, SequenceStatus
from paged.step04_sharing import SharingEngine, sample_seed
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

    # -- one iteration ---------------------------------------------------------
    # --8<-- [start:schedule]
    def _schedule(self):
        plan = self._empty_plan()
        plan.finished_seq_ids, self._finished_seq_ids = self._finished_seq_ids, []
        budget = {"tokens": self.max_num_batched_tokens, "seqs": self.max_num_seqs}
        self._ended, preempted = [], False
        queue = list(self.running)  # oldest first; victims come from its end
        for req in list(self.running):
            if req not in queue:  # preempted as a victim earlier in this loop
                continue
            queue.remove(req)
            work = self._work(req, budget, plan)
            if work is None:
                continue
            while self._blocks_for(work) > self.allocator.num_free:
                if not queue:
                    break
                self._preempt(queue.pop(), plan)
                preempted = True
            if self._blocks_for(work) <= self.allocator.num_free:
                self._run(plan, req, work, budget)
            elif any(r is not req for r in self.running):  # older groups hold blocks: wait for them
                self._preempt(req, plan)
                preempted = True
            else:  # alone on the device and still too big for the pool: it can never continue
                self._end_too_long(req)
        if not preempted:
            self._resume_swapped(plan, budget)
            if not self.swapped:
                self._admit_waiting(plan, budget)
        return plan, self._ended
    # --8<-- [end:schedule]

    def _work(self, req, budget, plan) -> list | None:
        """``[(seq, tokens to compute)]`` for this iteration, or None if the budgets say not now."""
        live = [s for s in req.seqs if not s.is_finished]
        pending = [s.num_tokens - s.block_table.num_tokens for s in live]
        if not live or len(live) > budget["seqs"]:
            return None
        if len(live) == 1:
            n = min(pending[0], budget["tokens"])
            return [(live[0], n)] if n > 0 else None
        if sum(pending) > budget["tokens"] and plan.seq_ids:  # a group runs whole (beams in lockstep)
            return None
        return list(zip(live, pending))

    def _blocks_for(self, work) -> int:
        bm, need = self.block_manager, 0
        for seq, n in work:
            t = seq.block_table
            need += bm.blocks_needed_for_prompt(seq.token_ids, n, t.reuse_cached) if t.num_tokens == 0 \
                else t.slots_for(n)
        return need

    def _run(self, plan, req, work, budget) -> None:
        """Give each sequence of ``req`` its slots and put its tokens into the plan."""
        for seq, n in work:
            t = seq.block_table
            first = len(t.blocks)
            if t.num_tokens == 0:  # a new prompt or a recomputation: cached blocks first
                cached, slots = self.block_manager.allocate_prompt(t, seq.token_ids, n)
                start = cached
                if not seq.output_token_ids:
                    req.num_cached_tokens = cached
            else:
                cached, (start, slots) = 0, (t.num_tokens, t.append(n))
            self._record_growth(req, seq, first, cached // self.block_size)
            seq.status = SequenceStatus.RUNNING
            # a decode step feeds just the newest token; avoid building the whole token list
            tokens = [seq.last_token_id] if start == seq.num_tokens - 1 else seq.token_ids[start:t.num_tokens]
            self.prompt_tokens_total += max(0, min(t.num_tokens, seq.num_prompt_tokens) - start)
            sample = t.num_tokens == seq.num_tokens
            plan.add(seq.seq_id, tokens, start, slots, t.num_tokens, t.blocks, sample, req.params, req.seed)
            budget["tokens"] -= len(tokens)
            budget["seqs"] -= 1
            if sample and self._fans_out(req):
                for i in range(1, req.params.best_of):
                    child = self._fork(req, seq, index=i)
                    plan.fanout.append((seq.seq_id, child.seq_id, sample_seed(req.seed, i)))
        for seq in req.seqs:
            self._take_copies(plan, req, seq)

    def _fans_out(self, req) -> bool:
        """The prompt of a parallel-sampling request is complete and its samples not yet forked."""
        p = req.params
        return p.best_of > 1 and not p.use_beam_search and len(req.seqs) == 1 and not req.seqs[0].output_token_ids

    # -- preemption ------------------------------------------------------------
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
        else:
            for s in live:
                self.block_manager.free(s.block_table)
                s.block_table.allocator = self.allocator
                s.status = SequenceStatus.WAITING
            self._insert(self.waiting, req)
        logger.debug("preempted %s by %s", req.request_id, mode)
    # --8<-- [end:preempt]

    # --8<-- [start:resume]
    def _resume_swapped(self, plan, budget) -> None:
        while self.swapped:
            req = self.swapped[0]
            live = [s for s in req.seqs if not s.is_finished]
            tables = [s.block_table for s in live]
            # its blocks back, plus one new block per sequence for the next token (at most); a group
            # alone on the device needs only its blocks back: if its next tokens then do not fit,
            # the running loop ends it, where waiting for room that never comes would hang
            reserve = len(live) if self.running else 0
            if (SwapSpace.distinct_blocks(tables) + reserve > self.allocator.num_free
                    or len(live) > budget["seqs"] or len(live) > budget["tokens"]):
                return
            moves = self.swap.swap_in(tables, self.allocator)
            plan.blocks_to_swap_in.extend(moves)
            self._record("swapped_in", req, blocks=moves)
            self.swapped.popleft()
            self._insert(self.running, req)
            work = self._work(req, budget, plan)
            if work is None:
                continue
            if self._blocks_for(work) <= self.allocator.num_free:
                self._run(plan, req, work, budget)
            elif len(self.running) == 1:  # alone, its blocks back, and its next tokens still do not fit
                self._end_too_long(req)

    def _admit_waiting(self, plan, budget) -> None:
        while self.waiting:
            req = self.waiting[0]
            work = self._work(req, budget, plan)
            if work is not None and self._blocks_for(work) > self.allocator.num_blocks:
                self.waiting.popleft()  # a recomputed group that lost its sharing: it can never fit
                self._end_too_long(req)
                continue
            if work is None or self._blocks_for(work) > self.allocator.num_free:
                return
            self.waiting.popleft()
            self._insert(self.running, req)
            self._record("admitted", req)
            self._run(plan, req, work, budget)
    # --8<-- [end:resume]

    def _end_too_long(self, req) -> None:
        """A group that outgrew the whole pool on its own: end it (it can never continue).

        It is reported as finished (``finish_reason="length"``) by this iteration's ``step``.
        """
        logger.warning("request %s needs more KV blocks than the cache has (%d); ending it",
                       req.request_id, self.allocator.num_blocks)
        if req.params.use_beam_search:  # the beams so far are its answers
            self._keep_live_beams(req)
            req.beam_done = True
        for s in req.seqs:
            if not s.is_finished:
                self.stops.finish(s, req.outputs[s.seq_id], "length")
        self._retire(req)
        self._ended.append(req)

    # --8<-- [start:insert]
    @staticmethod
    def _insert(queue, req) -> None:
        """Put ``req`` into ``queue`` in arrival order (FCFS across preemptions)."""
        i = bisect.bisect([r.arrival for r in queue], req.arrival)
        queue.insert(i, req)
    # --8<-- [end:insert]

    def _retire(self, req) -> None:
        super()._retire(req)
        if req in self.swapped:
            self.swapped.remove(req)
