"""The scheduler: it owns the queues, the block pool and the budgets, and decides every iteration.

``Scheduler`` is an object of its own (the engine holds one): ``add(...)``
queues a request, ``schedule()`` returns the next ``StepPlan``, and
``update(plan, results)`` takes back what the workers sampled. It is plain
Python over plain data — sequences, block tables, queues — so it runs without a
model (``stand_in.py`` drives it in the tests).

One iteration, written once here (``schedule``):

1. each running request, oldest first, gets slots for its pending tokens (a
   sequence's tokens without K/V yet: the newest one when decoding, the whole
   prompt when new) — a new block only when its last block is full (paper
   §4.3). When the free blocks do not cover it, the newest running request is
   evicted until they do;
2. if nobody was evicted, waiting requests are admitted first-come-first-served
   while the free blocks, the budgets and the reservation policy allow (a
   request that cannot start blocks the ones behind it).

Later steps never rewrite the loop; each extends this class by one named
class per idea, overriding the hooks of that idea (the table of
docs/architecture.md):

* ``_fit_to_budget`` — which tokens of a request run this iteration (step05:
  chunked prefill, ``ChunkedPrefillScheduler``);
* ``_blocks_needed`` / ``_take_slots`` — how many free blocks they take, and
  the slots they get (step04: prefix-cache hits first, ``SharingScheduler``);
* ``_give_slots`` — the tokens into the plan (step04: forks, copy-on-write);
* ``_evict`` — making room (step03 ends the request with
  ``finish_reason="kv_cache_exhausted"``; step05 preempts it,
  ``PreemptingScheduler``);
* ``_admit`` — who starts (step05: swapped groups first);
* ``_end`` / ``_process`` — a request ended early, a sampled token recorded
  (step04: beams).

Admission asks one more party: the ``reservation`` policy (``Reservation``):
``reserve(request)`` at admission, ``release(request)`` at retirement. Paged
memory reserves nothing; the Orca baselines reserve contiguous chunks
(``paged.step01_allocator.orca.ContiguousReservation``).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
from collections import deque

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table import BlockTable, Sequence, SequenceStatus
from paged.errors import RequestError
from paged.step03_attention.events import EngineEvent
from paged.step03_attention.outputs import CompletionOutput
from paged.step03_attention.plan import StepPlan
from paged.step03_attention.request import Request, StopChecker

logger = logging.getLogger("paged")


@dataclasses.dataclass
class Budget:
    """What is left of one iteration's budgets while the scheduler fills its plan."""

    tokens: int  # of max_num_batched_tokens
    seqs: int  # of max_num_seqs


class Reservation:
    """The admission seam: what paged memory reserves for a request beyond its first blocks — nothing.

    The scheduler calls ``reserve(req)`` once, when ``req`` is about to start
    (its first blocks are free): False keeps it waiting (and, FCFS, everyone
    behind it); True means it starts now. It calls ``release(req)`` once, when
    ``req`` retires. A policy that reserves memory holds it in between.
    """

    def reserve(self, req: Request) -> bool:
        return True

    def release(self, req: Request) -> None:
        pass


