"""The live KV view behind ``GET /kv`` and ``GET /kv/snapshot``: snapshots taken on the engine thread.

The engine is owned by one thread (``async_engine.py``); HTTP handlers must not
read its block tables while a step mutates them. So the picture is taken on
that thread, between iterations, and handed over whole:

* ``observe`` is the engine's observer (``engine.add_observer``): after each
  iteration it appends the iteration's events (``engine.events``) to a bounded
  log and, when a reader has asked for a newer picture and the last one is old
  enough, replaces the snapshot (``engine.kv_snapshot()``: step05's pools,
  queues and tables). Both happen only while someone watches (a read in the
  last ``WATCH_TIMEOUT_S`` seconds), so an unwatched server pays one clock read
  per iteration.
* ``refresh`` is called by the engine loop when it goes idle, so the picture
  after the last step, or after an abort while idle, is never a stale one.
* ``read`` (on the event loop) returns the latest snapshot and the events newer
  than the reader's last one, as JSON text. It never touches the engine. The
  snapshot is encoded once, on the engine thread when it is taken, and every
  reader splices the same text. A reader that already holds the latest
  snapshot (``have`` = its number) gets only the new events.

What watching costs is kept small on three sides:

* **Snapshots on demand, one producer for every reader.** A snapshot is
  taken only after a read asked for one, so there are never more snapshots
  than reads, and none while idle. It is taken shortly (``READ_LEAD_S``)
  before the reader is due back, so the picture it gets then is fresh, not
  one poll interval old. The first read after a snapshot sets when the next
  is due; the reads that follow before it is taken share that one: a second
  page, or a reader that polls faster than it is told, can neither delay the
  next snapshot nor ask for more of them.
* **A CPU budget on the engine thread.** Each snapshot (reading the engine and
  encoding the JSON) is timed in the engine thread's CPU time; the next is not
  taken before ``cost / COST_BUDGET`` seconds have passed, so snapshots use at
  most ``COST_BUDGET`` (1 %) of the engine thread whatever the pool size, and
  never more than ``max_per_second`` a second.
* **Fewer updates while busy.** When the engine has been stepping without a
  pause for ``BUSY_AFTER_S``, every answer asks the reader to come back in
  ``BUSY_POLL_S`` instead of ``IDLE_POLL_S`` (``poll_ms``). A browser on the
  server's machine competes with the engine for the same cores, and its cost
  is per update (headless Chromium: about 25 ms of CPU for fetching and
  drawing one), so the rate is what can be cut. An idle engine, or one that
  just started, is still drawn four times a second, and the page says which
  rate it follows.

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

from fastapi.responses import HTMLResponse, Response

DEFAULT_MAX_PER_SECOND = 4.0  # most snapshots a second
DEFAULT_MAX_EVENTS = 500
WATCH_TIMEOUT_S = 5.0  # someone watches while a read came in the last this many seconds
COST_BUDGET = 0.01  # snapshots may use this share of the engine thread's time
IDLE_POLL_S = 0.25  # advised wait between reads while the engine is idle or just started
BUSY_POLL_S = 2.0  # ... and once it has been stepping without a pause for BUSY_AFTER_S
BUSY_AFTER_S = 0.5
READ_LEAD_S = 0.1  # a snapshot asked for is taken this long before the reader is expected back


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
        max_per_second: most snapshots taken per second.
        max_events: events kept for readers that poll.
        clock: seconds, monotonic (tests pass a fake one).
        cost_clock: CPU seconds of the calling thread, to time each snapshot (tests pass a fake one).
    """

    def __init__(self, engine, max_per_second: float = DEFAULT_MAX_PER_SECOND,
                 max_events: int = DEFAULT_MAX_EVENTS, clock=time.monotonic, cost_clock=time.thread_time) -> None:
        if max_per_second <= 0:
            raise ValueError(f"max_per_second must be > 0, got {max_per_second}")
        self.interval = 1.0 / max_per_second
        self.clock = clock
        self.cost_clock = cost_clock
        self.steps = 0
        self.num_events = 0
        self.cost_s = 0.0  # CPU seconds of the latest snapshot (reading the engine and encoding it)
        self.total_cost_s = 0.0
        self._events: deque[dict] = deque(maxlen=max_events)
        self._lock = threading.Lock()  # guards _events between the engine thread and readers
        self._last_read = -WATCH_TIMEOUT_S
        self._wanted = False  # a read came after the latest snapshot was taken
        self._wanted_at = 0.0  # ... and wants the next one from this time on
        self._stepping_since: float | None = None  # when the engine last started stepping after a pause
        self._taken = clock()
        self._published = (0, "")  # (number, JSON text) of the latest snapshot, replaced whole for readers
        self.refresh(engine)  # the first taken here, before the engine thread starts

    @property
    def watched(self) -> bool:
        return self.clock() - self._last_read < WATCH_TIMEOUT_S

    @property
    def number(self) -> int:
        """Snapshots taken so far: the latest one's number."""
        return self._published[0]

    @property
    def latest(self) -> str:
        """The latest snapshot's JSON text."""
        return self._published[1]

    @property
    def busy(self) -> bool:
        """Has the engine been stepping without a pause for ``BUSY_AFTER_S``?"""
        since = self._stepping_since
        return since is not None and self.clock() - since >= BUSY_AFTER_S

    @property
    def spacing(self) -> float:
        """The shortest time between two snapshots: the rate limit, or the CPU budget if that is longer."""
        return max(self.interval, self.cost_s / COST_BUDGET)

    # -- the engine thread --------------------------------------------------------------
    def observe(self, engine, plan, results) -> None:
        """The engine observer: log this iteration's events, and snapshot when one is asked for and due."""
        self.steps += 1
        if self._stepping_since is None:
            self._stepping_since = self.clock()
        if not self.watched:
            return
        events = getattr(engine, "events", ())
        if events:
            with self._lock:
                for event in events:
                    self.num_events += 1
                    self._events.append(event_view(event, self.num_events, self.steps))
        now = self.clock()
        if self._wanted and now >= self._wanted_at and now - self._taken >= self.spacing:
            self._snapshot(engine)

    def refresh(self, engine) -> None:
        """Take a snapshot now (the engine loop calls this when it goes idle: the pause ends ``busy``)."""
        self._stepping_since = None
        self._snapshot(engine)

    def _snapshot(self, engine) -> None:
        self._taken = self.clock()
        self._wanted = False
        start = self.cost_clock()
        number = self.number + 1
        text = json.dumps({**engine.kv_snapshot(), "number": number, "step": self.steps, "time": time.time()})
        self.cost_s = self.cost_clock() - start
        self.total_cost_s += self.cost_s
        self._published = (number, text)

    # -- readers (the event loop) ---------------------------------------------------------
    def read(self, since: int = 0, have: int = 0) -> str:
        """The logged events numbered above ``since`` and, unless ``have`` is the latest snapshot's number,
        that snapshot, as one JSON object's text.

        Besides the snapshot's keys (absent when ``"unchanged": true``): ``events``, ``last_event``,
        ``number`` (the latest snapshot's), ``busy``, ``poll_ms`` (when to read again) and ``cost``
        (the latest snapshot's CPU milliseconds, the total so far, and how many were taken).
        """
        self._last_read = now = self.clock()
        busy = self.busy
        poll_s = BUSY_POLL_S if busy else IDLE_POLL_S
        if not self._wanted:  # the first read since the latest snapshot sets when the next one is due;
            self._wanted_at, self._wanted = now + poll_s - READ_LEAD_S, True  # later reads share it
        number, latest = self._published  # one pair, whatever the engine thread does meanwhile
        with self._lock:
            events, last = [e for e in self._events if e["n"] > since], self.num_events
        tail = json.dumps({"events": events, "last_event": last, "busy": busy, "poll_ms": round(1000 * poll_s),
                           "cost": {"snapshot_ms": round(1e3 * self.cost_s, 3),
                                    "total_ms": round(1e3 * self.total_cost_s, 1), "snapshots": number}})
        if have == number:
            return f'{{"number": {number}, "unchanged": true, {tail[1:]}'
        return f"{latest[:-1]}, {tail[1:]}"  # both are JSON objects: one object with both's keys


def install(app, view: KVView) -> None:
    """Add ``GET /kv`` (the page) and ``GET /kv/snapshot`` (its data) to ``app``.

    The live view is for people watching the server, not part of the OpenAI API: not in the document.
    """

    @app.get("/kv", include_in_schema=False)
    async def kv_page():
        return HTMLResponse(page())

    @app.get("/kv/snapshot", include_in_schema=False)
    async def kv_snapshot(since: int = 0, have: int = 0):
        return Response(view.read(since, have), media_type="application/json")
