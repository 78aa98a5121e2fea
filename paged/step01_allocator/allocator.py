"""Fixed-size physical KV blocks: a free list and reference counts (paper §4.2).

vLLM splits the KV cache into equal blocks, like an operating system splits
memory into pages. Because every block has the same size there is no external
fragmentation: any free block serves any request. This module is the page-frame
allocator of that analogy. It knows nothing about tensors or tokens; it only
hands out block ids ``0 .. num_blocks - 1`` and counts how many block-table
entries point at each one (sharing arrives in step04, but the count lives here).

Invariants (checked by ``tests/step01_allocator/test_allocator.py`` after every
operation):

* a block is either free (on the free list, count 0) or used (count >= 1), never both;
* ``num_free + num_used == num_blocks``;
* a failed call (out of blocks, double free, unknown id) changes nothing.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable


class BlockAllocatorError(Exception):
    """Base class of every error the allocator raises."""


class OutOfBlocksError(BlockAllocatorError):
    """Raised when more blocks are asked for than are free. Nothing was allocated."""


class InvalidBlockError(BlockAllocatorError):
    """Raised for an id outside ``0 .. num_blocks - 1``."""


class DoubleFreeError(BlockAllocatorError):
    """Raised when a block that is already free is freed or decremented again."""


class BlockAllocator:
    """O(1) allocation of fixed-size blocks with reference counts.

    Args:
        num_blocks: how many physical blocks the pool holds (>= 0).
        free_order: optional initial order of the free list (a permutation of
            ``range(num_blocks)``). Tests pass a shuffled order so that no code
            can silently rely on physical blocks being handed out in order.

    Examples:
        >>> a = BlockAllocator(4)
        >>> b = a.allocate()
        >>> a.incref(b)          # a second block-table entry now points at b
        >>> a.decref(b)          # one entry left: the block stays used
        False
        >>> a.decref(b)          # last entry gone: the block is free again
        True
    """

    def __init__(self, num_blocks: int, free_order: Iterable[int] | None = None) -> None:
        if not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        order = list(range(num_blocks)) if free_order is None else list(free_order)
        if sorted(order) != list(range(num_blocks)):
            raise ValueError("free_order must be a permutation of range(num_blocks)")
        self._free: deque[int] = deque(order)
        self._ref_count = [0] * num_blocks

    # -- queries ------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def ref_count(self, block: int) -> int:
        """How many block-table entries point at ``block`` (0 when free)."""
        self._check_id(block)
        return self._ref_count[block]

    def free_blocks(self) -> list[int]:
        """A copy of the free list, next block to be handed out first."""
        return list(self._free)

    def ref_counts(self) -> list[int]:
        """A copy of every block's reference count, block ``i`` at index ``i`` (for viewers)."""
        return list(self._ref_count)

    # -- operations ---------------------------------------------------------
    # --8<-- [start:operations]
    def allocate(self) -> int:
        """Take one free block; its reference count becomes 1."""
        if not self._free:
            raise OutOfBlocksError(
                f"out of KV blocks: all {self.num_blocks} blocks are in use"
            )
        block = self._free.popleft()
        self._ref_count[block] = 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """Take ``n`` blocks at once, or none: a failure allocates nothing."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > self.num_free:
            raise OutOfBlocksError(
                f"out of KV blocks: asked for {n}, only {self.num_free} of "
                f"{self.num_blocks} are free"
            )
        return [self.allocate() for _ in range(n)]

    def incref(self, block: int) -> None:
        """One more block-table entry points at a used block (sharing, step04)."""
        self._check_used(block)
        self._ref_count[block] += 1

    def decref(self, block: int) -> bool:
        """One entry less; returns True when the block became free."""
        self._check_used(block)
        self._ref_count[block] -= 1
        if self._ref_count[block] == 0:
            self._free.append(block)
            return True
        return False

    def free(self, block: int) -> None:
        """Release a block held by exactly one entry (the unshared case)."""
        self._check_used(block)
        if self._ref_count[block] != 1:
            raise BlockAllocatorError(
                f"block {block} is shared by {self._ref_count[block]} entries; "
                "use decref to drop one of them"
            )
        self.decref(block)
    # --8<-- [end:operations]

    # -- checks -------------------------------------------------------------
    def _check_id(self, block: int) -> None:
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise InvalidBlockError(
                f"block id {block!r} is outside 0..{self.num_blocks - 1}"
            )

    def _check_used(self, block: int) -> None:
        self._check_id(block)
        if self._ref_count[block] == 0:
            raise DoubleFreeError(f"block {block} is already free")

    def __repr__(self) -> str:
        return f"BlockAllocator(num_blocks={self.num_blocks}, free={self.num_free})"
