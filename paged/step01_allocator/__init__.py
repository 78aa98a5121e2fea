"""Step 01 — fixed-size KV blocks, the allocator and the waste it avoids (paper §3, §4.2).

Adds: ``BlockAllocator`` and its errors (``allocator``); the contiguous baseline
it replaces, a ``BuddyAllocator`` over token slots (``buddy``); and the paper's
Figure 2 accounting (``waste``) of one iteration-level FCFS schedule run with
paged blocks (``paging.simulate_paged``) and with Orca's three contiguous
reservation policies (``orca.simulate_orca``).
"""

from paged._lazy import lazy_package

# each name -> the module that defines it ("module:attribute" where the name differs)
_OWN = {
    "BlockAllocator": "allocator",
    "BlockAllocatorError": "allocator",
    "DoubleFreeError": "allocator",
    "InvalidBlockError": "allocator",
    "OutOfBlocksError": "allocator",
    "BuddyAllocator": "buddy",
    "RequestTooLargeError": "buddy",
    "InvalidTraceError": "waste",
    "TraceRequest": "waste",
    "WasteReport": "waste",
    "WasteSnapshot": "waste",
    "simulate_orca": "orca",
    "simulate_paged": "paging",
}
__all__, __getattr__, __dir__ = lazy_package(__name__, _OWN, below=None)
