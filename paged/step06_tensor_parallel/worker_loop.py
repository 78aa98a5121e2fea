"""A tensor-parallel worker: ranks 1..W-1, the "GPU workers" of the paper's Figure 4 (§4.6).

A worker holds one shard of the weights and a ``KVCache`` with as many blocks
as the driver's but only its own KV heads, and it obeys: it waits for the
driver's next message on the broadcast, runs it, and waits again. It decides
nothing; the scheduler and the block manager exist only in the driver.

Messages, broadcast by rank 0 (the same to every rank):

    StepPlan                         swaps, copies, the forward pass (no sampling)
    ("init", N, B, N_host, backend, batch_invariant)  allocate the KV cache and the host swap pool
    ("kv",)                          debug: send this rank's KV cache and swap pool back
    ("fault", rank, text)            debug: rank ``rank`` raises ``RuntimeError(text)`` at its next plan
    ("stop",)                        return

Three ways to start one: spawned by the driver (``worker_main``; a pipe
carries error reports and debug replies back), by ``torchrun`` on another
machine (``torchrun_worker``), or by a headless host (``hosts.serve_node``);
the last two have no pipe and leave their error reports in the rendezvous
store (``store_worker``). Either way an exception is reported with the rank,
and the process exits at once, so its sockets close and every peer blocked in
a collective stops waiting.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from paged.step02_block_table import KVCache
from paged.step03_attention import StepPlan
from paged.step03_attention.backends import native_decode
from paged.step06_tensor_parallel.group import IDLE_TIMEOUT, TPGroup, connect, is_communication_error
from paged.step06_tensor_parallel.runner import ShardRunner
from paged.step06_tensor_parallel.sharding import load_shard

ERROR_KEY = "paged/error/{rank}"  # where a torchrun worker leaves its error report in the store


def error_report(rank: int, exc: BaseException) -> tuple:
    """``("error", rank, "Type: message", traceback, time, from_a_collective)``."""
    return ("error", rank, f"{type(exc).__name__}: {exc}", traceback.format_exc(), time.time(),
            is_communication_error(exc))


def make_runner(loaded, group: TPGroup, num_blocks: int, block_size: int, swap_blocks: int,
                backend: str, batch_invariant: bool = False) -> ShardRunner:
    """This rank's runner: a KV cache of ``N`` blocks with ``H_kv / W`` heads and its host swap pool."""
    cfg = loaded.config
    weight = next(loaded.model.parameters())
    kv = KVCache(cfg.num_layers, num_blocks, block_size, cfg.num_kv_heads // group.world_size,
                 cfg.head_dim, weight.dtype, weight.device)
    runner = ShardRunner(loaded.model, kv, backend, batch_invariant, host_blocks=swap_blocks)
    if backend in ("cpu", "cuda"):
        native_decode(backend)  # load (or build) the kernel now, not while the others wait in a collective
    return runner


# --8<-- [start:serve]
def serve(group: TPGroup, loaded, reply) -> None:
    """Obey the driver until it says stop. ``reply(message)`` sends to the driver (debug answers)."""
    runner, fault = None, None
    while True:
        msg = group.broadcast_object(timeout=IDLE_TIMEOUT)  # the next plan, however long the driver idles
        if isinstance(msg, StepPlan):
            if fault is not None:
                raise RuntimeError(fault)
            runner.execute(msg)  # memory ops, forward pass, LM head gather; rank 0 samples
        elif msg[0] == "init":
            runner = make_runner(loaded, group, *msg[1:])
            group.barrier()
        elif msg[0] == "kv":
            swap = runner.swap_cache.data if runner.swap_cache is not None else None
            reply(("kv", group.rank, pickle.dumps((runner.kv_cache.data.cpu(), swap))))
        elif msg[0] == "fault":
            fault = msg[2] if msg[1] == group.rank else fault
        elif msg[0] == "stop":
            return
        else:
            raise ValueError(f"unknown message {msg[0]!r} from the driver")
