"""Watching and stopping the workers, from the driver (paper §4.6).

``WorkerGroup`` is rank 0's handle on ranks 1..W-1 (``sharded_model.py`` creates it):
it broadcasts each plan, notices a worker that died or raised, names it, and
stops every process.

Faults (what must hold: a worker that dies or raises stops the engine with
an error naming the rank and the cause, every other process exits, and no
call hangs):

* a spawned worker sends its exception (with traceback) over its pipe and
  exits at once; its sockets close, so every peer blocked in a collective
  fails within milliseconds instead of waiting for a timeout;
* before each plan the driver polls the pipes and the processes' exit codes,
  and the heartbeats of the ranks on other hosts (a rank already lost is
  named at once, not after the plan's broadcast times out);
* after a failed collective it waits up to ``FAULT_GRACE_S`` for the worker
  at fault to show itself, prefers a model error over a death over a
  broken-connection error, stops every process, and raises ``WorkerError``;
* every collective is bounded (``group.DEFAULT_TIMEOUT``), start-up by
  ``init_timeout``; Ctrl-C stops the workers (they ignore SIGINT and leave it
  to the driver); ``stop()`` runs on ``close()``, on garbage collection and at
  interpreter exit, and a spawned worker exits when its driver process does.
"""

from __future__ import annotations

import atexit
import pickle
import signal
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import connection

import torch

from paged.step06_tensor_parallel.group import TPGroup, WorkerError, is_communication_error
from paged.step06_tensor_parallel.hosts import LOST_AFTER_S
from paged.step06_tensor_parallel.worker_loop import ERROR_KEY

FAULT_GRACE_S = 5.0  # after a failed collective: time for the worker at fault to report or die
STOP_TIMEOUT_S = 10.0  # a graceful stop, before the workers are terminated


