"""Across hosts: where the ranks live, how a headless host joins, how a lost host is named (paper §4.6).

The paper's Figure 4 puts one scheduler and one block manager on the driver
and lets the workers only execute. Nothing in that picture needs the workers
on the same machine: they need the plan and the activations, and
``torch.distributed`` carries both over TCP. This module adds what one
machine never needed.

* **Placement** (``Nodes``): W ranks over N hosts, W / N each, in rank order:
  node 0 holds ranks 0..W/N-1 (rank 0 is the driver), node 1 the next W/N, ...
  Everyone meets at ``master_addr:master_port``, where the driver's
  ``TCPStore`` listens.
* **Joining** (``serve_node``): a headless host starts its ranks; each one
  connects to the store (waiting for the driver if it is not up yet), leaves
  its address under ``HOST_KEY`` and starts beating. The driver waits for
  every rank of every node, bounded by ``join_timeout``, and names the node
  and the ranks that did not come (``wait_for_nodes``).
* **Addresses**: gloo listens on the address this host uses to reach the
  master (``address_towards``), not on whatever the hostname resolves to.
* **Losing a host** (heartbeats): each remote rank adds 1 to its
  ``BEAT_KEY`` counter every ``HEARTBEAT_S``; the driver samples the counters
  (``Heartbeats``). A rank whose counter stood still for ``LOST_AFTER_S`` is
  lost: after a failed collective the driver names it with its host, and
  before a plan it fails at once rather than send the plan into a cut
  link and wait out the collective's timeout (an idle server's next
  request after its remote host went silent). Counters,
  not timestamps: the two hosts' clocks need not agree. A remote rank whose
  store calls fail, or get no answer for ``DRIVER_LOST_S``, has lost the
  driver and exits.

What must hold: a remote rank killed or cut off mid-iteration ends every open
request with an error naming its rank and host, the driver stops, the remote
ranks exit, and no wait is unbounded (a cut link is noticed when the
collective's ``timeout`` expires; a killed rank at once).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import connection

import torch
import torch.distributed as dist

from paged.step06_tensor_parallel.group import WorkerError
from paged.step06_tensor_parallel.worker_loop import exit_with_parent, main_module_hidden, store_worker

HOST_KEY = "paged/host/{rank}"  # a remote rank's {"node", "address", "hostname", "pid"}, once it joined
BEAT_KEY = "paged/beat/{rank}"  # a remote rank's heartbeat counter
HEARTBEAT_S = 0.5  # how often a remote rank beats
LOST_AFTER_S = 3.0  # a counter standing still this long: the rank is lost (6 beats missed)
DRIVER_LOST_S = 6.0  # a remote rank whose store calls get no answer this long exits (slower: exiting is final)
DEFAULT_MASTER_PORT = 29501  # vLLM's default


@dataclass(frozen=True)
class Nodes:
    """W ranks over ``nnodes`` hosts meeting at ``master_addr:master_port`` (node 0 holds the driver)."""

    nnodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT

    def check(self, world_size: int, node_rank: int = 0) -> None:
        """Raise ``ValueError`` (what is wrong, the bound) unless the ranks split evenly over the nodes."""
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= node_rank < self.nnodes:
            raise ValueError(f"node rank must be in [0, {self.nnodes - 1}] for {self.nnodes} nodes, got {node_rank}")
        if world_size % self.nnodes:
            raise ValueError(f"tensor_parallel_size={world_size} does not split over {self.nnodes} nodes: "
                             "it must be a multiple of nnodes (every node holds the same number of ranks)")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master port must be in [1, 65535], got {self.master_port}")

    def ranks_of(self, node_rank: int, world_size: int) -> range:
        per = world_size // self.nnodes
        return range(node_rank * per, (node_rank + 1) * per)

    def node_of(self, rank: int, world_size: int) -> int:
        return rank // (world_size // self.nnodes)

    def headless_command(self, node_rank: int, world_size: int) -> str:
        return (f"python -m paged.serve --headless --tensor-parallel-size {world_size} --nnodes {self.nnodes} "
                f"--node-rank {node_rank} --master-addr {self.master_addr} --master-port {self.master_port}")


def address_towards(master_addr: str) -> str | None:
    """This host's IP on the route to ``master_addr`` (the master's own IP on the master), for gloo.

    ``None`` when ``GLOO_SOCKET_IFNAME`` is set: the user chose the interface, gloo uses it.
    A UDP ``connect`` sends nothing; it only asks the kernel which source address it would use.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(master_addr), 9))
        return s.getsockname()[0]


