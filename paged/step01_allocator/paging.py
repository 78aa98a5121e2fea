"""vLLM's paged KV cache on the same schedule: blocks on demand (paper §4.2, §4.5).

The same iteration-level FCFS schedule as ``orca.py``, but the KV cache is cut
into fixed blocks of ``B`` token slots handed out by ``BlockAllocator``. A
request gets blocks for its prompt when admitted and one more block each time
its last block fills up, so it never reserves memory for tokens that do not
exist yet. The only waste it holds is the unused tail of its last block: at
most ``B - 1`` slots.

Because nothing is reserved ahead, the cache can run out mid-generation. Then,
as in vLLM (§4.5), the most recently admitted request is preempted: all its
blocks are freed at once and it goes back to the front of the queue, to be
recomputed (prompt plus the tokens it already generated) when memory frees up.

This loop is a second copy of the rules that step03's ``Scheduler`` runs for the
engine (FCFS admission, the newest request as the victim, no admission in an
iteration that preempted), kept apart on purpose: step01 comes first and imports
no later step, and it replays a trace of token counts (no model, no sampling,
no prompt chunking) to count slots, which step03's scheduler does not model. The
contiguous reservations it is compared with are one ledger for both this
simulator and the engine's Orca baseline (``orca.ContiguousReservations``).

Invariants: per live sequence, allocated slots minus stored tokens is at most
``B - 1``; at the end of the trace every block is free.

Extends: ``allocator`` (the blocks) and ``waste`` (the accounting).
"""

from __future__ import annotations

from collections import deque
from typing import Iterable, Sequence

from paged.step01_allocator.allocator import BlockAllocator
from paged.step01_allocator.waste import (
    InvalidTraceError,
    Observer,
    TraceRequest,
    WasteSnapshot,
    WasteReport,
    check_trace,
)


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` token slots: ceil(tokens / B)."""
    return -(-num_tokens // block_size)


class _Seq:
    __slots__ = ("request", "blocks", "length", "generated")

    def __init__(self, request: TraceRequest) -> None:
        self.request = request
        self.blocks: list[int] = []  # its block table: physical block ids
        self.length = 0  # tokens whose KV is stored: prompt + generated
        self.generated = 0


def simulate_paged(
    trace: Iterable[TraceRequest],
    kv_slots: int,
    block_size: int = 16,
    max_len: int | None = None,
    observer: Observer | None = None,
    free_order: Sequence[int] | None = None,
) -> WasteReport:
    """Run an iteration-level FCFS schedule over a paged KV cache.

    One iteration: every running sequence decodes one token, taking a new block
    when its last one is full (preempting the newest sequence when none is
    free); then, if nothing was preempted, waiting sequences are admitted in
    order while their prompt's blocks are free; then the slots are accounted;
    then finished sequences free their blocks.

    Args:
        trace: the requests, in arrival order (all present at time 0).
        kv_slots: capacity of the KV cache in token slots; it holds
            ``kv_slots // block_size`` blocks, the remainder is unusable.
        block_size: B, token slots per block.
        max_len: optional maximum sequence length to validate the trace against.
        observer: called with every iteration's ``WasteSnapshot`` (tests use it).
        free_order: initial free list of the allocator (tests shuffle it).

    Returns:
        The time-integrated waste, under the system name ``"paged"``.

    Raises:
        InvalidTraceError: a bad request, or one that alone needs more blocks
            than the cache holds (it could never finish).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    requests = check_trace(trace, max_len)
    allocator = BlockAllocator(kv_slots // block_size, free_order=free_order)
    for i, r in enumerate(requests):
        if blocks_for(r.total_len, block_size) > allocator.num_blocks:
            raise InvalidTraceError(
                f"request {i}: {r.total_len} tokens need {blocks_for(r.total_len, block_size)} "
                f"blocks of {block_size}; the cache holds only {allocator.num_blocks}"
            )
    waiting = deque(_Seq(r) for r in requests)
    running: list[_Seq] = []  # admission order: the newest is last
    report = WasteReport("paged")

    def preempt(victim: _Seq) -> None:
        for b in victim.blocks:
            allocator.free(b)
        victim.blocks = []
        running.remove(victim)
        waiting.appendleft(victim)  # first in line again (FCFS order kept)
        report.preemptions += 1

    while waiting or running:
        preempted = False
        # --8<-- [start:decode]
        for seq in list(running):
            if seq not in running:
                continue  # preempted earlier in this iteration
            if seq.length + 1 > len(seq.blocks) * block_size:  # last block full
                while allocator.num_free == 0 and seq in running:
                    preempt(running[-1])  # the newest goes, possibly seq itself
                    preempted = True
                if seq not in running:
                    continue
                seq.blocks.append(allocator.allocate())
            seq.length += 1
            seq.generated += 1
        # --8<-- [end:decode]
        while waiting and not preempted:  # FCFS admission, prefill + first token
            seq = waiting[0]
            need = blocks_for(seq.request.prompt_len + seq.generated + 1, block_size)
            if need > allocator.num_free:
                break
            waiting.popleft()
            seq.blocks = allocator.allocate_many(need)
            seq.generated += 1
            seq.length = seq.request.prompt_len + seq.generated
            running.append(seq)
        snap = _account(report.iterations, running, allocator, kv_slots, block_size, bool(waiting))
        report.add(snap)
        if observer is not None:
            observer(snap)
        for seq in [s for s in running if s.generated == s.request.output_len]:
            for b in seq.blocks:
                allocator.free(b)
            running.remove(seq)
            report.finished += 1
    return report


# --8<-- [start:account]
def _account(
    iteration: int,
    running: list[_Seq],
    allocator: BlockAllocator,
    kv_slots: int,
    block_size: int,
    blocked: bool,
) -> WasteSnapshot:
    tokens = reserved_future = never_used = 0
    for seq in running:
        held = len(seq.blocks) * block_size
        usable = min(held, seq.request.total_len)  # slots this sequence will fill
        tokens += seq.length
        reserved_future += usable - seq.length
        never_used += held - usable
    # Free blocks (and the slots past the last whole block) are unusable only
    # while a request waits for them in vain.
    unusable_free = kv_slots - allocator.num_used * block_size if blocked else 0
    return WasteSnapshot(iteration, len(running), tokens, reserved_future, never_used, unusable_free)
# --8<-- [end:account]
