"""The scheduler: one loop, written once, holding one component per idea (paper §4.5; docs/architecture.md).

``Scheduler`` is an object of its own (the engine holds one): ``add(...)``
queues a request, ``schedule()`` returns the next ``StepPlan``, and
``update(plan, results)`` takes back what the workers sampled. It is plain
Python over plain data — sequences, block ids, queues — so it runs without a
model (``stand_in.py`` drives it in the tests).

One iteration (``schedule``), for every step of the ladder:

1. **running** groups get their pending tokens — decodes first, then prompt
   chunks, oldest first within each — while the budgets last. When the free
   blocks do not cover a group, the newest group not yet served is evicted
   until they do (the group itself, if it is the newest left);
2. unless someone was evicted, **swapped** groups come back, oldest first,
   while their blocks fit (step05 swaps groups out; before it, nobody is);
3. unless someone was evicted or is still swapped out, **waiting** requests
   are admitted first-come-first-served while the free blocks, the budgets
   and the admission component allow (a request that cannot start blocks the
   ones behind it).

"Oldest" and "newest" are the order component's words: first-come-first-served
(``policies.FirstComeFirstServed``, the paper's) ranks by arrival; step05's
``FairShare`` ranks the clients first, by how many requests each has running.

The loop holds, and a later step swaps, only components:

* ``kv`` — the KV manager, the one owner of blocks and tables (``kv_manager.py``;
  step04: fork, copy-on-write, prefix cache; step05: the host pool);
* ``chunking`` — which tokens of a group run now (``policies.WholePrompt``;
  step05: ``ChunkedPrefill``);
* ``eviction`` — how a victim makes room (``policies.EndRequest``; step05:
  ``Preemption``, by swap or recompute);
* ``admission`` — reservations beyond the first blocks (``policies.Reservation``;
  the Orca baselines reserve contiguous chunks);
* ``decoding`` — what a group's draws do to it (``policies.OneSequence``;
  step04: ``SequenceGroups``, parallel samples and beams);
* ``order`` — who goes first and who is evicted first
  (``policies.FirstComeFirstServed``; step05: ``FairShare``, across clients).

``build_scheduler`` is step03's composition; each later step's ``scheduler.py``
has its own.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections import deque

from paged.errors import RequestError
from paged.step02_block_table import Sequence, SequenceStatus
from paged.step03_attention.events import EngineEvent
from paged.step03_attention.kv_manager import KVManager
from paged.step03_attention.outputs import CompletionOutput
from paged.step03_attention.plan import StepPlan
from paged.step03_attention.policies import (Budget, EndRequest, FirstComeFirstServed, OneSequence, Reservation,
                                             WholePrompt)
from paged.step03_attention.request import Request, StopChecker

logger = logging.getLogger("paged")


class Scheduler:
    """FCFS iteration-level scheduling over a paged block pool (see the module docstring).

    Args:
        kv: the KV manager (the block pool and the tables).
        max_num_seqs: most sequences in one iteration.
        max_num_batched_tokens: most tokens in one iteration (prompts included).
        stops: decides when a sequence is done (``StopChecker``).
        chunking (WholePrompt | None): which tokens of a group run this iteration (default:
            ``policies.WholePrompt``; step05: ``ChunkedPrefill``).
        eviction (EndRequest | None): how a victim makes room (default: ``policies.EndRequest``;
            step05: ``Preemption``).
        admission (Reservation | None): reservations beyond the first blocks (default:
            ``policies.Reservation``).
        decoding (OneSequence | None): what a group's draws do to it (default: ``policies.OneSequence``;
            step04: ``SequenceGroups``).
        order (FirstComeFirstServed | None): who goes first and who is evicted first (default:
            ``policies.FirstComeFirstServed``; step05: ``FairShare``).
        sampling (paged.sampling.sampling_state.SamplingStates | None): the requests' logit-processing
            state, put into each plan as ``SamplingContext``s; None: no request processes logits.
    """

    def __init__(self, kv: KVManager, *, max_num_seqs: int, max_num_batched_tokens: int, stops: StopChecker,
                 chunking=None, eviction=None, admission=None, decoding=None, order=None,
                 sampling=None) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.stops = stops
        self.chunking = chunking or WholePrompt()
        self.eviction = eviction or EndRequest()
        self.admission = admission or Reservation()
        self.decoding = decoding or OneSequence()
        self.order = order or FirstComeFirstServed()
        self.sampling = sampling
        self.waiting: deque[Request] = deque()  # arrival order
        self.running: list[Request] = []  # arrival order
        self.swapped: deque[Request] = deque()  # arrival order (step05 swaps groups out)
        self.prompt_tokens_total = 0  # prompt tokens computed (cached ones excluded), for /metrics
        self.preemptions = {"swap": 0, "recompute": 0}  # for /metrics (step05 preempts)
        self._queues = {"waiting": self.waiting, "running": self.running, "swapped": self.swapped}
        self._seq_ids = itertools.count()
        self._arrivals = itertools.count()  # FCFS order
        self._released: list[int] = []  # seq ids for the next plan: the workers drop their state
        self._events: list[EngineEvent] = []  # recorded since ``take_events``
        self._ended: list[Request] = []  # ended while deciding the current plan
        self._failed: dict[str, BaseException] = {}  # request id -> its sampling state's failure

    # -- requests in and out ---------------------------------------------------
    def add(self, request_id: str, prompt_token_ids: list[int], params, seed: int, prompt: str | None = None,
            client: str = "", priority: int = 0) -> Request:
        """Queue a new request behind every waiting one (its arrival is the newest) and return it; its
        first sequence holds the prompt. ``client``: who sent it, ``priority``: its own rank (the order
        component may rank by either). The caller has validated it (``Engine.check_request``)."""
        req = self.decoding.new_request(request_id, prompt, list(prompt_token_ids), params, seed,
                                        next(self._arrivals))
        req.client, req.priority = client, priority
        self.new_seq(req, req.prompt_token_ids, index=0)
        self._move(req, "waiting")
        return req

    def new_seq(self, req: Request, token_ids: list[int], index: int, table=None) -> Sequence:
        """A sequence of ``req`` (completion ``index``) over ``table``, or over a new empty one."""
        seq = Sequence(next(self._seq_ids), token_ids, table or self.kv.new_table(req))
        req.seqs.append(seq)
        req.outputs[seq.seq_id] = CompletionOutput(index, "", [])
        return seq

    def abort(self, req: Request) -> None:
        """Stop ``req`` wherever it is and free its blocks now."""
        self._record("aborted", req)
        for seq in req.live_seqs:
            self.stops.finish(seq, req.outputs[seq.seq_id], "abort")
        self._retire(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def take_events(self) -> list[EngineEvent]:
        """The decisions recorded since the last call, oldest first (``events.py``)."""
        events, self._events = self._events, []
        return events

    # -- one iteration -----------------------------------------------------------
    # --8<-- [start:schedule]
    def schedule(self) -> StepPlan:
        """Decide one iteration's plan (requests ended while deciding it come back from ``update``)."""
        plan = StepPlan(finished_seq_ids=self._released)
        self._released = []
        held = self._held_seqs()
        budget = Budget(tokens=self.max_num_batched_tokens, seqs=self.max_num_seqs - held)
        evicted = self._schedule_running(plan, budget)
        budget.seqs += held
        if not evicted:  # no newcomer may take the room an older request just lost
            self._resume_swapped(plan, budget)
            self._admit_waiting(plan, budget)
        if self.sampling is not None:  # penalties, grammars: each sequence's context for the sampler
            self._failed = self.sampling.attach(plan, self.running)
        return plan
    # --8<-- [end:schedule]

    def _held_seqs(self) -> int:
        """The sequence slots kept out of the running groups' budget for a waiting request (the order
        component's ``held_seqs``), never so many that a running group has no room for its sequences:
        a group as wide as the rest would not run while the waiting request waited for its blocks, which
        that group holds — both would wait for ever."""
        held = self.order.held_seqs(self.waiting)
        if held:
            widest = max((len(r.live_seqs) for r in self.running), default=0)
            held = max(0, min(held, self.max_num_seqs - widest))
        return held

    # --8<-- [start:running]
    def _schedule_running(self, plan: StepPlan, budget: Budget) -> bool:
        """Give each running group its tokens: decodes first, then prompt chunks, oldest first within
        each. A group the free blocks do not cover gets them by evicting the newest group not yet
        served (or itself, if none is left). Returns whether anyone was evicted."""
        queue = deque(sorted(self.running, key=lambda r: (self._prefilling(r), self.order.rank(r))))
        evicted = False
        while queue:
            req = queue.popleft()
            work = self.chunking.fit(req, budget, plan)
            if work is None:
                continue
            while self.kv.blocks_needed(work) > self.kv.num_free:
                victim = max(queue, key=self.order.rank) if queue else req
                if victim is not req:
                    queue.remove(victim)
                self._evict(victim, plan)
                evicted = True
                if victim is req:
                    break
            else:
                self._give_slots(plan, req, work, budget)
        return evicted

    @staticmethod
    def _prefilling(req: Request) -> bool:
        """Whether a sequence of ``req`` has more than its newest token to compute (a prompt chunk,
        a recomputation): such groups run after the decodes."""
        return any(s.num_pending > 1 for s in req.live_seqs)
    # --8<-- [end:running]

    # --8<-- [start:evict]
    def _evict(self, req: Request, plan: StepPlan) -> None:
        """Take ``req`` off the device the way the eviction component chooses."""
        how = self.eviction.choose(req, alone=self.running == [req], kv=self.kv)
        if not isinstance(how, str) or not how:
            raise TypeError(f"the eviction component must answer 'swap', 'recompute' or a finish reason, "
                            f"got {how!r} for request {req.request_id}")
        if how == "swap":  # step05: its blocks move to the host pool, it waits in ``swapped``
            live = req.live_seqs
            self._count_preemption(req, how)
            moves = self.kv.swap_out(live)
            plan.blocks_to_swap_out.extend(moves)
            self._record("swapped_out", req, blocks=moves)
            for s in live:
                s.status = SequenceStatus.SWAPPED
            self._move(req, "swapped")
        elif how == "recompute":  # step05: its K/V is dropped; its tokens are computed again later
            self._count_preemption(req, how)
            for s in req.live_seqs:
                self.kv.free(s)
                s.status = SequenceStatus.WAITING
            self._move(req, "waiting")
        else:  # a finish reason: the request ends here
            self._end(req, how)
    # --8<-- [end:evict]

    def _count_preemption(self, req: Request, mode: str) -> None:
        self.preemptions[mode] += 1
        self._record("preempted", req, mode=mode)
        logger.debug("preempted %s by %s", req.request_id, mode)

    # --8<-- [start:resume]
    def _resume_swapped(self, plan: StepPlan, budget: Budget) -> None:
        """Swapped groups come back, oldest first, while the free blocks hold their blocks plus one
        per sequence for its next token (a group alone on the device needs only its blocks: if its
        next tokens then do not fit, it is evicted here, where waiting for room would never end)."""
        while self.swapped:
            req = self.order.first(self.swapped)
            live = req.live_seqs
            work = self.chunking.fit(req, budget, plan)  # the budgets as for any running group
            reserve = len(live) if self.running else 0
            if work is None or self.kv.distinct_blocks(live) + reserve > self.kv.num_free:
                return
            moves = self.kv.swap_in(live)  # step05's KV manager
            plan.blocks_to_swap_in.extend(moves)
            self._record("swapped_in", req, blocks=moves)
            self._move(req, "running")
            if self.kv.blocks_needed(work) <= self.kv.num_free:
                self._give_slots(plan, req, work, budget)
            elif self.running == [req]:
                self._evict(req, plan)
    # --8<-- [end:resume]

    # --8<-- [start:admit]
    def _admit_waiting(self, plan: StepPlan, budget: Budget) -> None:
        """Start waiting requests, first the one the order component names (FCFS: the oldest, and none
        while anybody is swapped out), while the budgets, the free blocks and the admission component
        allow. A request that cannot start blocks the ones behind it (no overtaking)."""
        while self.waiting:
            req = self.order.first(self.waiting)
            if self.order.waits(req, self.swapped):
                return
            work = self.chunking.fit(req, budget, plan)
            if work is None:
                return
            need = self.kv.blocks_needed(work)
            if need > self.kv.num_blocks:  # more than the whole pool
                logger.warning("request %s needs more KV blocks than the cache has (%d); ending it",
                               req.request_id, self.kv.num_blocks)
                self._end(req, "length")
                continue
            if need > self.kv.num_free or not self.admission.reserve(req):
                return
            self._move(req, "running")
            self._record("admitted", req)
            self._give_slots(plan, req, work, budget)
    # --8<-- [end:admit]

    # --8<-- [start:give_slots]
    def _give_slots(self, plan: StepPlan, req: Request, work: list, budget: Budget) -> None:
        """Give each sequence of ``req`` slots for its tokens and put them into the plan, then what
        they need first (copy-on-write). A sequence samples its next token only when none of its
        tokens is left without K/V (the last chunk of a prompt, or a decode)."""
        for seq, n in work:
            table = seq.block_table
            first, fresh = len(table.blocks), table.num_tokens == 0
            start, slots, cached = self.kv.allocate(seq, n)
            if fresh and not req.prompt_mapped:  # the prompt's first computation, not a recomputation
                req.num_cached_tokens, req.prompt_mapped = cached, True
            self._record_growth(req, seq, first, cached // self.block_size)
            seq.status = SequenceStatus.RUNNING
            # a decode feeds just the newest token: no need to build the whole token list
            tokens = [seq.last_token_id] if start == seq.num_tokens - 1 else seq.token_ids[start:table.num_tokens]
            self.prompt_tokens_total += max(0, min(table.num_tokens, seq.num_prompt_tokens) - start)
            plan.add(seq.seq_id, tokens, start, slots, table.num_tokens, table.blocks,
                     sample=table.num_tokens == seq.num_tokens, params=req.params, seed=req.seed)
            budget.tokens -= len(tokens)
            budget.seqs -= 1
        self.decoding.after_slots(self, req, plan)
        for seq in req.seqs:
            for src, dst in self.kv.take_copies(seq):
                plan.blocks_to_copy.append((src, dst))
                self._record("cow", req, seq, src=src, dst=dst)
    # --8<-- [end:give_slots]

    # -- after the forward pass ----------------------------------------------------
    # --8<-- [start:update]
    def update(self, plan: StepPlan, results: dict) -> list[Request]:
        """Record what the workers sampled for ``plan`` (seq id -> ``SampleResult``); retire who finished.

        What one request brings can fail only that request (``fail``): its
        sampling state (a grammar that met a limit, when ``schedule`` attached
        it), its row (``SampleResult.error``) or its own bookkeeping here (a
        beam score, a stop string). The others go on.

        Returns the requests that advanced or ended in this iteration (those
        ended while scheduling first), each once.
        """
        failed, self._failed = self._failed, {}
        touched = {r.request_id: r for r in self._ended}
        self._ended = []
        if self.sampling is not None:
            self.sampling.collect(self.running, results)
        for req in list(self.running):
            error = failed.get(req.request_id) or next(
                (results[s.seq_id].error for s in req.seqs if s.seq_id in results and results[s.seq_id].error), None)
            if error is None:
                try:
                    for seq in req.seqs:
                        self.kv.written(seq)
                    if self.decoding.process(self, req, results):
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

    # -- ending, retiring, queues ------------------------------------------------------
    def _end(self, req: Request, reason: str) -> None:
        """End every live sequence of ``req`` with ``reason`` and free its blocks now;
        this iteration's ``update`` reports it."""
        self.decoding.end_early(self, req)
        for seq in req.live_seqs:
            self.stops.finish(seq, req.outputs[seq.seq_id], reason)
        self._retire(req)
        self._ended.append(req)

    def release(self, req: Request, seq: Sequence) -> None:
        """``seq`` (finished) leaves the device: its blocks are freed, the workers told to drop it."""
        self.kv.free(seq)
        self._released.append(seq.seq_id)
        self._record("finished", req, seq, reason=seq.finish_reason)

    def _retire(self, req: Request) -> None:
        """A finished, ended or aborted request: free every block now, leave its queue."""
        for seq in req.seqs:
            self.release(req, seq)
        self._move(req, None)
        self.admission.release(req)

    def _move(self, req: Request, queue: str | None) -> None:
        """Take ``req`` out of the queue that holds it (one lookup: ``req.queue``) and into ``queue``
        (None: none), in arrival order — FCFS also across preemptions."""
        if req.queue is not None:
            self._queues[req.queue].remove(req)
        self.order.moved(req, req.queue, queue)
        req.queue = queue
        if queue is not None:
            q = self._queues[queue]
            if not q or q[-1].arrival < req.arrival:  # the newest (every new request): the end, at once
                q.append(req)
            else:
                q.insert(bisect.bisect([r.arrival for r in q], req.arrival), req)

    # -- records ---------------------------------------------------------------------
    def _record(self, kind: str, req: Request, seq: Sequence | None = None, **detail) -> None:
        self._events.append(EngineEvent(kind, req.request_id, None if seq is None else seq.seq_id, detail))

    def _record_growth(self, req: Request, seq: Sequence, first: int, cached: int) -> None:
        """An ``allocated`` event for the blocks ``seq``'s table gained from index ``first`` on;
        its first ``cached`` of them came from the prefix cache."""
        blocks = seq.block_table.blocks
        if len(blocks) > first:
            self._record("allocated", req, seq, blocks=blocks[first + cached:], cached=blocks[first:first + cached])

    def stats(self) -> dict:
        """Queue lengths, preemptions and prompt tokens computed, with the KV manager's usage."""
        seqs = [s for r in self.running for s in r.seqs]
        return {"running": len(self.running), "waiting": len(self.waiting), "swapped": len(self.swapped),
                "preemptions": dict(self.preemptions), **self.kv.usage(seqs),
                "prompt_tokens_total": self.prompt_tokens_total}


def build_scheduler(num_blocks: int, block_size: int, *, free_order=None, **scheduler_args) -> Scheduler:
    """Step03's scheduler: the loop over a ``KVManager`` with step03's components (``policies.py``).

    ``scheduler_args``: as ``Scheduler`` (the budgets, ``stops``, any component to swap).
    """
    return Scheduler(KVManager(num_blocks, block_size, free_order), **scheduler_args)
