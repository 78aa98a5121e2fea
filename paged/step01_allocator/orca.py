"""Orca with contiguous KV chunks: the three reservation policies (paper §3, §6.1).

Orca schedules at the granularity of iterations: after every decoding step,
finished requests leave the batch and waiting ones join (FCFS). Its KV cache is
still one contiguous chunk per request, reserved when the request is admitted,
because the request's final length is unknown and a contiguous tensor cannot
grow in place. The paper evaluates three ways of sizing that reservation:

* ``max`` — the model's maximum sequence length (2048 for OPT), always;
* ``pow2`` — the next power of two of the request's true total length, i.e.
  at most 2x too much (an idealised length predictor);
* ``oracle`` — exactly prompt + output, which no real system can know.

Each chunk comes from a ``BuddyAllocator``; by default it is exactly the size
reserved (the buddy gives the tail of its power-of-two block back), and with
``exact_chunks=False`` it is padded to a power of two like a classic buddy.
Nothing is preempted: a reservation is for the request's whole life.

The reservations themselves are one ledger, ``ContiguousReservations``: each
holder's chunks in a buddy arena, placed all or nothing, released together.
``simulate_orca`` keeps its trace's reservations there, and so does the
engine's Orca baseline (``paged.bench.reservation``): one Orca model.

Invariants: a request is admitted only when its whole reservation fits; at the
end of the trace every chunk is free and the arena is coalesced into its roots.

Extends: ``waste`` (the accounting) and ``buddy`` (the allocator).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from paged.step01_allocator.allocator import BlockAllocatorError
from paged.step01_allocator.buddy import BuddyAllocator, next_pow2
from paged.step01_allocator.waste import (
    InvalidTraceError,
    Observer,
    TraceRequest,
    WasteSnapshot,
    WasteReport,
    check_trace,
)

# --8<-- [start:policies]
ReservationPolicy = Callable[[TraceRequest, int], int]


def reserve_max(request: TraceRequest, max_len: int) -> int:
    """Orca (Max): reserve the maximum sequence length."""
    return max_len


def reserve_pow2(request: TraceRequest, max_len: int) -> int:
    """Orca (Pow2): the next power of two of the true length (capped at max_len)."""
    return min(next_pow2(request.total_len), max_len)


def reserve_oracle(request: TraceRequest, max_len: int) -> int:
    """Orca (Oracle): exactly the true length, prompt + output."""
    return request.total_len


POLICIES: dict[str, ReservationPolicy] = {
    "max": reserve_max,
    "pow2": reserve_pow2,
    "oracle": reserve_oracle,
}
# --8<-- [end:policies]


# --8<-- [start:ledger]
class ContiguousReservations:
    """Orca's memory: every holder's contiguous chunks in one buddy arena.

    Args:
        capacity: slots (or blocks) the arena spans.
        exact: ``BuddyAllocator(exact=...)``: False pads each chunk to a power of two.
    """

    def __init__(self, capacity: int, exact: bool = True) -> None:
        self.arena = BuddyAllocator(capacity, exact=exact)
        self.held: dict[object, list[int]] = {}  # holder -> offsets of its chunks

    def reserve(self, holder, chunks: int, size: int) -> bool:
        """Place ``chunks`` chunks of ``size`` for ``holder``, all or nothing; False (nothing placed)
        if the arena cannot hold them now. A holder reserves once, until ``release``."""
        if holder in self.held:
            raise ValueError(f"{holder!r} already holds a reservation")
        offsets = _place(self.arena, chunks, size)
        if offsets is None:
            return False
        self.held[holder] = offsets
        return True

    def release(self, holder) -> None:
        """Free ``holder``'s chunks (nothing if it holds none)."""
        for offset in self.held.pop(holder, []):
            self.arena.free(offset)

    def reserved(self, holder) -> int:
        """Slots held for ``holder``, buddy padding included (0 if none)."""
        return sum(self.arena.size_of(o) for o in self.held.get(holder, []))

    def could_ever_hold(self, chunks: int, size: int) -> bool:
        """Whether an empty arena of this capacity holds ``chunks`` chunks of ``size`` at once."""
        return _place(BuddyAllocator(self.arena.capacity, exact=self.arena.exact), chunks, size) is not None


