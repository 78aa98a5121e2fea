"""The scheduler: one loop, written once here, and the hooks each later step overrides.

Every iteration ``_schedule`` fills one ``StepPlan``:

1. each running request, oldest first, gets slots for its pending tokens (a
   sequence's tokens without K/V yet: the newest one when decoding, the whole
   prompt when new) — a new block only when its last block is full (paper
   §4.3). When the free blocks do not cover it, the newest running request is
   evicted until they do;
2. if nobody was evicted, waiting requests are admitted first-come-first-served
   while the free blocks and the iteration's budgets cover their prompts (a
   request that cannot fit blocks the ones behind it).

Later steps never rewrite the loop; they override its hooks, each with its
own idea (the table of docs/architecture.md):

* ``_fit_to_budget`` — which tokens of a request run this iteration;
* ``_blocks_needed`` / ``_take_slots`` — how many free blocks they take, and
  the slots they get (step04: prefix-cache hits first);
* ``_give_slots`` — the tokens into the plan (step04: forks, copy-on-write);
* ``_evict`` — making room (step03 ends the request with
  ``finish_reason="kv_cache_exhausted"``; step05 preempts it);
* ``_admit`` / ``_admissible`` — who starts (step05: swapped groups first);
* ``_end`` — a request ended early (step04: beams keep their answers).

``Scheduler`` is the half of ``Engine`` that decides; it works on the
engine's state: the queues ``waiting`` and ``running`` (requests in arrival
order), the ``allocator``, ``block_size``, the budgets ``max_num_seqs`` and
``max_num_batched_tokens``, and ``stops`` (which finishes sequences).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections import deque

from paged.step02_block_table import Sequence, SequenceStatus
from paged.step03_attention.events import EngineEvent
from paged.step03_attention.plan import StepPlan
from paged.step03_attention.request import Request

logger = logging.getLogger("paged")


@dataclasses.dataclass
class Budget:
    """What is left of one iteration's budgets while the scheduler fills its plan."""

    tokens: int  # of max_num_batched_tokens
    seqs: int  # of max_num_seqs