class Scheduler:
    """FCFS iteration-level scheduling over a paged block pool (see the module docstring).

    Args:
        num_blocks: physical KV blocks in the pool.
        block_size: tokens per block (B).
        max_num_seqs: most sequences in one iteration.
        max_num_batched_tokens: most tokens in one iteration (prompts included).
        stops: decides when a sequence is done (``StopChecker``).
        free_order (list[int] | None): initial free-list order of the allocator (tests shuffle it).
        reservation: the admission policy (``Reservation``; default: paged, reserves nothing).
    """

    chunked_prefill = False  # step03 computes a prompt in one iteration: it must fit the token budget

    def __init__(self, num_blocks: int, block_size: int, *, max_num_seqs: int, max_num_batched_tokens: int,
                 stops: StopChecker, free_order=None, reservation: Reservation | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.stops = stops
        self.reservation = reservation or Reservation()
        self.allocator = self._make_allocator(num_blocks, free_order)
        self.waiting: deque[Request] = deque()  # arrival order
        self.running: list[Request] = []  # arrival order
        self.prompt_tokens_total = 0  # prompt tokens computed (cached ones excluded), for /metrics
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()  # FCFS order
        self._finished_seq_ids: list[int] = []  # for the next plan: the workers drop their state
        self._events: list[EngineEvent] = []  # recorded since ``take_events``
        self._ended: list[Request] = []  # ended while deciding the current plan

    def _make_allocator(self, num_blocks: int, free_order) -> BlockAllocator:
        return BlockAllocator(num_blocks, free_order)

    # -- requests in and out ---------------------------------------------------
    def new_seq(self, req: Request, token_ids: list[int], index: int, table: BlockTable | None = None) -> Sequence:
        """A sequence of ``req`` (completion ``index``) over ``table`` or a new empty one."""
        table = table or BlockTable(self.allocator, self.block_size)
        seq = Sequence(next(self._seq_ids), token_ids, table)
        req.seqs.append(seq)
        req.outputs[seq.seq_id] = CompletionOutput(index, "", [])
        return seq

    def add(self, request_id: str, prompt_token_ids: list[int], params, seed: int, prompt: str | None = None) -> Request:
        """Queue a new request behind every waiting one (FCFS) and return it; its first sequence
        holds the prompt. The caller has validated it (``Engine.check_request``)."""
        req = self._new_request(request_id, prompt, list(prompt_token_ids), params, seed, next(self._arrivals))
        self.new_seq(req, req.prompt_token_ids, index=0)
        self.waiting.append(req)
        return req

    def _new_request(self, *args) -> Request:
        return Request(*args)

    def abort(self, req: Request) -> None:
        """Stop ``req`` wherever it is and free its blocks now."""
        self._record("aborted", req)
        for seq in req.seqs:
            if not seq.is_finished:
                self.stops.finish(seq, req.outputs[seq.seq_id], "abort")
        self._retire(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def take_events(self) -> list[EngineEvent]:
        """The decisions recorded since the last call, oldest first (``events.py``)."""
        events, self._events = self._events, []
        return events

    def _record(self, kind: str, req: Request, seq: Sequence | None = None, **detail) -> None:
        self._events.append(EngineEvent(kind, req.request_id, None if seq is None else seq.seq_id, detail))

    def _record_growth(self, req: Request, seq: Sequence, first: int, cached: int = 0) -> None:
        """An ``allocated`` event for the blocks ``seq``'s table gained from index ``first`` on;
        its first ``cached`` of them came from the prefix cache."""
        blocks = seq.block_table.blocks
        if len(blocks) > first:
            self._record("allocated", req, seq, blocks=blocks[first + cached:], cached=blocks[first:first + cached])

    # -- one iteration -----------------------------------------------------------
    # --8<-- [start:schedule]
    def schedule(self) -> StepPlan:
        """Decide one iteration's plan (requests ended while deciding it come back from ``update``).

        Running groups go first, oldest first: each gets its pending tokens if
        the budgets allow (``_fit_to_budget``), after free blocks are made for
        them by evicting the newest running groups (``_evict``). Then, unless
        someone was evicted, waiting requests are admitted (``_admit``).
        """
        plan = self._empty_plan()
        plan.finished_seq_ids, self._finished_seq_ids = self._finished_seq_ids, []
        budget = Budget(tokens=self.max_num_batched_tokens, seqs=self.max_num_seqs)
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
        return plan
    # --8<-- [end:schedule]

    # --8<-- [start:update]
    def update(self, plan: StepPlan, results: dict, failed: dict | None = None) -> list[Request]:
        """Record what the workers sampled for ``plan`` (seq id -> ``SampleResult``); retire who finished.

        ``failed`` maps a request id to the exception its own processing raised
        before sampling (its grammar, its logits processors); a result may carry
        one too, and so may the request's own bookkeeping here. Each ends only
        that request (``fail``); the others go on.

        Returns the requests that advanced or ended in this iteration (those
        ended while scheduling first), each once.
        """
        failed = failed or {}
        touched = {r.request_id: r for r in self._ended}
        self._ended = []
        for req in list(self.running):
            error = failed.get(req.request_id) or next(
                (results[s.seq_id].error for s in req.seqs if s.seq_id in results and results[s.seq_id].error), None)
            if error is None:
                try:
                    if self._process(req, results):
                        touched[req.request_id] = req
                except Exception as e:  # the request's own bookkeeping (a beam score, a stop string)
                    error = e
            if error is not None:
                self.fail(req, error)
                touched[req.request_id] = req
            elif req.finished:
                self._retire(req)
        return list(touched.values())

    def fail(self, req: Request, error: BaseException) -> None:
        """End ``req`` with its own ``error`` (logged with its id) and free its blocks now."""
        if isinstance(error, RequestError):
            logger.warning("request %s failed: %s", req.request_id, error)
        else:
            logger.error("request %s failed", req.request_id, exc_info=error)
        req.error = error
        self._end(req, "error")
    # --8<-- [end:update]

    def _empty_plan(self) -> StepPlan:
        return StepPlan()

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
        this iteration's ``update`` reports it."""
        for seq in req.seqs:
            if not seq.is_finished:
                self.stops.finish(seq, req.outputs[seq.seq_id], reason)
        self._retire(req)
        self._ended.append(req)

    # --8<-- [start:admit]
    def _admit(self, plan: StepPlan, budget: Budget) -> None:
        """FCFS: start waiting requests while the budgets, the free blocks and the reservation
        policy allow. A request that cannot start blocks the ones behind it (no overtaking)."""
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
            if need > self.allocator.num_free or not self.reservation.reserve(req):
                return
            self.waiting.popleft()
            self._insert(self.running, req)
            self._record("admitted", req)
            self._give_slots(plan, req, work, budget)
    # --8<-- [end:admit]

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

    # -- after the forward pass ----------------------------------------------------
    def _process(self, req: Request, results: dict) -> bool:
        """Record the tokens ``req``'s sequences drew; True if any did."""
        drew = False
        for seq in list(req.seqs):
            if seq.seq_id in results:
                self.stops.record(seq, req.outputs[seq.seq_id], results[seq.seq_id], req.params)
                drew = True
        return drew

    def _retire(self, req: Request) -> None:
        """A finished or aborted request: free every block now, drop it from the queues."""
        for seq in req.seqs:
            seq.block_table.free()
            self._finished_seq_ids.append(seq.seq_id)
            self._record("finished", req, seq, reason=seq.finish_reason)
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.reservation.release(req)
