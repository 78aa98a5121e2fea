"""The KV picture of step05: the host swap pool and the swapped queue beside the device pool (paper §4.5).

A group swapped out keeps its sharing in host memory (``swap.py``): each
distinct device block became one host block, with the same reference counts.
So the host pool is drawn exactly like the device pool — cells owned by the
swapped requests, shared host blocks marked — and a request's block table
points into whichever pool holds it (``"pool": "host"`` while swapped).

With ``--tensor-parallel-size W`` the block manager and both allocators live
on the driver, so this one reading covers every rank.

Extends: ``paged.step04_sharing.snapshot.take_snapshot`` (one more queue and
one more pool, nothing re-read twice).
"""

from __future__ import annotations

from paged.step04_sharing import snapshot as step04_snapshot
from paged.step04_sharing.snapshot import DEFAULT_MAX_CELLS


def take_snapshot(engine, max_cells: int = DEFAULT_MAX_CELLS) -> dict:
    """``step04_snapshot.take_snapshot`` with the ``swapped`` queue and the ``host`` pool.

    Args:
        engine: a ``PreemptingEngine`` (or later), read between iterations.
        max_cells: most cells per pool (the aggregation rule of step04's snapshot).
    """
    queues = [("waiting", engine.waiting), ("running", engine.running), ("swapped", engine.swapped)]
    pools = [("device", engine.allocator), ("host", engine.swap.allocator)]
    return step04_snapshot.take_snapshot(engine, max_cells, queues=queues, pools=pools)