class Scheduler:
    """The scheduling loop and its hooks; ``Engine`` inherits them (see the module docstring)."""

    def _record(self, kind: str, req: Request, seq: Sequence | None = None, **detail) -> None:
        """Note one scheduling decision for ``engine.events`` (see ``events.py``)."""
        self._new_events.append(EngineEvent(kind, req.request_id, None if seq is None else seq.seq_id, detail))

    def _record_growth(self, req: Request, seq: Sequence, first: int, cached: int = 0) -> None:
        """An ``allocated`` event for the blocks ``seq``'s table gained from index ``first`` on;
        its first ``cached`` of them came from the prefix cache."""
        blocks = seq.block_table.blocks
        if len(blocks) > first:
            self._record("allocated", req, seq, blocks=blocks[first + cached:], cached=blocks[first:first + cached])

    # --8<-- [start:schedule]
    def _schedule(self) -> tuple[StepPlan, list[Request]]:
        """Decide one iteration: the plan, and the requests ended while deciding it.

        Running groups go first, oldest first: each gets its pending tokens if
        the budgets allow (``_fit_to_budget``), after free blocks are made for
        them by evicting the newest running groups (``_evict``). Then, unless
        someone was evicted, waiting requests are admitted (``_admit``).
        """
        plan = self._empty_plan()
        plan.finished_seq_ids, self._finished_seq_ids = self._finished_seq_ids, []
        budget = Budget(tokens=self.max_num_batched_tokens, seqs=self.max_num_seqs)
        self._ended = []
        evicted = False
        queue = deque(self.running)  # oldest first; victims come from its end
        while queue:
            req = queue.popleft()
            work = self._fit_to_budget(req, budget, plan)
            if work is None:
                continue
            while self._blocks_needed(work) > self.allocator.num_free:
                victim = queue.pop() if queue else req
                self._evict(victim, plan)
                evicted = True
                if victim is req:
                    break
            else:
                self._give_slots(plan, req, work, budget)
        if not evicted:  # no newcomer may take the room an older request just lost
            self._admit(plan, budget)
        return plan, self._ended
    # --8<-- [end:schedule]

    def _fit_to_budget(self, req: Request, budget: Budget, plan: StepPlan) -> list | None:
        """``[(seq, tokens to compute)]`` for ``req`` this iteration, or None if the budgets say not now.

        A sequence's pending tokens are those without K/V yet: the whole prompt
        of a new request, the newest token of a decoding one. Step03 computes a
        request's pending tokens all at once (step05 splits a long prompt).
        """
        live = [s for s in req.seqs if not s.is_finished]
        pending = [s.num_tokens - s.block_table.num_tokens for s in live]
        if not live or len(live) > budget.seqs or sum(pending) > budget.tokens:
            return None
        return list(zip(live, pending))

    def _blocks_needed(self, work: list) -> int:
        """Free blocks that giving ``work`` its slots would take. Changes nothing."""
        return sum(seq.block_table.slots_for(n) for seq, n in work)

    # --8<-- [start:evict]
    def _evict(self, req: Request, plan: StepPlan) -> None:
        """Make room by taking ``req`` off the device. Step03 cannot preempt: it ends the request
        (``finish_reason="kv_cache_exhausted"``); step05 swaps it out or recomputes it later."""
        logger.warning("KV cache exhausted: ended request %s (step05 adds preemption)", req.request_id)
        self._end(req, "kv_cache_exhausted")
    # --8<-- [end:evict]

    def _end(self, req: Request, reason: str) -> None:
        """End every live sequence of ``req`` with ``reason`` and free its blocks now;
        this iteration's ``step`` reports it as finished."""
        for seq in req.seqs:
            if not seq.is_finished:
                self.stops.finish(seq, req.outputs[seq.seq_id], reason)
        self._retire(req)
        self._ended.append(req)

    # --8<-- [start:admit]
    def _admit(self, plan: StepPlan, budget: Budget) -> None:
        """FCFS: start waiting requests while the budgets and free blocks cover their prompts.

        A request that does not fit blocks the ones behind it (no overtaking).
        """
        while self.waiting:
            req = self.waiting[0]
            work = self._fit_to_budget(req, budget, plan)
            if work is None:
                return
            need = self._blocks_needed(work)
            if need > self.allocator.num_blocks:  # more than the whole pool
                self.waiting.popleft()
                logger.warning("request %s needs more KV blocks than the cache has (%d); ending it",
                               req.request_id, self.allocator.num_blocks)
                self._end(req, "length")
                continue
            if not self._admissible(req, need):
                return
            self.waiting.popleft()
            self._insert(self.running, req)
            self._record("admitted", req)
            self._give_slots(plan, req, work, budget)
    # --8<-- [end:admit]

    def _admissible(self, req: Request, need: int) -> bool:
        """May ``req`` start now? When the free blocks cover the ``need`` blocks of its first slots
        (paged: nothing is reserved ahead; a contiguous-reservation baseline asks more here)."""
        return need <= self.allocator.num_free

    # --8<-- [start:insert]
    @staticmethod
    def _insert(queue, req: Request) -> None:
        """Put ``req`` into ``queue`` in arrival order (FCFS, also across preemptions)."""
        i = bisect.bisect([r.arrival for r in queue], req.arrival)
        queue.insert(i, req)
    # --8<-- [end:insert]

    # --8<-- [start:give_slots]
    def _give_slots(self, plan: StepPlan, req: Request, work: list, budget: Budget) -> None:
        """Give each sequence of ``req`` slots for its tokens and put them into the plan.

        A sequence samples its next token only when none of its tokens is left
        without K/V (the last chunk of a prompt, or a decode).
        """
        for seq, n in work:
            table = seq.block_table
            first = len(table.blocks)
            start, slots, cached = self._take_slots(req, seq, n)
            self._record_growth(req, seq, first, cached // self.block_size)
            seq.status = SequenceStatus.RUNNING
            # a decode feeds just the newest token: no need to build the whole token list
            tokens = [seq.last_token_id] if start == seq.num_tokens - 1 else seq.token_ids[start:table.num_tokens]
            self.prompt_tokens_total += max(0, min(table.num_tokens, seq.num_prompt_tokens) - start)
            plan.add(seq.seq_id, tokens, start, slots, table.num_tokens, table.blocks,
                     sample=table.num_tokens == seq.num_tokens, params=req.params, seed=req.seed)
            budget.tokens -= len(tokens)
            budget.seqs -= 1
    # --8<-- [end:give_slots]

    def _take_slots(self, req: Request, seq: Sequence, n: int) -> tuple[int, list[int], int]:
        """Slots for ``seq``'s next ``n`` tokens: ``(position of the first, slots, tokens found cached)``.

        Step03: new blocks only when the last one is full (step04 maps cached prompt blocks first).
        """
        start = seq.block_table.num_tokens
        return start, seq.block_table.append(n), 0
