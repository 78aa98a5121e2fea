"""A buddy allocator over an arena of token slots: the contiguous baseline (paper §3).

Before PagedAttention, a serving system stored each request's KV cache in one
contiguous chunk. The paper names the buddy allocator as the typical allocator
behind such chunks, and blames it for *external fragmentation*: memory that is
free but cut into pieces that no waiting request can use. This module is that
allocator, counted in token slots instead of bytes, so that step01's waste
accounting can compare it with fixed-size blocks on the same arena.

How it works: every block has a size of \\(2^k\\) slots and starts at a multiple
of its size. Allocating ``n`` slots takes the smallest free block of size
\\(\\ge n\\) rounded up to a power of two, halving it ("splitting") until it fits;
the halves it did not take stay free. Freeing a block merges it with its
*buddy* (the other half of the block it was split from, at ``offset ^ size``)
whenever the buddy is free too ("coalescing"), repeatedly.

A classic buddy allocator hands out the whole power-of-two block, so a chunk of
``n`` slots holds up to ``n - 1`` slots of padding. With ``exact=True`` (the
default) the tail past ``n`` is given back at once as smaller aligned blocks,
as Linux's ``alloc_pages_exact`` does; the chunk is then exactly ``n`` slots,
and freeing it frees those aligned pieces, which coalesce as usual. Orca
(Oracle) needs this: with padding, reserving exactly prompt + output would
cost precisely what Pow2 costs.

An arena whose capacity is not a power of two (the paper's 15 700 slots for
OPT-13B on an A100-40GB) is cut into *roots*, one per set bit of the capacity,
largest first: ``15700 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 16 + 4``.
Roots never merge with each other, so no allocation can exceed the largest.

Invariants (checked by ``tests/step01_allocator/test_buddy.py`` after every
operation):

* free and allocated blocks are disjoint and together cover the arena exactly;
* every free block is aligned: ``offset % size == 0``, ``size`` a power of two;
* fully coalesced: no free block's buddy is free with the same size;
* a failed call (too large, out of memory, unknown offset) changes nothing.

Extends: nothing; it is the baseline that step01's ``BlockAllocator`` beats.
"""

from __future__ import annotations

from bisect import bisect_right

from paged.step01_allocator.allocator import (
    BlockAllocatorError,
    DoubleFreeError,
    InvalidBlockError,
    OutOfBlocksError,
)


class RequestTooLargeError(BlockAllocatorError):
    """Raised when a request exceeds the largest block the arena can ever hold."""