@dataclass
class _Worker:
    rank: int
    process: object | None = None  # spawned here; None when torchrun started it (maybe elsewhere)
    conn: object | None = None  # our end of its pipe (spawned workers only)
    report: tuple | None = None  # its error report, once received
    host: str | None = None  # on another host: its address (and node), for the messages
    node: int | None = None
    lost: bool = False  # on another host: its heartbeat stopped

    def where(self) -> str:
        """``rank 1`` here, ``rank 1 on host 10.0.0.2 (node 1)`` across hosts."""
        return f"rank {self.rank}" + (f" on host {self.host} (node {self.node})" if self.host else "")


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class WorkerGroup:
    """The driver's handle on ranks 1..W-1: broadcast, fault detection, debug calls, stop.

    Args:
        workers: one entry per worker rank.
        store (torch.distributed.Store | None): the rendezvous store (torchrun workers leave their error
            reports there).
    """

    def __init__(self, workers: list[_Worker], store=None) -> None:
        self.workers, self.store = workers, store
        self.group: TPGroup | None = None  # rank 0's group, once every rank joined
        self.stopped: str | None = None  # why, once stopped
        self.threads_before: int | None = None  # rank 0's intra-op threads before it shared the cores
        self.heartbeats = None  # hosts.Heartbeats of the ranks on other hosts, once they joined
        atexit.register(_stop_at_exit, weakref.ref(self))

    @property
    def world_size(self) -> int:
        return len(self.workers) + 1

    # -- every iteration -----------------------------------------------------
    def send(self, message) -> None:
        """Broadcast a plan or a control message to every rank (after checking they are all alive)."""
        if self.stopped:
            raise WorkerError(f"the tensor-parallel workers are stopped ({self.stopped}); create a new engine")
        if self._poll() or self._remote_lost():
            self.fail(None)
        try:
            self.group.broadcast_object(message)
        except BaseException as exc:
            self.fail(exc)

    def _remote_lost(self) -> bool:
        """Whether a rank on another host is lost (its heartbeat stood still, confirmed by a fresh read).

        Asked before each plan: a plan sent into a cut link would only wait out the collective's timeout
        (``--distributed-timeout``, 300 s by default) before the same verdict.
        """
        return self.heartbeats is not None and bool(self.heartbeats.lost(confirm=True))

    def _poll(self, remote: bool = False) -> bool:
        """Collect error reports that arrived; True if some worker reported one or is dead."""
        bad = False
        for w in self.workers:
            if w.conn is not None and w.report is None:
                try:
                    while w.report is None and w.conn.poll():
                        msg = w.conn.recv()
                        w.report = msg if msg[0] == "error" else None
                except (EOFError, OSError):  # the pipe closed: the process is gone
                    pass
            elif remote and self.store is not None and w.report is None:
                key = ERROR_KEY.format(rank=w.rank)
                try:
                    if self.store.check([key]):
                        w.report = pickle.loads(self.store.get(key))
                except Exception:  # the store went away with the failure: nothing to read
                    pass
            dead = w.process is not None and w.process.exitcode is not None
            if remote and self.heartbeats is not None and w.host is not None and not w.lost:
                w.lost = w.rank in self.heartbeats.lost()
            bad |= w.report is not None or dead
        return bad

    # --8<-- [start:culprit]
    def _culprit(self) -> tuple[int, str, bool] | None:
        """(rank, cause, certain): a model error first, then a death or a lost host, then a broken connection."""
        reports = sorted((w.report for w in self.workers if w.report), key=lambda r: r[4])
        for _, rank, what, tb, _, from_collective in reports:
            if not from_collective:
                return rank, f"raised {what}\n--- traceback of rank {rank} ---\n{tb.rstrip()}", True
        for w in self.workers:
            if w.report is None and w.process is not None and w.process.exitcode is not None:
                return w.rank, f"(pid {w.process.pid}) {_describe_exit(w.process.exitcode)}", True
            if w.report is None and w.lost:
                return w.rank, (f"was lost: no heartbeat for {self.heartbeats.silent_for(w.rank):.0f} s "
                                "(the host is down, the process was killed or the link is cut)"), True
        if reports:
            return reports[0][1], f"raised {reports[0][2]}", False
        return None
    # --8<-- [end:culprit]

    def fail(self, exc: BaseException | None):
        """Stop every process and raise: ``WorkerError`` naming the rank at fault, else ``exc`` itself."""
        if isinstance(exc, KeyboardInterrupt):
            self.stop("interrupted", graceful=False)
            raise exc
        grace = FAULT_GRACE_S if exc is None or is_communication_error(exc) else 0.0
        if grace and self.heartbeats is not None:  # time for a silent host's counter to count as lost
            grace = max(grace, LOST_AFTER_S + 2.0)
        deadline, found, first_seen = time.monotonic() + grace, None, None
        while True:
            self._poll(remote=True)
            found = self._culprit()
            now = time.monotonic()
            if found and first_seen is None:
                first_seen = now
            # a certain culprit ends the search; a broken-connection report waits briefly for a better one
            if (found and (found[2] or now - first_seen > 0.5)) or now >= deadline:
                break
            time.sleep(0.02)
        self.stop("a worker failed" if found else f"the driver failed: {exc!r}", graceful=False)
        if found is not None:
            rank, cause, _ = found
            where = next(w.where() for w in self.workers if w.rank == rank)
            raise WorkerError(f"tensor-parallel worker {where} {cause}\n(all {self.world_size} "
                              "processes of the engine are stopped)", rank) from exc
        if exc is None:
            raise WorkerError("a tensor-parallel worker stopped without a report")
        if is_communication_error(exc):
            raise WorkerError(f"a tensor-parallel collective failed and no worker reported why: {exc}") from exc
        raise exc

    def barrier(self, timeout: timedelta | None = None) -> None:
        """Wait until every rank arrives; a rank that failed on the way is named (``fail``)."""
        try:
            self.group.barrier(timeout)
        except BaseException as exc:
            self.fail(exc)

    # -- start-up, debug calls -------------------------------------------------
    def wait_for(self, kind: str, timeout: timedelta) -> None:
        """Wait until every spawned worker sent ``(kind, rank)``; fail at once if one dies or raises."""
        pending = {w.rank: w for w in self.workers if w.conn is not None}
        deadline = time.monotonic() + timeout.total_seconds()
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                rank = min(pending)
                raise WorkerError(f"tensor-parallel worker rank {rank} sent no {kind!r} within "
                                  f"{timeout.total_seconds():.0f} s", rank)
            handles = [h for w in pending.values() for h in (w.conn, w.process.sentinel)]
            ready = connection.wait(handles, timeout=left)
            for w in list(pending.values()):
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        self.fail(None)
                    if msg[0] == "error":
                        w.report = msg
                        self.fail(None)
                    if msg[0] == kind:
                        del pending[w.rank]
                elif w.process.sentinel in ready:
                    self.fail(None)

    def fetch_kv(self, timeout_s: float = 60.0) -> dict:
        """Debug: each worker's ``(KV cache data, swap pool data or None)`` by rank (spawned workers)."""
        if any(w.conn is None for w in self.workers):
            raise RuntimeError("fetch_kv needs workers spawned by this process (a pipe to each)")
        self.send(("kv",))
        out = {}
        for w in self.workers:
            if not w.conn.poll(timeout_s):
                self.fail(None) if self._poll() else self.fail(TimeoutError(f"rank {w.rank} sent no KV"))
            msg = w.conn.recv()
            if msg[0] == "error":
                w.report = msg
                self.fail(None)
            out[w.rank] = pickle.loads(msg[2])
        return out

    def inject_fault(self, rank: int, text: str) -> None:
        """Debug: worker ``rank`` raises ``RuntimeError(text)`` at its next plan, mid-iteration."""
        self.send(("fault", rank, text))

    # -- the end ----------------------------------------------------------------
    def stop(self, reason: str = "closed", graceful: bool = True) -> None:
        """Stop every worker: a stop message first when ``graceful``, then SIGTERM, then SIGKILL."""
        if self.stopped:
            return
        self.stopped = reason
        if graceful and self.group is not None:
            try:
                self.group.broadcast_object(("stop",), timeout=timedelta(seconds=STOP_TIMEOUT_S))
            except Exception:
                graceful = False
        procs = [w.process for w in self.workers if w.process is not None]
        deadline = time.monotonic() + (STOP_TIMEOUT_S if graceful else 0.0)
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for w in self.workers:
            if w.conn is not None:
                w.conn.close()
        if self.heartbeats is not None:
            self.heartbeats.stop()
        if self.group is not None:
            self.group.close()
        if self.threads_before is not None:
            torch.set_num_threads(self.threads_before)

    def __del__(self):
        try:
            self.stop("garbage-collected", graceful=False)
        except Exception:
            pass


def _stop_at_exit(ref) -> None:
    group = ref()
    if group is not None:
        group.stop("interpreter exit")
