"""The tensor-parallel group: one object that carries the collectives (paper §4.6; no hidden globals, docs/architecture.md).

Every process of a tensor-parallel engine holds a ``TPGroup``: its rank, the
world size and the ``torch.distributed`` process groups that connect it to
the others. The sharded layers receive it as an argument and call
``all_reduce`` / ``all_gather`` on it; nothing reads a global rank.

Two process groups, as in vLLM: ``pg`` carries the activations (NCCL between
GPUs, gloo on CPU) and ``cpu_pg`` (always gloo) carries the driver's plans as
pickled bytes. On CPU they are the same group. The groups are built from a
``TCPStore`` directly, not with ``init_process_group``: no default group
exists, so one Python process can hold several engines (the tests do), and
nothing global is left behind when an engine closes.

Bounded waits: every collective has a timeout (``timeout``, default 300 s),
so a stuck peer raises instead of hanging. The one exception is a worker
waiting for the driver's next plan: a server may sit idle for hours, so that
wait uses ``IDLE_TIMEOUT``; it still ends at once if the driver dies, because
the driver's sockets close.

Traffic: each group tallies, per kind of collective, the calls, the payload
bytes and the seconds this rank spent in them (``traffic``; two clock reads
per collective). The driver's tally is what ``python -m paged.bench
tp_network`` reports per iteration.

Invariants: all ranks call the same collectives in the same order (the plan
decides everything, and every rank runs the same plan); rank 0 is the driver.
"""

from __future__ import annotations

import pickle
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = timedelta(seconds=300)  # any one collective among working peers
IDLE_TIMEOUT = timedelta(days=7)  # a worker waiting for the driver's next plan


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_communication_error(exc: BaseException) -> bool:
    """Whether ``exc`` came from a collective (a peer vanished or timed out) rather than from the model."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "Timed out")
    )


@dataclass
class Tally:
    """One kind of collective on one rank: how often, how many payload bytes, how long it waited."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, nbytes: int, since: float) -> None:
        self.calls, self.bytes = self.calls + 1, self.bytes + nbytes
        self.seconds += time.perf_counter() - since


def _tallies() -> dict[str, Tally]:
    return {"all_reduce": Tally(), "all_gather": Tally(), "broadcast": Tally()}


@dataclass(eq=False)
class TPGroup:
    """This process's place among ``world_size`` tensor-parallel ranks, and its collectives.

    Attributes:
        rank: 0 for the driver (scheduler, block manager, sampling), 1..W-1 for workers.
        world_size: W, the number of shards.
        pg: process group for activations (None when W = 1).
        cpu_pg: gloo process group for plans and control messages (None when W = 1).
        timeout: bound on each collective.
        traffic: per kind (``all_reduce``, ``all_gather``, ``broadcast``), this rank's ``Tally``.
    """

    rank: int
    world_size: int
    pg: object | None = None
    cpu_pg: object | None = None
    timeout: timedelta = DEFAULT_TIMEOUT
    traffic: dict[str, Tally] = field(default_factory=_tallies)

    # -- what the sharded layers call -------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks, in place; returns ``x``."""
        if self.world_size > 1:
            t = time.perf_counter()
            dist.all_reduce(x, group=self.pg)
            self.traffic["all_reduce"].add(x.numel() * x.element_size(), t)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order (same shape on every rank)."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        t = time.perf_counter()
        dist.all_gather(parts, x.contiguous(), group=self.pg)
        self.traffic["all_gather"].add(x.numel() * x.element_size(), t)
        return torch.cat(parts, dim=dim)

    # -- what the driver and the workers call --------------------------------------
    def broadcast_object(self, obj: object = None, timeout: timedelta | None = None) -> object:
        """Rank 0 sends ``obj`` (pickled); every rank returns it.

        Two broadcasts over ``cpu_pg``: the payload's length (8 bytes), then the
        payload. ``timeout`` bounds the wait for the first one (workers pass
        ``IDLE_TIMEOUT`` there); the payload follows at once.
        """
        if self.world_size == 1:
            return obj
        t = time.perf_counter()
        if self.rank == 0:
            payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            size = torch.tensor([len(payload)], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size, timeout or self.timeout)
        if self.rank == 0:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(data, self.timeout)
        self.traffic["broadcast"].add(8 + data.numel(), t)
        return obj if self.rank == 0 else pickle.loads(data.numpy().tobytes())

    def barrier(self, timeout: timedelta | None = None) -> None:
        """Wait until every rank arrives (a one-element all-reduce over ``cpu_pg``)."""
        if self.world_size == 1:
            return
        opts = dist.AllreduceOptions()
        opts.timeout = timeout or self.timeout
        self.cpu_pg.allreduce([torch.zeros(1)], opts).wait()

    def _broadcast(self, t: torch.Tensor, timeout: timedelta) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, timeout
        self.cpu_pg.broadcast([t], opts).wait()

    def close(self) -> None:
        """Drop the connections (best effort: peers see them close and stop waiting)."""
        for pg in {id(p): p for p in (self.pg, self.cpu_pg) if p is not None}.values():
            try:
                pg.shutdown()
            except Exception:  # already broken by a dead peer: nothing left to close cleanly
                pass
        self.pg = self.cpu_pg = None


def connect(rank: int, world_size: int, store, device_type: str,
            timeout: timedelta = DEFAULT_TIMEOUT, address: str | None = None) -> TPGroup:
    """Join the ``world_size`` ranks that share ``store``: gloo for plans, NCCL (CUDA) or gloo for tensors.

    ``address`` is this rank's IP as the other hosts reach it (across hosts;
    ``hosts.address_towards``): gloo listens there. Without it gloo resolves
    this machine's hostname, which is right on one machine (or with
    ``GLOO_SOCKET_IFNAME`` set) but may name a loopback address other hosts
    cannot reach. Blocks until every rank has joined (bounded by the store's timeout).
    """
    cpu_store = dist.PrefixStore("paged/cpu", store)
    if address is None:
        cpu_pg = dist.ProcessGroupGloo(cpu_store, rank, world_size, timeout)
    else:
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout, opts._devices = timeout, [dist.ProcessGroupGloo.create_device(hostname=address)]
        cpu_pg = dist.ProcessGroupGloo(cpu_store, rank, world_size, opts)
    pg = cpu_pg
    if device_type == "cuda":
        if not dist.is_nccl_available():
            raise RuntimeError("tensor parallelism on CUDA needs NCCL, which this torch build lacks")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(dist.PrefixStore("paged/nccl", store), rank, world_size, opts)
    return TPGroup(rank, world_size, pg, cpu_pg, timeout)


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed; every process of the engine has been stopped.

    Attributes:
        rank: the rank at fault, or None when none could be named (a collective timed out).
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
