"""BlockAllocator: free list and reference counts (paper §4.2; the invariants of docs/architecture.md).

A stateful Hypothesis machine drives one allocator, whose free list starts
shuffled, with random allocations, shares, releases and bad calls. Beside it
the machine keeps a shadow list of "block-table entries" (one block id per
entry). After every rule: each block's reference count equals the number of
entries pointing at it; a block is free exactly when no entry points at it;
free + used = total. A failing call must leave the state exactly as it was.
"""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from paged.step01_allocator import (
    BlockAllocator,
    BlockAllocatorError,
    DoubleFreeError,
    InvalidBlockError,
    OutOfBlocksError,
)
from tests.strategies import shuffled_free_list


def _state(a: BlockAllocator):
    return a.free_blocks(), [a.ref_count(b) for b in range(a.num_blocks)]


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(data=st.data(), num_blocks=st.integers(0, 12))
    def start(self, data, num_blocks):
        self.allocator = BlockAllocator(num_blocks, free_order=data.draw(shuffled_free_list(num_blocks)))
        self.entries: list[int] = []  # shadow block-table entries

    def _unchanged_after(self, error, call, *args):
        """The call must raise ``error`` and leave the free list and every count as they were."""
        before = _state(self.allocator)
        with pytest.raises(error):
            call(*args)
        assert _state(self.allocator) == before, f"{call.__name__}{args} raised, but changed the free list or a count"

    @rule()
    def allocate(self):
        """allocate() hands out a free block that no entry holds, with count 1; with no block free
        it raises OutOfBlocksError."""
        if self.allocator.num_free == 0:
            self._unchanged_after(OutOfBlocksError, self.allocator.allocate)
            return
        block = self.allocator.allocate()
        assert block not in self.entries, "handed out a block that is in use"
        self.entries.append(block)

    @rule(n=st.integers(0, 14))
    def allocate_many(self, n):
        """allocate_many(n) takes n distinct free blocks, or none (OutOfBlocksError) when fewer are free."""
        if n > self.allocator.num_free:  # all or nothing
            self._unchanged_after(OutOfBlocksError, self.allocator.allocate_many, n)
            return
        blocks = self.allocator.allocate_many(n)
        assert len(set(blocks)) == n and not set(blocks) & set(self.entries)
        self.entries.extend(blocks)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def share(self, data):
        """incref(b): one more entry maps block b."""
        block = data.draw(st.sampled_from(self.entries))
        self.allocator.incref(block)
        self.entries.append(block)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def drop_entry(self, data):
        """decref(b) drops one reference and returns True exactly when it was the last (b is free again)."""
        block = data.draw(st.sampled_from(self.entries))
        self.entries.remove(block)
        became_free = self.allocator.decref(block)
        assert became_free == (block not in self.entries), (
            f"decref({block}) returned {became_free!r}; {self.entries.count(block)} entries still map it, "
            f"so it must return {block not in self.entries}")

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def free_unshared(self, data):
        """free(b) releases a block held by one entry; it refuses (BlockAllocatorError) a shared one."""
        block = data.draw(st.sampled_from(self.entries))
        if self.entries.count(block) > 1:  # shared: free() refuses, decref is the way
            self._unchanged_after(BlockAllocatorError, self.allocator.free, block)
            return
        self.allocator.free(block)
        self.entries.remove(block)

    @rule(data=st.data())
    def misuse_free_block(self, data):
        """free, decref or incref of a block that is already free raises DoubleFreeError."""
        free = self.allocator.free_blocks()
        if not free:
            return
        block = data.draw(st.sampled_from(free))
        op = data.draw(st.sampled_from(["free", "decref", "incref"]))
        self._unchanged_after(DoubleFreeError, getattr(self.allocator, op), block)

    @rule(block=st.sampled_from([-1, 12, 13, 10**6, "0", None]),
          op=st.sampled_from(["free", "decref", "incref", "ref_count"]))
    def misuse_unknown_id(self, block, op):
        """An id that is not a block of the pool raises InvalidBlockError."""
        if isinstance(block, int) and 0 <= block < self.allocator.num_blocks:
            return
        self._unchanged_after(InvalidBlockError, getattr(self.allocator, op), block)

    @rule()
    def negative_count(self):
        """allocate_many(-1) raises ValueError."""
        self._unchanged_after(ValueError, self.allocator.allocate_many, -1)

    @rule()
    def release_everything(self):
        """A request ending drops all its entries: then every block is free."""
        while self.entries:
            self.allocator.decref(self.entries.pop())
        assert self.allocator.num_free == self.allocator.num_blocks, (
            f"every entry dropped, yet only {self.allocator.num_free} of {self.allocator.num_blocks} blocks are free")

    @invariant()
    def counts_match_entries(self):
        """After every call, each block's reference count equals the number of entries that point at it."""
        a = self.allocator
        for b in range(a.num_blocks):
            assert a.ref_count(b) == self.entries.count(b), (
                f"block {b} has reference count {a.ref_count(b)}, but {self.entries.count(b)} entries point at it")

    @invariant()
    def free_exactly_when_unreferenced(self):
        """After every call, a block is on the free list exactly when no entry points at it, and
        free + used = total."""
        a = self.allocator
        free = a.free_blocks()
        assert len(free) == len(set(free)), "a block is on the free list twice"
        unreferenced = set(range(a.num_blocks)) - set(self.entries)
        assert set(free) == unreferenced, (
            f"free list {sorted(free)}, but the blocks no entry points at are {sorted(unreferenced)}")
        assert a.num_free + a.num_used == a.num_blocks
        assert a.num_used == len(set(self.entries))


