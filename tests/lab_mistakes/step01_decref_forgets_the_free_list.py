"""Lab 01 with one mistake: ``decref`` counts down but never puts the block back on the free list."""

from paged.step01_allocator.allocator import BlockAllocator

allocate = BlockAllocator.allocate
free = BlockAllocator.free


def decref(self, block: int) -> bool:
    self._check_used(block)
    self._ref_count[block] -= 1
    return self._ref_count[block] == 0  # the mistake: the block is not appended to self._free
