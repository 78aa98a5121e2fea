"""Timing kernels on a GPU: CUDA events, a cold L2 before every run, the copy bandwidth as the ceiling.

Not a benchmark itself (no ``run``): ``kernel_gpu`` uses it.

* ``time_systems``: every system runs ``warmup`` times, then ``repeats`` timed
  rounds in which the systems take turns (so a clock change or a noisy
  neighbour hits all of them alike). On a GPU each run is bracketed by two CUDA
  events on the current stream and nothing synchronizes between runs; before
  each run a buffer larger than the L2 cache is overwritten, so a case whose
  K/V would fit in L2 (batch 8, context 64 is 10 MB; an H200 has 60 MB of L2)
  is still read from device memory, as it is in a real decode step; the flush
  also keeps the GPU busy while the host launches the timed call, so the host's
  launch overhead is not counted. On the CPU (the dry run) the wall clock is used.
* ``copy_bandwidth``: ``dst.copy_(src)`` of ``mib`` MiB, timed the same way;
  bytes moved = read + written. A kernel's achieved bandwidth (bytes it must
  read and write / its median time) is reported as a fraction of this.
"""

from __future__ import annotations

import statistics
import time

import torch

L2_FLUSH_BYTES = 256 * 2**20  # four times an H200's 60 MB of L2


def _flush_buffer(device: torch.device) -> torch.Tensor | None:
    if device.type != "cuda":
        return None
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)


def time_systems(systems: dict, repeats: int, warmup: int, device: torch.device) -> dict[str, list[float]]:
    """Milliseconds of each run of each callable: ``{name: [ms, ...]}`` (``repeats`` values each).

    Raises whatever a system raises; ``kernel_gpu`` runs each once beforehand to keep the ones that work.
    """
    flush = _flush_buffer(device)
    for _ in range(warmup):
        for fn in systems.values():
            fn()
    if device.type != "cuda":
        times = {name: [] for name in systems}
        for _ in range(repeats):
            for name, fn in systems.items():
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
        return times
    events = {name: [] for name in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            flush.zero_()  # evict the last run's data from L2 (not timed: it ends before `start`)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize(device)
    return {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in events.items()}


def median(values: list[float]) -> float:
    return statistics.median(values)


def copy_bandwidth(device: torch.device, mib: int, repeats: int, warmup: int) -> dict:
    """The device's copy bandwidth: ``{"mib", "ms", "gbps"}``, gbps counting bytes read plus written."""
    n = mib * 2**20
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = median(time_systems({"copy": lambda: dst.copy_(src)}, repeats, warmup, device)["copy"])
    return {"mib": mib, "ms": ms, "gbps": 2 * n / (ms * 1e-3) / 1e9}
