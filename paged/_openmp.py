"""OpenMP's wait policy, chosen before torch loads its OpenMP runtime: threads that sleep when idle.

torch's CPU kernels and ours run on OpenMP threads (libgomp). Between two
parallel regions, libgomp's threads spin by default (``GOMP_SPINCOUNT``
300 000 iterations) before they sleep; when another process is busy on the
machine, a spinning thread holds a core the thread it waits for needs, and
every region waits for the scheduler. On a 2-core machine with one other busy
process (AMD EPYC Zen 4, 2026-12-04), 32 tokens of the demo model took 10-20 s
that way, and 0.2 s with ``OMP_WAIT_POLICY=passive`` (threads sleep at once).

libgomp reads the variable once, when it is loaded (at ``import torch``), so
``choose_wait_policy`` runs from ``paged/__init__.py``, before any torch
import of ours: it sets ``passive`` unless the user chose a policy
(``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` set). When torch was imported before
``paged`` the choice is libgomp's already; then, on a machine where other
processes are busy, it says once how to choose.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

# One other process keeping a core busy half the time is enough to stall spinning threads.
BUSY_LOAD = 0.5
USER_KNOBS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def choose_wait_policy(environ: MutableMapping[str, str], torch_loaded: bool, load: float, cores: int) -> str | None:
    """Set ``OMP_WAIT_POLICY=passive`` in ``environ`` when it can still take effect and the user chose none.

    Args:
        environ: the process environment (``os.environ``), changed in place.
        torch_loaded: whether torch, and with it libgomp, is already loaded.
        load: the 1-minute load average.
        cores: the cores this process may run on.

    Returns:
        A line to print when the policy could not be chosen and other processes are busy, else None.
    """
    if any(knob in environ for knob in USER_KNOBS):
        return None
    if not torch_loaded:
        environ["OMP_WAIT_POLICY"] = "passive"
        return None
    if load < BUSY_LOAD:
        return None
    return (f"paged: other processes are busy here (load average {load:.1f} on {cores} cores), and torch was "
            "imported before paged, so its OpenMP threads spin while they wait; that can make generation "
            "many times slower. Set OMP_WAIT_POLICY=passive before importing torch (or import paged first).")


# libgomp's spins before an idle thread sleeps (about 100 000 a millisecond, its own estimate) that keep
# the second thread awake across a decode step's one-thread stretches: measured, 30 000 did and 10 000
# did not (SmolLM2, one stream, an AVX2 CPU; docs/benchmarks.md).
SPIN_ACROSS_A_STEP = 30_000


def threads_spin(environ: Mapping[str, str]) -> bool:
    """Whether libgomp's idle threads spin long enough to be woken at once, by ``environ`` as it was when
    torch loaded libgomp: ``GOMP_SPINCOUNT`` when set (``infinite``, or a count with an optional k, M,
    G or T), else ``OMP_WAIT_POLICY`` (``passive``, paged's default, sleeps at once; ``active`` and
    unset spin). Kernels then take a second thread for far smaller calls (``layers.SECOND_THREAD_BYTES``)."""
    count = environ.get("GOMP_SPINCOUNT", "").strip().lower()
    if count in ("infinite", "infinity"):
        return True
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(count[-1:], 1)
    digits = count[:-1] if scale > 1 else count
    if digits.isdigit():
        return int(digits) * scale >= SPIN_ACROSS_A_STEP
    return environ.get("OMP_WAIT_POLICY", "").strip().lower() != "passive"


def apply() -> None:
    """``choose_wait_policy`` for this process (``paged/__init__.py`` calls it once)."""
    try:
        load = os.getloadavg()[0]
        cores = len(os.sched_getaffinity(0))
    except (OSError, AttributeError):  # no load average (Windows), no affinity (macOS)
        load, cores = 0.0, os.cpu_count() or 1
    note = choose_wait_policy(os.environ, "torch" in sys.modules, load, cores)
    if note:
        print(note, file=sys.stderr)
