"""``AsyncEngine``: one thread owns the (not thread-safe) engine; asyncio handlers talk to it.

The engine is plain Python state mutated by ``step()``; two threads touching it
at once would corrupt block tables. So exactly one thread — the engine loop —
ever calls the engine. Handlers reach it through a command queue:

* ``add`` (a batch of requests, validated and queued atomically: all or none),
* ``abort`` (a client went away: its blocks are freed before the next step).

The loop drains commands, runs one ``step()`` if anything is unfinished, and
hands each step's outputs to the event loop in one ``call_soon_threadsafe``;
there they are routed to per-request ``asyncio.Queue`` s. With nothing to do it
sleeps on an ``Event`` (no busy spin); with work it steps back to back. The
event loop never runs a step, so a 100 ms forward pass never stalls HTTP.

Outputs are snapshotted (lists copied) on the engine thread: the engine keeps
appending to its own lists in the next step, while the handler reads the copy.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import replace

from paged import RequestError

logger = logging.getLogger("paged.serve")

STATS_INTERVAL_S = 0.05  # how often a busy loop refreshes the stats snapshot /metrics reads


class EngineDeadError(RuntimeError):
    """The engine raised inside ``step()``; its state can no longer be trusted."""


class StoppingError(RuntimeError):
    """The server is stopping: it admits no new request (``add``), or it ended a running one (``end_all``)."""


def describe(err: BaseException) -> str:
    """``WorkerError: tensor-parallel worker rank 1 ...``: what a client or the log is told."""
    return f"{type(err).__name__}: {err}"


def snapshot(out):
    """A copy of a ``RequestOutput`` the engine will not mutate any more."""
    comps = [replace(c, token_ids=list(c.token_ids),
                     logprobs=None if c.logprobs is None else list(c.logprobs)) for c in out.outputs]
    return replace(out, prompt_token_ids=out.prompt_token_ids, outputs=comps)


class AsyncEngine:
    """Runs ``engine.step()`` on a dedicated thread; requests and outputs cross via queues.

    Args:
        engine: the engine (``add_request``, ``abort``, ``step``, ``has_unfinished``, ``stats``).
        on_dead: called on the event loop with the exception once ``step()`` failed and every waiting
            request got the error (the server uses it to stop: a tensor-parallel engine whose worker
            died has stopped all its processes and cannot serve again).
    """

    def __init__(self, engine, on_dead=None) -> None:
        self.engine = engine
        self.on_dead = on_dead
        self.stats: dict = engine.stats()  # latest snapshot, replaced whole (atomic)
        self.dead: BaseException | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._streams: dict[str, asyncio.Queue] = {}  # touched on the event loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.stopping: str | None = None  # set by stop_admission: why ``add`` refuses from then on
        self.idle_observers: list = []  # fn(engine), on the engine thread when it runs out of work
        self.step_started = time.monotonic()  # when the current (or last) step() began: an iteration's start

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread on the running event loop (again after ``shutdown``: a lifespan may
        run several times, e.g. once per test, and the engine's state survives it)."""
        self._stop = False
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="paged-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def num_streams(self) -> int:
        """Engine requests whose outputs someone still waits for (running, waiting or swapped)."""
        return len(self._streams)

    def stop_admission(self, why: str) -> None:
        """From now on ``add`` raises ``StoppingError(why)``; what runs goes on (a graceful stop's first step)."""
        self.stopping = why

    def end_all(self, why: str) -> None:
        """End every request still running: each stream gets ``StoppingError(why)`` and is aborted."""
        err = StoppingError(why)
        for stream in set(self._streams.values()):
            stream.put_nowait(err)
        self.abort(list(self._streams))

    # -- called on the event loop ---------------------------------------------------
    async def add(self, requests: list[tuple[str, list[int], object, str | None, str, int]]) -> asyncio.Queue:
        """Queue ``(request_id, prompt_token_ids, params, prompt, client, priority)`` s; their outputs arrive on
        the queue.

        Raises:
            RequestError: the engine refused one of them (none is queued then).
            EngineDeadError: the engine failed earlier.
            StoppingError: the server is stopping (``stop_admission``).
        """
        if self.dead is not None:
            raise EngineDeadError(f"the engine failed and stopped: {describe(self.dead)}")
        if self.stopping is not None:
            raise StoppingError(self.stopping)
        stream: asyncio.Queue = asyncio.Queue()
        for rid, *_ in requests:
            self._streams[rid] = stream
        done = self._loop.create_future()
        self._send(("add", requests, done))
        try:
            await asyncio.shield(done)
        except BaseException:
            if not done.done() or done.exception() is None:  # cancelled while queueing: undo
                self.abort([r[0] for r in requests])
            for rid, *_ in requests:
                self._streams.pop(rid, None)
            raise
        return stream

    def abort(self, request_ids: list[str]) -> None:
        """Stop these requests and free their blocks before the next step (unknown ids are ignored)."""
        for rid in request_ids:
            self._streams.pop(rid, None)
        self._send(("abort", list(request_ids), None))

    def _send(self, command) -> None:
        self._commands.put(command)
        self._wake.set()

    def _deliver(self, outputs) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted meanwhile
            stream.put_nowait(out)
            if out.finished:
                del self._streams[out.request_id]

    def _fail_all(self, err: BaseException) -> None:
        for stream in set(self._streams.values()):
            stream.put_nowait(err)
        self._streams.clear()

    # -- the engine thread -------------------------------------------------------------
    def _run(self) -> None:
        engine, last_stats = self.engine, 0.0
        while not self._stop:
            if self._commands.empty() and not engine.has_unfinished():
                self._wake.wait()
            self._wake.clear()
            self._drain()
            if self._stop:
                break
            if engine.has_unfinished():
                try:
                    self.step_started = time.monotonic()
                    outputs = [snapshot(o) for o in engine.step()]
                except BaseException as err:  # a broken engine must not hang every client
                    logger.exception("engine step failed; the server stops accepting requests")
                    self.dead = err
                    self.stats = {**self.stats, "dead": True}
                    self._loop.call_soon_threadsafe(self._fail_all, EngineDeadError(describe(err)))
                    if self.on_dead is not None:
                        self._loop.call_soon_threadsafe(self.on_dead, err)
                    return
                if outputs:
                    self._loop.call_soon_threadsafe(self._deliver, outputs)
            now = time.monotonic()
            if now - last_stats >= STATS_INTERVAL_S or not engine.has_unfinished():
                self.stats, last_stats = engine.stats(), now
            if not engine.has_unfinished():
                for observe in self.idle_observers:
                    observe(engine)

    def _drain(self) -> None:
        while True:
            try:
                kind, arg, done = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._add(arg, done)
            else:
                for rid in arg:
                    self.engine.abort(rid)

    def _add(self, requests, done) -> None:
        engine, err = self.engine, None
        try:
            for i, (rid, ids, params, prompt, client, priority) in enumerate(requests):
                try:
                    engine.check_request(ids, params, priority)
                except RequestError as e:
                    raise (e.for_prompt(i) if len(requests) > 1 else e) from None
            for rid, ids, params, prompt, client, priority in requests:
                engine.add_request(rid, ids, params, prompt=prompt, client=client, priority=priority)
        except ValueError as e:
            err = e
            for rid, *_ in requests:  # all or nothing
                engine.abort(rid)
        self._loop.call_soon_threadsafe(_settle, done, err)


def _settle(fut: asyncio.Future, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