def _place(arena: BuddyAllocator, chunks: int, size: int) -> list[int] | None:
    """Allocate ``chunks`` chunks of ``size``, all or nothing; their offsets or None."""
    offsets = []
    try:
        for _ in range(chunks):
            offsets.append(arena.allocate(size))
    except BlockAllocatorError:  # no room now, or a chunk larger than any root
        for o in offsets:
            arena.free(o)
        return None
    return offsets
# --8<-- [end:ledger]


class _Seq:
    __slots__ = ("request", "reserved", "offset", "length", "generated")

    def __init__(self, request: TraceRequest, reserved: int) -> None:
        self.request = request
        self.reserved = reserved  # slots the policy asked for
        self.offset = -1  # start of its buddy block
        self.length = 0  # tokens whose KV is stored: prompt + generated
        self.generated = 0


def simulate_orca(
    trace: Iterable[TraceRequest],
    kv_slots: int,
    policy: str,
    max_len: int = 2048,
    observer: Observer | None = None,
    exact_chunks: bool = True,
) -> WasteReport:
    """Run an iteration-level FCFS schedule with contiguous reservations.

    One iteration: every running request decodes one token; then waiting
    requests are admitted in order while the buddy allocator can place their
    reservation (an admitted request runs its prompt and emits its first token
    in the same iteration); then the slots are accounted; then finished
    requests release their chunk.

    Args:
        trace: the requests, in arrival order (all present at time 0).
        kv_slots: capacity of the KV cache in token slots.
        policy: ``"max"``, ``"pow2"`` or ``"oracle"``.
        max_len: the model's maximum sequence length.
        observer: called with every iteration's ``WasteSnapshot`` (tests use it).
        exact_chunks: ``BuddyAllocator(exact=...)``: False pads every chunk to
            a power of two (the padding counts as external fragmentation).

    Returns:
        The time-integrated waste, under the system name ``"orca_<policy>"``.

    Raises:
        InvalidTraceError: a bad request, or a reservation larger than the
            largest chunk the arena can hold (it could never be admitted).
        ValueError: an unknown policy.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown Orca policy {policy!r}; choose one of {sorted(POLICIES)}")
    reserve = POLICIES[policy]
    requests = check_trace(trace, max_len)
    ledger = ContiguousReservations(kv_slots, exact=exact_chunks)
    arena = ledger.arena
    waiting: deque[_Seq] = deque()
    for i, r in enumerate(requests):
        seq = _Seq(r, reserve(r, max_len))
        if seq.reserved > arena.max_allocation:
            raise InvalidTraceError(
                f"request {i}: Orca ({policy}) reserves {seq.reserved} slots, more than "
                f"the largest contiguous chunk ({arena.max_allocation}) of {kv_slots} slots"
            )
        waiting.append(seq)
    report = WasteReport(f"orca_{policy}")
    running: list[_Seq] = []
    while waiting or running:
        for seq in running:  # decode: write one more token into the reservation
            seq.length += 1
            seq.generated += 1
        while waiting and ledger.reserve(waiting[0], 1, waiting[0].reserved):  # FCFS admission
            seq = waiting.popleft()
            seq.offset = ledger.held[seq][0]
            seq.length = seq.request.prompt_len + 1  # prefill + first token
            seq.generated = 1
            running.append(seq)
        snap = _account(report.iterations, running, arena, kv_slots, bool(waiting))
        report.add(snap)
        if observer is not None:
            observer(snap)
        for seq in [s for s in running if s.generated == s.request.output_len]:
            ledger.release(seq)
            running.remove(seq)
            report.finished += 1
    return report


# --8<-- [start:account]
def _account(
    iteration: int, running: list[_Seq], arena: BuddyAllocator, kv_slots: int, blocked: bool
) -> WasteSnapshot:
    tokens = reserved_future = never_used = padding = 0
    for seq in running:
        tokens += seq.length
        reserved_future += seq.request.total_len - seq.length  # used later
        never_used += seq.reserved - seq.request.total_len  # over-reservation
        padding += arena.size_of(seq.offset) - seq.reserved  # buddy rounding
    # Free slots are unusable only while a request waits for them in vain.
    unusable_free = kv_slots - arena.num_allocated if blocked else 0
    return WasteSnapshot(
        iteration, len(running), tokens, reserved_future, never_used, padding + unusable_free
    )
# --8<-- [end:account]
