"""Step03's component for each idea the scheduler's loop asks about (docs/architecture.md).

The loop (``scheduler.py``) is written once; what a later step changes is one
of the components it holds, each answering one question:

=============  ==========================================  ===========================  =====================
component      the question                                step03 (here)                swapped in by
=============  ==========================================  ===========================  =====================
chunking       which tokens of a group run this iteration?  ``WholePrompt``: all of them  step05 ``ChunkedPrefill``
eviction       a group must make room: how?                 ``EndRequest``: end it        step05 ``Preemption``
admission      may the head of the queue start?             ``Reservation``: yes          Orca baselines (bench)
decoding       what do a group's draws do to it?            ``OneSequence``: record       step04 ``SequenceGroups``
order          who goes first, who is evicted first?        ``FirstComeFirstServed``      step05 ``FairShare``
=============  ==========================================  ===========================  =====================

The KV manager (``kv_manager.py``) is the sixth: it owns the blocks. A
component decides; the loop does (queues, plans, records), so every queue
change reads in one file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from paged.step03_attention.request import Request

logger = logging.getLogger("paged")


@dataclass
class Budget:
    """What is left of one iteration's budgets while the scheduler fills its plan."""

    tokens: int  # of max_num_batched_tokens
    seqs: int  # of max_num_seqs


# --8<-- [start:chunking]
class WholePrompt:
    """Chunking, step03: a group's pending tokens all at once (a whole prompt in one iteration),
    if the budgets allow; else not this iteration."""

    splits_prompts = False  # a prompt must fit max_num_batched_tokens (the engine refuses longer ones)

    def fit(self, req: Request, budget: Budget, plan) -> list | None:
        """``[(seq, tokens to compute)]`` for ``req`` this iteration, or None if the budgets say not now."""
        live = req.live_seqs
        counts = [s.num_pending for s in live]
        if not live or len(live) > budget.seqs or sum(counts) > budget.tokens:
            return None
        return list(zip(live, counts))
# --8<-- [end:chunking]


# --8<-- [start:eviction]
class EndRequest:
    """Eviction, step03: it cannot preempt, so the victim ends (``kv_cache_exhausted``) and its
    blocks are free at once."""

    def choose(self, req: Request, *, alone: bool, kv) -> str:
        """How ``req`` makes room: ``"swap"``, ``"recompute"`` or a finish reason to end it with."""
        logger.warning("KV cache exhausted: ended request %s (step05 adds preemption)", req.request_id)
        return "kv_cache_exhausted"
# --8<-- [end:eviction]


class Reservation:
    """Admission: what paged memory reserves for a request beyond its first blocks — nothing.

    The scheduler calls ``reserve(req)`` once, when ``req`` is about to start
    (its first blocks are free): False keeps it waiting (and, FCFS, everyone
    behind it); True means it starts now. It calls ``release(req)`` once, when
    ``req`` retires. A policy that reserves memory holds it in between (the
    Orca baselines, ``paged.bench.reservation``).
    """

    def reserve(self, req: Request) -> bool:
        return True

    def release(self, req: Request) -> None:
        pass


# --8<-- [start:order]
class FirstComeFirstServed:
    """Order, step03: the paper's first-come-first-served. The earlier arrival is served first and
    evicted last; a waiting request starts only when nobody is swapped out (who lost their room
    first get it back first).

    The scheduler keeps each queue in arrival order, tells ``moved`` every change of queue, and asks:
    ``rank(req)`` (smaller is served first, the largest is the victim), ``first(queue)`` (whom of a
    waiting or swapped queue to try next), ``waits(req, swapped)`` (must ``req``, about to be
    admitted, wait for the ``swapped`` requests to come back first?) and ``held_seqs(waiting)`` (how
    many of the iteration's sequence slots the running groups must leave for a waiting request).
    """

    def rank(self, req: Request) -> int:
        return req.arrival

    def first(self, queue) -> Request:
        return queue[0]  # the queue is in arrival order

    def waits(self, req: Request, swapped) -> bool:
        return bool(swapped)

    def held_seqs(self, waiting) -> int:
        return 0  # the running groups may take every sequence slot

    def moved(self, req: Request, old: str | None, new: str | None) -> None:
        """``req`` left queue ``old`` for ``new`` (None: none): FCFS needs no count of its own."""
# --8<-- [end:order]


# --8<-- [start:decoding]
class OneSequence:
    """Decoding, step03: one sequence per request; each drawn token is recorded (``StopChecker``)."""

    def new_request(self, *args) -> Request:
        return Request(*args)

    def after_slots(self, scheduler, req: Request, plan) -> None:
        """``req``'s tokens are in ``plan``: nothing more (step04 forks parallel samples here)."""

    def process(self, scheduler, req: Request, results: dict) -> bool:
        """Record the tokens ``req``'s sequences drew (seq id -> ``SampleResult``); True if any did."""
        drew = False
        for seq in req.seqs:
            if seq.seq_id in results:
                scheduler.stops.record(seq, req.outputs[seq.seq_id], results[seq.seq_id], req.params)
                drew = True
        return drew

    def end_early(self, scheduler, req: Request) -> None:
        """``req`` is ended before its sequences finished (evicted, failed): nothing to keep here."""
# --8<-- [end:decoding]
