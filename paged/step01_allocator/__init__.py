"""Step 01 — fixed-size KV blocks, the allocator and the waste it avoids (paper §3, §4.2).

Adds: ``BlockAllocator`` and its errors. Contiguous baselines and the Figure 2
waste accounting live beside it.
"""

from paged.step01_allocator.allocator import (
    BlockAllocator,
    BlockAllocatorError,
    DoubleFreeError,
    InvalidBlockError,
    OutOfBlocksError,
)

__all__ = [
    "BlockAllocator",
    "BlockAllocatorError",
    "DoubleFreeError",
    "InvalidBlockError",
    "OutOfBlocksError",
]