# -- the driver's side ------------------------------------------------------------
def wait_for_nodes(store, nodes: Nodes, world_size: int, timeout: timedelta) -> dict[int, dict]:
    """Wait until every rank of nodes 1..N-1 left its address in the store; returns them by rank.

    Raises:
        WorkerError: some did not join within ``timeout``; names the node, its ranks and the command
            that starts it.
    """

    remote = [r for n in range(1, nodes.nnodes) for r in nodes.ranks_of(n, world_size)]
    deadline, joined = time.monotonic() + timeout.total_seconds(), {}
    print(f"waiting up to {timeout.total_seconds():.0f} s for nodes 1..{nodes.nnodes - 1} (ranks "
          f"{remote[0]}..{remote[-1]}) to join at {nodes.master_addr}:{nodes.master_port}", file=sys.stderr, flush=True)
    while True:
        for r in remote:
            if r not in joined and store.check([HOST_KEY.format(rank=r)]):
                joined[r] = json.loads(store.get(HOST_KEY.format(rank=r)))
        missing = [r for r in remote if r not in joined]
        if not missing:
            return joined
        if time.monotonic() >= deadline:
            node = nodes.node_of(missing[0], world_size)
            ranks = [r for r in missing if nodes.node_of(r, world_size) == node]
            raise WorkerError(
                f"node {node} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}) did not join at "
                f"{nodes.master_addr}:{nodes.master_port} within {timeout.total_seconds():.0f} s; start it on its "
                f"host with: {nodes.headless_command(node, world_size)}", missing[0])
        time.sleep(0.1)


