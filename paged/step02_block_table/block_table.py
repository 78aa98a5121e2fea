"""A sequence's block table: logical KV blocks mapped to physical ones (paper §4.2–4.3, Figure 6).

The paper's analogy is an operating system's page table. A sequence sees its
KV cache as consecutive *logical* blocks 0, 1, 2, … of ``B`` tokens each; the
table says which *physical* block of the pool holds each of them. Physical
blocks come from the step01 ``BlockAllocator`` one at a time, only when the
last logical block is full, so a sequence never holds more than ``B - 1``
reserved-but-empty slots.

A token at position ``p`` lives in logical block ``p // B`` at offset
``p % B``; its *slot* is the flat index ``block * B + offset`` into the pool
seen as ``N * B`` token rows. The model runner writes each new token's K/V to
its slot (``KVCache.write``) and never sees logical blocks.

Invariants (checked by ``tests/step02_block_table/test_block_table.py`` after
every operation):

* ``len(blocks) == ceil(num_tokens / B)``: blocks are allocated on demand;
* ``filled(i) == B`` for every block but the last, which holds the rest
  (``num_tokens - (len(blocks) - 1) * B``): the paper's ``#filled`` column is
  *derived* from ``num_tokens``, never stored a second time;
* each entry of ``blocks`` holds one reference on the allocator;
* a failed call (out of blocks, bad argument) changes neither the table nor
  the allocator.

Extends: ``paged.step01_allocator.BlockAllocator`` (by composition). Plain
Python, no tensors: the scheduler side of the ``StepPlan`` split (docs/architecture.md).
"""

from __future__ import annotations

from collections import Counter

from paged.step01_allocator import BlockAllocator, DoubleFreeError, OutOfBlocksError


def _check_count(name: str, value: object) -> int:
    """``value`` as a non-negative int, or a TypeError / ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


# --8<-- [start:class]
class BlockTable:
    """Logical → physical block mapping of one sequence, with its token count.

    Args:
        allocator: the pool the physical blocks come from (shared by every
            sequence on the device).
        block_size: ``B``, tokens per block (>= 1); must match the ``KVCache``.

    Attributes:
        blocks: ``blocks[i]`` is the physical block of logical block ``i``.
        num_tokens: tokens whose slots have been handed out by ``append``.

    Examples:
        The paper's Figure 6, ``B = 4``, a 7-token prompt:

        >>> from paged.step01_allocator import BlockAllocator
        >>> table = BlockTable(BlockAllocator(8, free_order=[7, 1, 3, 0, 2, 4, 5, 6]), 4)
        >>> table.append(7)           # the prompt: two blocks
        [28, 29, 30, 31, 4, 5, 6]
        >>> table.append(1)           # "fathers" fills logical block 1
        [7]
        >>> table.append(1)           # "brought" needs a new block
        [12]
        >>> table.blocks, [table.filled(i) for i in range(3)]
        ([7, 1, 3], [4, 4, 1])
    """

    def __init__(self, allocator: BlockAllocator, block_size: int) -> None:
        if not isinstance(allocator, BlockAllocator):
            raise TypeError(f"allocator must be a BlockAllocator, got {type(allocator).__name__}")
        if _check_count("block_size", block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.allocator = allocator
        self.block_size = block_size
        self.blocks: list[int] = []
        self.num_tokens = 0

    # --8<-- [end:class]

    # -- queries ------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        """How many logical blocks the table maps (``ceil(num_tokens / B)``)."""
        return len(self.blocks)

    @property
    def capacity(self) -> int:
        """Tokens the mapped blocks can hold: ``num_blocks * B``."""
        return len(self.blocks) * self.block_size

    # --8<-- [start:filled]
    def filled(self, logical: int) -> int:
        """The paper's ``#filled`` of logical block ``logical``, derived from ``num_tokens``.

        Raises:
            IndexError: ``logical`` is not in ``0 .. num_blocks - 1``.
        """
        if isinstance(logical, bool) or not isinstance(logical, int):
            raise TypeError(f"logical block index must be an int, got {logical!r}")
        if not 0 <= logical < len(self.blocks):
            raise IndexError(
                f"logical block {logical} is outside 0..{len(self.blocks) - 1} "
                f"(the table maps {len(self.blocks)} blocks)"
            )
        return min(self.block_size, self.num_tokens - logical * self.block_size)

    # --8<-- [end:filled]

    # --8<-- [start:append]
    def slots_for(self, n: int) -> int:
        """How many new physical blocks ``append(n)`` would take. Changes nothing.

        The scheduler asks this before admitting a step, so it can compare the
        answer with ``allocator.num_free`` for all sequences of the batch at once.
        """
        _check_count("n", n)
        needed = -(-(self.num_tokens + n) // self.block_size)  # ceil division
        return max(0, needed - len(self.blocks))

    def append(self, n: int) -> list[int]:
        """Reserve slots for ``n`` new tokens, allocating blocks only when needed.

        Args:
            n: number of new tokens (a prefill chunk, or 1 for a decode step).

        Returns:
            The slot of each new token, oldest first: ``block * B + offset``.
            This is the ``slot_mapping`` that ``KVCache.write`` takes.

        Raises:
            OutOfBlocksError: the pool has fewer free blocks than needed. The
                table and the allocator are left exactly as they were.
        """
        new_blocks = self.slots_for(n)
        try:
            self.blocks += self.allocator.allocate_many(new_blocks)  # all or nothing
        except OutOfBlocksError as err:
            raise OutOfBlocksError(
                f"cannot append {n} tokens to a sequence of {self.num_tokens}: "
                f"needs {new_blocks} new blocks, {self.allocator.num_free} free ({err})"
            ) from err
        start, self.num_tokens = self.num_tokens, self.num_tokens + n
        b = self.block_size
        return [self.blocks[p // b] * b + p % b for p in range(start, self.num_tokens)]

    # --8<-- [end:append]

    def slot(self, position: int) -> int:
        """The slot of the token at ``position`` (``0 .. num_tokens - 1``).

        Raises:
            IndexError: ``position`` has no slot yet.
        """
        if isinstance(position, bool) or not isinstance(position, int):
            raise TypeError(f"position must be an int, got {position!r}")
        if not 0 <= position < self.num_tokens:
            raise IndexError(
                f"position {position} is outside 0..{self.num_tokens - 1} "
                f"(the table holds {self.num_tokens} tokens)"
            )
        b = self.block_size
        return self.blocks[position // b] * b + position % b

    # --8<-- [start:free]
    def free(self) -> None:
        """Drop this table's reference on every block; the table becomes empty.

        ``decref``, not ``free``: from step04 on a block may be shared, and it
        returns to the free list only when its last reference goes.

        Raises:
            DoubleFreeError: some block has fewer references than this table
                holds (it was released behind the table's back). Checked before
                anything is released, so nothing changes.
        """
        for block, count in Counter(self.blocks).items():
            if self.allocator.ref_count(block) < count:
                raise DoubleFreeError(
                    f"block {block} appears {count} times in the table but has "
                    f"{self.allocator.ref_count(block)} references; nothing was freed"
                )
        for block in self.blocks:
            self.allocator.decref(block)
        self.blocks = []
        self.num_tokens = 0

    # --8<-- [end:free]

    def __repr__(self) -> str:
        return (
            f"BlockTable(blocks={self.blocks}, num_tokens={self.num_tokens}, "
            f"block_size={self.block_size})"
        )