# --8<-- [end:serve]


@contextlib.contextmanager
def main_module_hidden():
    """While workers start, hide the driver's ``__main__`` from ``multiprocessing``'s spawn.

    Spawn re-runs the parent's main module in every child so that functions
    defined there can be unpickled. A worker needs nothing from it (its entry
    point is ``worker_main`` or ``hosts.remote_rank_main``), and re-running a script or a
    ``python -m`` entry point that is not guarded by
    ``if __name__ == "__main__":`` would start a second server, or a second
    engine, in each worker. Spawn reads ``__spec__`` and ``__file__`` once, in
    ``Process.start()``; both are restored right after.
    """
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)
        if "__spec__" not in saved:
            del main.__spec__


def share_cpu_cores(ranks_here: int) -> int:
    """Give this rank ``cores // ranks_here`` intra-op threads (at least 1); returns the old count.

    W ranks on one machine's CPU are W processes: left at the default (every
    core each), their OpenMP threads spin against one another and a forward
    pass runs several times slower than with one thread each.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // ranks_here))
    return before


def run(rank: int, world_size: int, store, path, dtype, device: torch.device, reply,
        timeout: timedelta, init_timeout: timedelta, ranks_here: int, address: str | None = None) -> None:
    """Join the group, load this rank's shard, wait for the others, then serve."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        share_cpu_cores(ranks_here)
    group = connect(rank, world_size, store, device.type, timeout, address)
    loaded = load_shard(path, dtype, device, group)
    group.barrier(init_timeout)  # every rank holds its shard
    serve(group, loaded, reply)


def exit_with_parent() -> None:
    """A spawned worker ends when its driver process ends, even if the driver was killed."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()


def worker_main(rank, world_size, port, path, dtype, device_type, conn, timeout_s, init_timeout_s,
                host: str = "127.0.0.1", address: str | None = None, ranks_here: int | None = None) -> None:
    """Entry point of a worker spawned by the driver (``torch.multiprocessing``, spawn).

    ``host:port`` is the driver's store; ``address`` this rank's IP for gloo (across hosts).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle: it stops us
    exit_with_parent()
    code = 0
    try:
        conn.send(("started", rank))
        init = timedelta(seconds=init_timeout_s)
        store = dist.TCPStore(host, port, world_size, False, timeout=init)
        device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
        run(rank, world_size, store, path, dtype, device, conn.send, timedelta(seconds=timeout_s), init,
            ranks_here=ranks_here or world_size, address=address)
    except BaseException as exc:  # report, then exit at once so the peers' sockets close
        code = 1
        try:
            conn.send(error_report(rank, exc))
        except Exception:
            pass
    os._exit(code)


def torchrun_worker(path, dtype, device_type: str, timeout: timedelta, init_timeout: timedelta) -> int:
    """Entry point of a worker started by ``torchrun`` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    Returns the exit code: 0 after the driver's stop, 1 after an error (reported to the store).
    """
    store, rank, world_size = next(dist.rendezvous("env://", timeout=init_timeout))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return store_worker(store, rank, world_size, path, dtype, device, timeout, init_timeout, ranks_here)


def store_worker(store, rank: int, world_size: int, path, dtype, device: torch.device, timeout: timedelta,
                 init_timeout: timedelta, ranks_here: int, address: str | None = None) -> int:
    """A worker with no pipe to the driver (torchrun, or a headless host): errors go to the store.

    Returns the exit code: 0 after the driver's stop, 1 after an error.
    """
    def reply(msg):
        raise RuntimeError("debug replies need a spawned worker (a pipe to the driver)")

    try:
        run(rank, world_size, store, path, dtype, device, reply, timeout, init_timeout, ranks_here, address)
        return 0
    except BaseException as exc:
        traceback.print_exc()
        try:
            store.set(ERROR_KEY.format(rank=rank), pickle.dumps(error_report(rank, exc)))
        except Exception:
            pass
        return 1
