"""Starting a tensor-parallel group: rank 0's shard and the workers that hold the others (paper §4.6).

``load_sharded(path, dtype, device, W)`` is how a tensor-parallel engine
begins. It refuses a split the model does not allow before any process
starts, opens a ``TCPStore`` on a loopback port the OS picks (port 0: never
a hard-coded one), spawns ranks 1..W-1 (``torch.multiprocessing``, spawn),
joins them in one group (gloo on CPU, NCCL on CUDA), loads rank 0's own
shard, and waits until every rank holds its shard — every wait bounded, and
a worker that fails on the way is named (``WorkerGroup.fail``). With
``launcher="torchrun"`` the ranks were started by ``torchrun`` instead,
possibly on other machines, and meet through ``MASTER_ADDR:MASTER_PORT``.
With ``nodes=Nodes(nnodes=N, master_addr=A, master_port=P)`` this process is
node 0 of N hosts: the store listens at ``A:P``, the other nodes' ranks join
from their hosts (``hosts.serve_node``) and are watched by heartbeats.

On a CPU, the W ranks of one machine share its cores: each gets
``cores // W`` intra-op threads (rank 0's count is restored when the group
stops).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from paged.models import LoadedModel, read_config
from paged.step06_tensor_parallel.group import DEFAULT_TIMEOUT, connect
from paged.step06_tensor_parallel.hosts import Heartbeats, Nodes, address_towards, wait_for_nodes
from paged.step06_tensor_parallel.sharding import check_shardable, load_shard
from paged.step06_tensor_parallel.worker_loop import main_module_hidden, share_cpu_cores, worker_main
from paged.step06_tensor_parallel.group import WorkerError
from paged.step06_tensor_parallel.worker_group import WorkerGroup, _Worker

DEFAULT_INIT_TIMEOUT = timedelta(minutes=30)  # start-up, including every rank loading its shard
DEFAULT_JOIN_TIMEOUT = timedelta(minutes=10)  # across hosts: the other nodes' ranks joining the store


@dataclass
class ShardedModel(LoadedModel):
    """A ``LoadedModel`` holding rank 0's shard, and the ``WorkerGroup`` holding the others."""

    workers: WorkerGroup | None = None


def _spawn(store, host: str, ranks: range, path, dtype, device_type: str, world_size: int, timeout: timedelta,
           init_timeout: timedelta, address: str | None = None) -> list[_Worker]:
    """Start ``ranks`` here; they meet the driver's store at ``host:store.port``."""
    ctx = torch.multiprocessing.get_context("spawn")
    workers = []
    for rank in ranks:
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=worker_main, name=f"paged-tp-rank{rank}", daemon=True,
                        args=(rank, world_size, store.port, str(path), dtype, device_type, theirs,
                              timeout.total_seconds(), init_timeout.total_seconds(), host, address,
                              len(ranks) + 1))
        with main_module_hidden():
            p.start()
        theirs.close()
        workers.append(_Worker(rank, p, ours))
    return workers


# --8<-- [start:load_sharded]
def load_sharded(path, dtype="auto", device="cpu", tensor_parallel_size: int = 2, *,
                 launcher: str = "spawn", timeout: timedelta = DEFAULT_TIMEOUT,
                 init_timeout: timedelta = DEFAULT_INIT_TIMEOUT, nodes: Nodes | None = None,
                 join_timeout: timedelta = DEFAULT_JOIN_TIMEOUT) -> ShardedModel:
    """Start a tensor-parallel group over checkpoint ``path``; returns rank 0's shard and the workers.

    Args:
        path (str | Path): Hugging Face checkpoint folder (every machine needs it at this path).
        dtype (str | torch.dtype): as ``paged.models.load_model``.
        device (str | torch.device): ``"cpu"`` (gloo) or ``"cuda"`` (NCCL; rank r uses GPU r, or ``LOCAL_RANK`` under torchrun).
        tensor_parallel_size: W >= 2.
        launcher: ``"spawn"`` (start W-1 local processes) or ``"torchrun"`` (they exist: this is RANK 0).
        timeout: bound on each collective (across hosts: how soon a cut link is noticed).
        init_timeout: bound on start-up (loading included).
        nodes: with ``nodes.nnodes > 1`` (spawn only), this is node 0: it spawns ranks 1..W/N-1 here, and
            the other nodes' ranks join from their hosts (``python -m paged.serve --headless``).
        join_timeout: how long to wait for the other nodes' ranks to join.

    Raises:
        ValueError: W does not divide the heads, KV heads or MLP width, or too few GPUs.
        WorkerError: a worker failed to start, naming its rank.
    """
    config = read_config(path)
    check_shardable(config, tensor_parallel_size)
    if tensor_parallel_size < 2:
        raise ValueError("load_sharded is for tensor_parallel_size >= 2; use paged.models.load_model")
    w, device = tensor_parallel_size, torch.device(device)
    nodes = nodes or Nodes()
    nodes.check(w)
    local, address = len(nodes.ranks_of(0, w)), None
    if launcher == "spawn":
        if device.type == "cuda" and torch.cuda.device_count() < local:
            raise ValueError(f"tensor_parallel_size={w} over {nodes.nnodes} node(s) needs {local} GPUs here; this "
                             f"machine has {torch.cuda.device_count()}")
        device = torch.device("cuda", 0) if device.type == "cuda" else device
        if nodes.nnodes == 1:  # one machine: a loopback port the OS picks
            host, port = "127.0.0.1", 0
        else:  # across hosts: the other nodes' ranks meet the store at MASTER_ADDR:MASTER_PORT
            host, port, address = nodes.master_addr, nodes.master_port, address_towards(nodes.master_addr)
        store = dist.TCPStore(host, port, w, True, timeout=init_timeout, wait_for_workers=False)
        handle = WorkerGroup(_spawn(store, host, range(1, local), path, dtype, device.type, w, timeout,
                                    init_timeout, address), store)
    elif launcher == "torchrun":
        if nodes.nnodes > 1:
            raise ValueError("under torchrun, torchrun places the ranks: pass nnodes to torchrun, not here")
        store, rank, world = next(dist.rendezvous("env://", timeout=init_timeout))
        if rank != 0 or world != w:
            raise ValueError(f"under torchrun the driver is RANK 0 of WORLD_SIZE={w}; got RANK={rank}, "
                             f"WORLD_SIZE={world}")
        handle = WorkerGroup([_Worker(r) for r in range(1, w)], store)
    else:
        raise ValueError(f"launcher must be 'spawn' or 'torchrun', got {launcher!r}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        local = local if launcher == "spawn" else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        handle.threads_before = share_cpu_cores(local)
    try:
        handle.wait_for("started", init_timeout)  # fails fast if a process cannot even import
        if nodes.nnodes > 1:
            joined = wait_for_nodes(store, nodes, w, join_timeout)
            handle.workers += [_Worker(r, host=j["address"], node=j["node"]) for r, j in sorted(joined.items())]
            handle.heartbeats = Heartbeats(store, sorted(joined))
        handle.group = connect(0, w, store, device.type, timeout, address)
        loaded = load_shard(path, dtype, device, handle.group)
    except BaseException as exc:
        if isinstance(exc, WorkerError):
            handle.stop("start-up failed", graceful=False)
            raise
        handle.fail(exc)
    handle.barrier(init_timeout)  # every rank holds its shard
    fields = {f.name: getattr(loaded, f.name) for f in dataclasses.fields(LoadedModel)}
    return ShardedModel(**fields, workers=handle)
# --8<-- [end:load_sharded]
