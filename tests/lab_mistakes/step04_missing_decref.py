"""Lab 04 with one mistake: copy-on-write keeps this table's reference on the block it left."""

from paged.step01_allocator import OutOfBlocksError
from paged.step02_block_table import BlockTable
from paged.step04_sharing.cow_table import CowBlockTable

fork = CowBlockTable.fork


def append(self, n: int) -> list[int]:
    if n > 0 and self._last_is_shared_and_open():
        if self.allocator.num_free < self.slots_for(n):
            raise OutOfBlocksError(f"cannot append {n} tokens")
        old = self.blocks[-1]
        new = self.allocator.allocate()  # the mistake: no self.allocator.decref(old)
        self.blocks[-1] = new
        self.pending_copies.append((old, new))
    return BlockTable.append(self, n)
