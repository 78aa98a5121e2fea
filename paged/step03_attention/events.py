"""What the scheduler did in one iteration, as small records (``engine.events``).

The engine writes one ``EngineEvent`` for each decision that changes who holds
which KV block. After an iteration ``engine.events`` holds that iteration's
records, oldest first (with any ``aborted`` between the two iterations at the
front); observers added with ``engine.add_observer`` read them there. A live
view of the KV cache replays them; tests check them against the block tables.

Kinds and their ``detail``:

* ``admitted`` — a waiting request starts (again, after a recompute): ``{}``.
* ``allocated`` — a sequence's table grew: ``{"blocks": [ids], "cached": [ids]}``,
  ``blocks`` taken from the free list and ``cached`` mapped from the prefix
  cache (step04; hits come first in the table), each in table order.
* ``cow`` — copy-on-write before a write into a shared block (step04):
  ``{"src": block, "dst": block}``.
* ``preempted`` — a running group was evicted whole (step05):
  ``{"mode": "swap" | "recompute"}``.
* ``swapped_out`` / ``swapped_in`` — its blocks moved to / from host memory
  (step05): ``{"blocks": [(from, to)]}``, device then host ids for ``out``.
* ``finished`` — a sequence left the engine: ``{"reason": finish reason}``
  (``"dropped"`` for a beam nobody chose); its blocks are freed unless shared.
* ``aborted`` — ``engine.abort(request_id)`` stopped the request.

``seq_id`` is ``None`` for the events of a whole request (``admitted``,
``preempted``, ``swapped_*``, ``aborted``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

EVENT_KINDS = ("admitted", "allocated", "cow", "preempted", "swapped_out", "swapped_in", "finished", "aborted")


@dataclass(frozen=True)
class EngineEvent:
    """One scheduling decision (see the module docstring for the kinds)."""

    kind: str
    request_id: str
    seq_id: int | None = None
    detail: dict = field(default_factory=dict)