TestAllocatorMachine = AllocatorMachine.TestCase


def test_allocator_hands_blocks_out_in_free_list_order():
    a = BlockAllocator(4, free_order=[2, 0, 3, 1])
    assert [a.allocate() for _ in range(4)] == [2, 0, 3, 1]


def test_allocator_rejects_bad_construction():
    with pytest.raises(ValueError, match="non-negative"):
        BlockAllocator(-1)
    with pytest.raises(ValueError, match="permutation"):
        BlockAllocator(3, free_order=[0, 1, 1])


def test_allocator_errors_say_what_was_wrong_and_the_limit():
    """Each error names the block or the count at fault and the bound it broke, word for word (the
    messages are what a user reads); an id equal to ``num_blocks`` is outside, like any other."""
    a = BlockAllocator(3, free_order=[1, 2, 0])
    cases = [
        (lambda: BlockAllocator(3, free_order=[0, 1, 1]), ValueError,
         "free_order must be a permutation of range(num_blocks)"),
        (lambda: a.allocate_many(-1), ValueError, "cannot allocate a negative number of blocks (-1)"),
        (lambda: a.allocate_many(4), OutOfBlocksError, "out of KV blocks: asked for 4, only 3 of 3 are free"),
        (lambda: a.ref_count(3), InvalidBlockError, "block id 3 is outside 0..2"),
        (lambda: a.incref("1"), InvalidBlockError, "block id '1' is outside 0..2"),
        (lambda: a.decref(0), DoubleFreeError, "block 0 is already free"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as caught:
            call()
        assert str(caught.value) == message, (
            f"the {error.__name__} says {str(caught.value)!r}; it must say, word for word, {message!r}")
    assert a.allocate_many(3) == [1, 2, 0]
    a.incref(2)
    counts = a.ref_counts()  # a copy, block i at index i (the KV viewer reads it)
    counts[0] = 9
    assert counts != a.ref_counts() == [1, 1, 2]
    for call, error, message in [
        (a.allocate, OutOfBlocksError, "out of KV blocks: all 3 blocks are in use"),
        (lambda: a.free(2), BlockAllocatorError, "block 2 is shared by 2 entries; use decref to drop one of them"),
    ]:
        with pytest.raises(error) as caught:
            call()
        assert str(caught.value) == message, (
            f"the {error.__name__} says {str(caught.value)!r}; it must say, word for word, {message!r}")