def next_pow2(n: int) -> int:
    """The smallest power of two that is ``>= n`` (``n >= 1``)."""
    if n < 1:
        raise ValueError(f"next_pow2 needs n >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def _aligned_pieces(start: int, end: int) -> list[tuple[int, int]]:
    """Cut ``[start, end)`` into the fewest aligned power-of-two blocks."""
    pieces = []
    while start < end:
        size = start & -start if start else 1 << (end - start).bit_length()
        while size > end - start:  # the largest aligned block that still fits
            size //= 2
        pieces.append((start, size))
        start += size
    return pieces


class BuddyAllocator:
    """Power-of-two contiguous blocks of token slots, split and coalesced.

    Args:
        capacity: number of token slots in the arena (>= 0).
        exact: give the tail of a block past the requested size back at once
            (chunks of exactly ``n`` slots); ``False`` keeps the classic
            power-of-two padding.

    Examples:
        >>> a = BuddyAllocator(16)
        >>> a.allocate(3)            # 3 slots: split 16 -> 8 -> 4, take [0, 3)
        0
        >>> a.free_blocks()          # the tail slot 3 and the halves 4, 8 stay free
        [(3, 1), (4, 4), (8, 8)]
        >>> a.free(0)
        >>> a.free_blocks()          # coalesced back into one block
        [(0, 16)]
    """

    def __init__(self, capacity: int, exact: bool = True) -> None:
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be a non-negative int, got {capacity!r}")
        self.capacity = capacity
        self.exact = exact
        # One root per set bit of the capacity, largest first, so each root is
        # aligned to its own size (its offset is a sum of larger powers of two).
        self._root_offsets: list[int] = []
        self._root_sizes: list[int] = []
        offset = 0
        for k in reversed(range(capacity.bit_length())):
            if capacity >> k & 1:
                self._root_offsets.append(offset)
                self._root_sizes.append(1 << k)
                offset += 1 << k
        # Free blocks: one set of offsets per size (the "free lists"), plus the
        # reverse map offset -> size for O(1) buddy lookups while coalescing.
        self._free_by_size: dict[int, set[int]] = {}
        self._free_size: dict[int, int] = {}
        for off, size in zip(self._root_offsets, self._root_sizes):
            self._push_free(off, size)
        self._allocated: dict[int, int] = {}  # offset -> chunk size in slots

    # -- queries ------------------------------------------------------------
    @property
    def max_allocation(self) -> int:
        """The largest request that can ever succeed: the largest root."""
        return self._root_sizes[0] if self._root_sizes else 0

    @property
    def num_free(self) -> int:
        """Free slots, wherever they are (not necessarily usable together)."""
        return sum(self._free_size.values())

    @property
    def num_allocated(self) -> int:
        """Slots inside allocated chunks, including any power-of-two padding."""
        return sum(self._allocated.values())

    def size_of(self, offset: int) -> int:
        """Slots held by the chunk at ``offset`` (``n``, or ``next_pow2(n)`` if not exact)."""
        if offset not in self._allocated:
            raise InvalidBlockError(f"no chunk is allocated at offset {offset!r}")
        return self._allocated[offset]

    def free_blocks(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of every free block, by offset."""
        return sorted(self._free_size.items())

    def allocated_blocks(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of every allocated chunk, by offset."""
        return sorted(self._allocated.items())

    def roots(self) -> list[tuple[int, int]]:
        """``(offset, size)`` of the roots the arena was cut into."""
        return list(zip(self._root_offsets, self._root_sizes))

    def can_allocate(self, n: int) -> bool:
        """Whether ``allocate(n)`` would succeed now."""
        return self._smallest_free_at_least(next_pow2(n)) is not None if n >= 1 else False

    # -- operations ---------------------------------------------------------
    # --8<-- [start:allocate]
    def allocate(self, n: int) -> int:
        """Reserve ``n`` contiguous slots; returns the offset of their block.

        The block has ``next_pow2(n)`` slots: the padding is wasted until freed.

        Raises:
            ValueError: ``n < 1``.
            RequestTooLargeError: ``n`` exceeds ``max_allocation``.
            OutOfBlocksError: no free block is large enough right now.
        """
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"can only allocate a positive number of slots, got {n!r}")
        if n > self.max_allocation:
            raise RequestTooLargeError(
                f"{n} contiguous slots requested; the largest block this arena of "
                f"{self.capacity} slots can hold is {self.max_allocation}"
            )
        want = next_pow2(n)
        found = self._smallest_free_at_least(want)
        if found is None:
            raise OutOfBlocksError(
                f"no contiguous block of {want} slots is free ({self.num_free} of "
                f"{self.capacity} slots are free, in {len(self._free_size)} pieces)"
            )
        offset, size = found
        self._pop_free(offset, size)
        while size > want:  # split: keep the lower half, free the upper one
            size //= 2
            self._push_free(offset + size, size)
        if self.exact:  # give the tail [offset + n, offset + want) back
            for piece, piece_size in _aligned_pieces(offset + n, offset + want):
                self._release(piece, piece_size)
            size = n
        self._allocated[offset] = size
        return offset

    def free(self, offset: int) -> None:
        """Release the chunk at ``offset``, coalescing with free buddies."""
        if offset not in self._allocated:
            if offset in self._free_size:
                raise DoubleFreeError(f"the chunk at offset {offset} is already free")
            raise InvalidBlockError(
                f"no chunk starts at offset {offset!r} (arena of {self.capacity} slots)"
            )
        size = self._allocated.pop(offset)
        for piece, piece_size in _aligned_pieces(offset, offset + size):
            self._release(piece, piece_size)

    def _release(self, offset: int, size: int) -> None:
        """Free one aligned block, merging it with its buddy while that is free."""
        root_size = self._root_size_of(offset)
        while size < root_size:
            buddy = offset ^ size
            if self._free_size.get(buddy) != size:
                break  # buddy is (partly) allocated: stop merging here
            self._pop_free(buddy, size)
            offset, size = min(offset, buddy), size * 2
        self._push_free(offset, size)
    # --8<-- [end:allocate]

    # -- internals ----------------------------------------------------------
    def _smallest_free_at_least(self, want: int) -> tuple[int, int] | None:
        # Best fit by size, then lowest offset: deterministic and keeps large
        # blocks whole for as long as possible.
        for size in sorted(s for s, offs in self._free_by_size.items() if offs and s >= want):
            return min(self._free_by_size[size]), size
        return None

    def _root_size_of(self, offset: int) -> int:
        return self._root_sizes[bisect_right(self._root_offsets, offset) - 1]

    def _push_free(self, offset: int, size: int) -> None:
        self._free_by_size.setdefault(size, set()).add(offset)
        self._free_size[offset] = size

    def _pop_free(self, offset: int, size: int) -> None:
        self._free_by_size[size].remove(offset)
        del self._free_size[offset]

    def __repr__(self) -> str:
        return f"BuddyAllocator(capacity={self.capacity}, free={self.num_free})"
