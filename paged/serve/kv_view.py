"""The live KV view behind ``GET /kv`` and ``GET /kv/snapshot``: snapshots taken on the engine thread.

The engine is owned by one thread (``async_engine.py``); HTTP handlers must not
read its block tables while a step mutates them. So the picture is taken on
that thread, between iterations, and handed over whole:

* ``observe`` is the engine's observer (``engine.add_observer``): after each
  iteration it appends the iteration's events (``engine.events``) to a bounded
  log and, at most ``max_per_second`` times a second, replaces the snapshot
  (``engine.kv_snapshot()``: step05's pools, queues and tables). Both happen
  only while someone watches (a read in the last ``watch_timeout_s``
  seconds), so an unwatched server pays one clock read per iteration.
* ``refresh`` is called by the engine loop when it goes idle, so the picture
  after the last step, or after an abort while idle, is never a stale one.
* ``read`` (on the event loop) returns the latest snapshot and the events newer
  than the reader's last one, as JSON text. It never touches the engine. The
  snapshot is encoded once, on the engine thread when it is taken (well under a
  millisecond with ``json``), and every reader splices the same text: FastAPI's
  own encoder would walk every list again per request, holding the GIL for
  milliseconds the engine thread needs.

Bounded: a snapshot has at most ``DEFAULT_MAX_CELLS`` cells per pool and lists
at most ``MAX_LISTED`` requests per queue; the log keeps the last
``max_events`` events. A snapshot carries ids and counts, never prompt or
output text.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from importlib import resources

DEFAULT_MAX_PER_SECOND = 4.0
DEFAULT_MAX_EVENTS = 500
WATCH_TIMEOUT_S = 5.0


def page() -> str:
    """The self-contained live page (HTML, CSS and script in one file shipped with the package)."""
    return resources.files("paged.serve").joinpath("static/kv.html").read_text(encoding="utf-8")


def event_view(event, number: int, step: int) -> dict:
    """One ``EngineEvent`` as plain data, numbered in the order the engine recorded it (ids and counts only)."""
    return {"n": number, "step": step, "kind": event.kind, "request_id": event.request_id,
            "seq_id": event.seq_id, "detail": dict(event.detail)}


class KVView:
    """The latest KV snapshot and recent events of one engine, for any number of readers.

    Args:
        engine: a step05-or-later engine (``kv_snapshot()``, ``events``); read on its own thread only.
        max_per_second: most snapshots taken per second while watched.
        max_events: events kept for readers that poll.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, engine, max_per_second: float = DEFAULT_MAX_PER_SECOND,
                 max_events: int = DEFAULT_MAX_EVENTS, clock=time.monotonic) -> None:
        self.interval = 1.0 / max_per_second
        self.clock = clock
        self.steps = 0
        self.num_events = 0
        self._events: deque[dict] = deque(maxlen=max_events)
        self._lock = threading.Lock()  # guards _events between the engine thread and readers
        self._last_read = -WATCH_TIMEOUT_S
        self._taken = clock()
        self.latest = self._take(engine)  # JSON text; the first taken here, before the engine thread starts

    @property
    def watched(self) -> bool:
        return self.clock() - self._last_read < WATCH_TIMEOUT_S

    # -- the engine thread --------------------------------------------------------------
    def observe(self, engine, plan, results) -> None:
        """The engine observer: log this iteration's events, and snapshot when one is due."""
        self.steps += 1
        if not self.watched:
            return
        events = getattr(engine, "events", ())
        if events:
            with self._lock:
                for event in events:
                    self.num_events += 1
                    self._events.append(event_view(event, self.num_events, self.steps))
        if self.clock() - self._taken >= self.interval:
            self.refresh(engine)

    def refresh(self, engine) -> None:
        """Take a snapshot now (the engine loop calls this when it goes idle)."""
        self._taken = self.clock()
        self.latest = self._take(engine)

    def _take(self, engine) -> str:
        return json.dumps({**engine.kv_snapshot(), "step": self.steps, "time": time.time()})

    # -- readers (the event loop) ---------------------------------------------------------
    def read(self, since: int = 0) -> str:
        """The latest snapshot and the logged events numbered above ``since``, as one JSON object's text."""
        self._last_read = self.clock()
        with self._lock:
            events, last = [e for e in self._events if e["n"] > since], self.num_events
        tail = json.dumps({"events": events, "last_event": last})
        return f"{self.latest[:-1]}, {tail[1:]}"  # both are JSON objects: one object with both's keys
