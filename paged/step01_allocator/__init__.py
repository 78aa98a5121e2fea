"""Step 01 — fixed-size KV blocks, the allocator and the waste it avoids (paper §3, §4.2).

Adds: ``BlockAllocator`` and its errors (``allocator``); the contiguous baseline
it replaces, a ``BuddyAllocator`` over token slots (``buddy``); and the paper's
Figure 2 accounting (``waste``) of one iteration-level FCFS schedule run with
paged blocks (``paging.simulate_paged``) and with Orca's three contiguous
reservation policies (``orca.simulate_orca``).
"""

from paged.step01_allocator.allocator import (
    BlockAllocator,
    BlockAllocatorError,
    DoubleFreeError,
    InvalidBlockError,
    OutOfBlocksError,
)
from paged.step01_allocator.buddy import BuddyAllocator, RequestTooLargeError
from paged.step01_allocator.orca import simulate_orca
from paged.step01_allocator.paging import simulate_paged
from paged.step01_allocator.waste import (
    InvalidTraceError,
    TraceRequest,
    WasteReport,
    WasteSnapshot,
)

__all__ = [
    "BlockAllocator",
    "BlockAllocatorError",
    "DoubleFreeError",
    "InvalidBlockError",
    "OutOfBlocksError",
    "BuddyAllocator",
    "RequestTooLargeError",
    "InvalidTraceError",
    "TraceRequest",
    "WasteReport",
    "WasteSnapshot",
    "simulate_orca",
    "simulate_paged",
]
