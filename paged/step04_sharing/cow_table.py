"""Block tables that share blocks: fork and copy-on-write (paper §4.4, Figure 8).

When a sequence forks (parallel sampling, a beam that survives twice), the
child's table is a copy of the parent's: every physical block is now mapped by
two tables, so its reference count goes up, and no K/V is copied. The copy is
deferred to the first write: when a sequence is about to write into a block it
shares — always its last, partly filled block, since full blocks are never
written again — it takes a fresh block, asks for the old one's contents to be
copied there (a ``(src, dst)`` pair for the plan's ``blocks_to_copy``), and
drops its reference on the old one.

Invariants (``tests/step04_sharing``): a block's reference count equals the
number of table entries mapping it; a sequence never writes into a block whose
count is above one.

Extends: ``paged.step02_block_table.BlockTable`` (``append`` gains the
copy-on-write check; ``fork`` is new).
"""

from __future__ import annotations

from paged.step01_allocator import OutOfBlocksError
from paged.step02_block_table import BlockTable


class CowBlockTable(BlockTable):
    """A ``BlockTable`` whose blocks may be shared with other tables.

    ``append`` returns slots as before; any copy it needed is queued in
    ``pending_copies`` until the engine takes it (``take_copies``).
    ``reuse_cached`` False makes the prefix cache map none of its prompt's
    blocks (a request that wants prompt logprobs needs every prompt row computed).
    ``salt`` (its request's ``cache_salt``, else None) is the parent of its first
    block's prefix-cache name, so only tables of the same salt share cached blocks.
    """

    reuse_cached = True
    salt: str | None = None

    def __init__(self, allocator, block_size: int) -> None:
        super().__init__(allocator, block_size)
        self.pending_copies: list[tuple[int, int]] = []
        self.hashes: list[int] = []  # prefix-cache names of its leading full blocks (step04 caching)

    # --8<-- [start:fork]
    def fork(self) -> "CowBlockTable":
        """A child table mapping the same blocks; each block gains a reference."""
        child = type(self)(self.allocator, self.block_size)
        for block in self.blocks:
            self.allocator.incref(block)
        child.blocks = list(self.blocks)
        child.num_tokens = self.num_tokens
        child.hashes = list(self.hashes)
        return child
    # --8<-- [end:fork]

    def slots_for(self, n: int) -> int:
        """New blocks ``append(n)`` takes, counting a copy-on-write of the last block."""
        return super().slots_for(n) + int(n > 0 and self._last_is_shared_and_open())

    # --8<-- [start:append]
    def append(self, n: int) -> list[int]:
        """Slots for ``n`` new tokens; copy-on-write first if the last block is shared."""
        if n > 0 and self._last_is_shared_and_open():
            if self.allocator.num_free < self.slots_for(n):  # all or nothing
                raise OutOfBlocksError(
                    f"cannot append {n} tokens: needs {self.slots_for(n)} blocks "
                    f"(one for copy-on-write), {self.allocator.num_free} free"
                )
            old = self.blocks[-1]
            new = self.allocator.allocate()
            self.allocator.decref(old)  # still >= 1: another table maps it
            self.blocks[-1] = new
            self.pending_copies.append((old, new))
        return super().append(n)
    # --8<-- [end:append]

    def free(self) -> None:
        super().free()
        self.hashes = []

    def take_copies(self) -> list[tuple[int, int]]:
        """The ``(src, dst)`` copies queued since the last call, oldest first."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def _last_is_shared_and_open(self) -> bool:
        """The last block has room left and another table maps it too."""
        return (
            bool(self.blocks)
            and self.num_tokens % self.block_size != 0
            and self.allocator.ref_count(self.blocks[-1]) > 1
        )
