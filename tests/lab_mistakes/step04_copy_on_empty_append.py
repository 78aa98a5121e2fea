"""Lab 04 with one mistake: copy-on-write even when ``append(0)`` writes nothing."""

from paged.step01_allocator import OutOfBlocksError
from paged.step02_block_table import BlockTable
from paged.step04_sharing.cow_table import CowBlockTable

fork = CowBlockTable.fork


def append(self, n: int) -> list[int]:
    if self._last_is_shared_and_open():  # the mistake: `n > 0 and` is missing
        if self.allocator.num_free < self.slots_for(n) + (n == 0):
            raise OutOfBlocksError(f"cannot append {n} tokens")
        old = self.blocks[-1]
        new = self.allocator.allocate()
        self.allocator.decref(old)
        self.blocks[-1] = new
        self.pending_copies.append((old, new))
    return BlockTable.append(self, n)
