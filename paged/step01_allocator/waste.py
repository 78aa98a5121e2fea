"""Where the KV memory goes: the four states of a token slot (paper §3, Figure 2).

At any iteration of a serving system every slot of the KV cache is in one of
these states; the paper's Figure 2 reports the time-average share of each.

* ``token_states`` — holds the key and value of a token that exists already.
* ``reservation`` — set aside for a token the request *will* generate but has
  not yet: used eventually, useless now.
* ``internal_fragmentation`` — set aside for a request but never used by it
  (a reservation beyond the request's true final length, or the unused tail
  of its last paged block).
* ``external_fragmentation`` — not owned by any request's reservation, yet
  unusable: padding a buddy allocator adds to round a chunk up to a power of
  two, and free slots at an iteration where a request waits in the queue but
  the allocator cannot give it what it needs.

Free slots at an iteration where nobody waits are idle, not wasted: they are
left out of the accounting, whose shares are over *allocated-or-unusable*
memory.

Time averaging: a share is the sum over iterations of the slots in that state,
divided by the sum over iterations of all accounted slots (the ratio of the
time-averages), so the four shares sum to 1 exactly, and an almost empty
iteration at the end of a trace weighs as little as the memory it holds.

Invariants: each snapshot's four counts are >= 0; the shares sum to 1.

Extends: nothing; the schedules in ``orca.py`` and ``paging.py`` feed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

CATEGORIES = (
    "token_states",
    "reservation",
    "internal_fragmentation",
    "external_fragmentation",
)


class InvalidTraceError(ValueError):
    """A request of a trace cannot be simulated (bad lengths, larger than the cache)."""


@dataclass(frozen=True)
class TraceRequest:
    """One request of a length trace.

    Args:
        prompt_len: tokens of the prompt (>= 1).
        output_len: tokens the model will generate (>= 1). A real system does
            not know it in advance; only Orca (Oracle) is allowed to use it.
    """

    prompt_len: int
    output_len: int

    @property
    def total_len(self) -> int:
        """Slots the request's KV cache holds when it finishes."""
        return self.prompt_len + self.output_len


class WasteSnapshot(NamedTuple):
    """Slots in each state at one iteration, after the iteration's step."""

    iteration: int
    live: int  # sequences holding memory
    token_states: int
    reservation: int
    internal_fragmentation: int
    external_fragmentation: int


Observer = Callable[[WasteSnapshot], None]


@dataclass
class WasteReport:
    """Time-integrated slots per state for one system over one trace.

    Attributes:
        system: a name such as ``"paged"`` or ``"orca_max"``.
        slot_iterations: per state, the sum over iterations of its slots.
        iterations: how many iterations the schedule ran.
        finished: how many requests completed (the whole trace, when it ends).
        preemptions: how many times a running sequence was evicted (paged only).
    """

    system: str
    slot_iterations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    iterations: int = 0
    finished: int = 0
    preemptions: int = 0

    def add(self, snap: WasteSnapshot) -> None:
        """Account one iteration's snapshot."""
        for name in CATEGORIES:
            self.slot_iterations[name] += getattr(snap, name)
        self.iterations += 1

    # --8<-- [start:shares]
    def shares(self) -> dict[str, float]:
        """Each state's time-averaged share of allocated-or-unusable memory."""
        total = sum(self.slot_iterations.values())
        if total == 0:
            raise ValueError(f"{self.system}: no memory was ever accounted (empty trace?)")
        return {name: self.slot_iterations[name] / total for name in CATEGORIES}
    # --8<-- [end:shares]


def check_trace(trace: Iterable[TraceRequest], max_len: int | None = None) -> list[TraceRequest]:
    """Validate a trace for simulation; returns it as a list.

    Raises:
        InvalidTraceError: empty trace, a length < 1, or a request longer than
            ``max_len`` when one is given (the message names the request's
            index and the bound).
    """
    requests = list(trace)
    if not requests:
        raise InvalidTraceError("the trace has no requests")
    for i, r in enumerate(requests):
        if r.prompt_len < 1 or r.output_len < 1:
            raise InvalidTraceError(
                f"request {i}: prompt_len and output_len must be >= 1, got "
                f"{r.prompt_len} and {r.output_len}"
            )
        if max_len is not None and r.total_len > max_len:
            raise InvalidTraceError(
                f"request {i}: prompt_len + output_len = {r.total_len} exceeds "
                f"max_len = {max_len}"
            )
    return requests