class Heartbeats:
    """The driver's view of the remote ranks' counters, sampled by a daemon thread every ``HEARTBEAT_S``."""

    def __init__(self, store, ranks: list[int]) -> None:
        self.store, self.ranks = store, ranks
        now = time.monotonic()
        self._seen = {r: (self._read(r), now) for r in ranks}  # rank -> (counter, when it last moved)
        self._stop = threading.Event()
        threading.Thread(target=self._sample, name="paged-heartbeats", daemon=True).start()

    def _read(self, rank: int) -> int:
        return self.store.add(BEAT_KEY.format(rank=rank), 0)

    def _sample(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                for r in self.ranks:
                    value = self._read(r)
                    if value != self._seen[r][0]:
                        self._seen[r] = (value, time.monotonic())
            except Exception:  # the store is closing with the engine
                return

    def silent_for(self, rank: int) -> float:
        """Seconds since ``rank``'s counter last moved."""
        return time.monotonic() - self._seen[rank][1]

    def lost(self, confirm: bool = False) -> list[int]:
        """The ranks silent for more than ``LOST_AFTER_S``.

        ``confirm``: read each such rank's counter again first, so a sampler that has not run lately (this
        process was paused, say) does not call a beating rank lost.
        """
        silent = [r for r in self.ranks if self.silent_for(r) > LOST_AFTER_S]
        for r in silent if confirm else ():
            try:
                value = self._read(r)
            except Exception:  # the store is closing with the engine: the view stands
                continue
            if value != self._seen[r][0]:
                self._seen[r] = (value, time.monotonic())
        return [r for r in silent if self.silent_for(r) > LOST_AFTER_S]

    def stop(self) -> None:
        self._stop.set()


# -- a headless host's side -----------------------------------------------------------
def _lost_driver(host: str, port: int, rank: int, why: str) -> None:
    print(f"rank {rank}: lost the driver at {host}:{port} ({why}); exiting", file=sys.stderr, flush=True)
    os._exit(1)


# --8<-- [start:beat]
def _beat(host: str, port: int, rank: int, stopping: threading.Event) -> None:
    """Add 1 to this rank's counter every ``HEARTBEAT_S``; exit the process once the driver is unreachable.

    Unreachable: a store call fails (the driver's process is gone), or none has answered for
    ``DRIVER_LOST_S`` (the link is cut: a store call then blocks whatever its timeout says, so a
    second thread watches the clock).
    """
    last = [time.monotonic()]

    def watch() -> None:
        while not stopping.wait(HEARTBEAT_S):
            silent = time.monotonic() - last[0]
            if silent > DRIVER_LOST_S and not stopping.is_set():
                _lost_driver(host, port, rank, f"its store has not answered for {silent:.0f} s")

    threading.Thread(target=watch, name="paged-driver-watch", daemon=True).start()
    try:
        store = dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=DRIVER_LOST_S))
        while not stopping.wait(HEARTBEAT_S):
            store.add(BEAT_KEY.format(rank=rank), 1)
            last[0] = time.monotonic()
    except Exception as exc:
        if not stopping.is_set():
            _lost_driver(host, port, rank, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
# --8<-- [end:beat]


def remote_rank_main(rank: int, world_size: int, nodes: Nodes, node_rank: int, path, dtype, device_type: str,
                     local_index: int, ranks_here: int, timeout_s: float, init_timeout_s: float,
                     join_timeout_s: float, spawned: bool = True) -> int:
    """One rank of a headless host: join, beat, obey the driver; returns (or, spawned, exits with) the code."""
    if spawned:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # serve_node handles Ctrl-C: it stops us
        exit_with_parent()
    init = timedelta(seconds=init_timeout_s)
    address = address_towards(nodes.master_addr)
    join = timedelta(seconds=join_timeout_s)  # waiting for the driver's store, and any later store call
    store = dist.TCPStore(nodes.master_addr, nodes.master_port, world_size, False, timeout=join)
    stopping = threading.Event()
    store.add(BEAT_KEY.format(rank=rank), 1)
    store.set(HOST_KEY.format(rank=rank), json.dumps({"node": node_rank, "address": address,
                                                      "hostname": socket.gethostname(), "pid": os.getpid()}))
    threading.Thread(target=_beat, args=(nodes.master_addr, nodes.master_port, rank, stopping), daemon=True).start()
    device = torch.device("cuda", local_index) if device_type == "cuda" else torch.device("cpu")
    code = store_worker(store, rank, world_size, path, dtype, device, timedelta(seconds=timeout_s), init,
                        ranks_here, address)
    stopping.set()
    if spawned:
        os._exit(code)
    return code


def serve_node(path, dtype, device_type: str, world_size: int, nodes: Nodes, node_rank: int,
               timeout: timedelta, init_timeout: timedelta, join_timeout: timedelta) -> int:
    """A headless host: run this node's ranks until they end; returns the exit code.

    One rank runs in this process; several are spawned, one process each. 0 when the driver stopped
    them all; 1 as soon as one failed (the others are stopped then); 128 + the signal number after
    SIGINT or SIGTERM (one rank: the signal ends the process).
    """
    nodes.check(world_size, node_rank)
    if node_rank == 0:
        raise ValueError("node 0 holds the driver (scheduler, block manager, HTTP server); a headless host "
                         f"has a node rank in [1, {nodes.nnodes - 1}]")
    ranks = list(nodes.ranks_of(node_rank, world_size))
    args = (world_size, nodes, node_rank, str(path), dtype, device_type)
    times = (timeout.total_seconds(), init_timeout.total_seconds(), join_timeout.total_seconds())
    if len(ranks) == 1:  # one rank: this process is it (no second interpreter to start)
        print(f"node {node_rank}: rank {ranks[0]} (pid {os.getpid()}) joins the driver at {nodes.master_addr}:"
              f"{nodes.master_port}", file=sys.stderr, flush=True)
        for s in (signal.SIGINT, signal.SIGTERM):  # end at once, even inside a collective: the driver names us
            signal.signal(s, signal.SIG_DFL)
        return remote_rank_main(ranks[0], *args, 0, 1, *times, spawned=False)
    ctx = torch.multiprocessing.get_context("spawn")
    procs = {}
    for i, r in enumerate(ranks):
        procs[r] = ctx.Process(target=remote_rank_main, name=f"paged-tp-rank{r}", daemon=True,
                               args=(r, *args, i, len(ranks), *times))
        with main_module_hidden():  # `python -m paged.serve` must not start again in each rank
            procs[r].start()
    print(f"node {node_rank}: ranks {', '.join(map(str, ranks))} (pids "
          f"{', '.join(str(p.pid) for p in procs.values())}) join the driver at {nodes.master_addr}:"
          f"{nodes.master_port}", file=sys.stderr, flush=True)
    signalled: list[int] = []

    def on_signal(signum, frame):
        signalled.append(signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)
    code = 0
    try:
        while procs and not signalled:
            connection.wait([p.sentinel for p in procs.values()], timeout=0.5)
            for r, p in list(procs.items()):
                if p.exitcode is not None:
                    del procs[r]
                    if p.exitcode != 0:
                        print(f"node {node_rank}: rank {r} exited with code {p.exitcode}; stopping this node",
                              file=sys.stderr, flush=True)
                        code = 1
            if code:
                break
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
    return 128 + signalled[0] if signalled else code
