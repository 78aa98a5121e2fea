"""BuddyAllocator: split, coalesce, no overlap (the contiguous baseline of paper §3).

The stateful machine allocates and frees random sizes in arenas whose capacity
is often not a power of two, in both modes (exact chunks and classic padding).
After every rule: free blocks and chunks tile the arena exactly (no overlap, no
gap); free blocks are aligned powers of two inside one root; the arena is fully
coalesced (no free block has a free buddy of its size). A failed call changes
nothing, and freeing every chunk gives back exactly the roots.
"""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from paged.step01_allocator import (
    BuddyAllocator,
    DoubleFreeError,
    InvalidBlockError,
    OutOfBlocksError,
    RequestTooLargeError,
)
from paged.step01_allocator.buddy import next_pow2


def _state(a: BuddyAllocator):
    return a.free_blocks(), a.allocated_blocks()


def _root_of(a: BuddyAllocator, offset: int):
    return next((o, s) for o, s in a.roots() if o <= offset < o + s)


class BuddyMachine(RuleBasedStateMachine):
    @initialize(capacity=st.one_of(st.integers(0, 300), st.sampled_from([16, 64, 256])),
                exact=st.booleans())
    def start(self, capacity, exact):
        self.arena = BuddyAllocator(capacity, exact=exact)
        self.chunks: dict[int, int] = {}  # shadow: offset -> slots requested

    def _unchanged_after(self, error, call, *args):
        before = _state(self.arena)
        with pytest.raises(error):
            call(*args)
        assert _state(self.arena) == before

    @rule(n=st.integers(1, 320))
    def allocate(self, n):
        a = self.arena
        if n > a.max_allocation:
            self._unchanged_after(RequestTooLargeError, a.allocate, n)
            return
        fits = any(size >= next_pow2(n) for _, size in a.free_blocks())
        assert a.can_allocate(n) == fits
        if not fits:
            self._unchanged_after(OutOfBlocksError, a.allocate, n)
            return
        offset = a.allocate(n)
        assert offset % next_pow2(n) == 0, "a chunk must start at its buddy block's alignment"
        assert a.size_of(offset) == (n if a.exact else next_pow2(n))
        self.chunks[offset] = n

    @precondition(lambda self: self.chunks)
    @rule(data=st.data())
    def free(self, data):
        offset = data.draw(st.sampled_from(sorted(self.chunks)))
        self.arena.free(offset)
        del self.chunks[offset]

    @rule(offset=st.integers(-2, 320))
    def free_unknown(self, offset):
        if offset in self.chunks:
            return
        error = DoubleFreeError if offset in dict(self.arena.free_blocks()) else InvalidBlockError
        self._unchanged_after(error, self.arena.free, offset)

    @rule(n=st.sampled_from([0, -1]))
    def allocate_nothing(self, n):
        self._unchanged_after(ValueError, self.arena.allocate, n)

    @invariant()
    def blocks_tile_the_arena(self):
        a = self.arena
        pieces = sorted(a.free_blocks() + a.allocated_blocks())
        cursor = 0
        for offset, size in pieces:
            assert offset == cursor, f"gap or overlap at slot {cursor}: next piece at {offset}"
            cursor += size
        assert cursor == a.capacity
        assert a.num_free + a.num_allocated == a.capacity
        assert {o for o, _ in a.allocated_blocks()} == set(self.chunks)

    @invariant()
    def free_blocks_aligned_and_coalesced(self):
        a = self.arena
        free = dict(a.free_blocks())
        for offset, size in free.items():
            assert size & (size - 1) == 0 and offset % size == 0
            root_offset, root_size = _root_of(a, offset)
            assert offset + size <= root_offset + root_size, "a free block crosses a root"
            if size < root_size:
                assert free.get(offset ^ size) != size, f"free buddies {offset} and {offset ^ size} not merged"

    def teardown(self):
        for offset in list(self.chunks):
            self.arena.free(offset)
        assert self.arena.free_blocks() == self.arena.roots()


TestBuddyMachine = BuddyMachine.TestCase


def test_buddy_roots_follow_the_bits_of_the_capacity():
    a = BuddyAllocator(15700)
    assert [s for _, s in a.roots()] == [8192, 4096, 2048, 1024, 256, 64, 16, 4]
    assert a.max_allocation == 8192
    assert all(o % s == 0 for o, s in a.roots())


def test_buddy_classic_split_leaves_one_free_half_per_level():
    a = BuddyAllocator(16, exact=False)
    assert a.allocate(1) == 0
    assert a.free_blocks() == [(1, 1), (2, 2), (4, 4), (8, 8)]
    assert a.size_of(0) == 1
    assert a.allocate(3) == 4  # best fit: the free 4, not a split of the 8
    assert a.size_of(4) == 4


def test_buddy_exact_chunk_returns_its_tail_and_merges_back():
    a = BuddyAllocator(16)
    assert a.allocate(5) == 0  # a block of 8, tail [5, 8) given back as 5 (1) + 6 (2)
    assert a.free_blocks() == [(5, 1), (6, 2), (8, 8)]
    assert a.allocate(2) == 6  # best fit takes the returned tail
    a.free(0)
    assert a.free_blocks() == [(0, 4), (4, 2), (8, 8)]
    a.free(6)
    assert a.free_blocks() == [(0, 16)]


def test_buddy_external_fragmentation_refuses_a_fitting_total():
    a = BuddyAllocator(16)
    assert [a.allocate(4) for _ in range(4)] == [0, 4, 8, 12]
    a.free(0)
    a.free(8)  # 8 slots free in total, but as [0, 4) and [8, 12)
    assert a.num_free == 8 and not a.can_allocate(5)
    with pytest.raises(OutOfBlocksError, match="no contiguous block of 8"):
        a.allocate(5)
