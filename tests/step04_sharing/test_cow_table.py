"""Fork and copy-on-write on one pair of tables, step by step (paper §4.4, Figure 8).

The stateful machine of ``test_sharing_stateful.py`` finds these bugs too, given enough
examples; here each rule is one deterministic case, so it fails at once, on the smallest
state that shows it (lab 04 runs both). Every equality is exact (block ids and counts).
"""

from paged.step04_sharing import SharingKVManager


def _forked(prompt_len: int = 3, block_size: int = 4):
    """A parent of ``prompt_len`` tokens (its last block open) and its fork, over an 8-block pool."""
    bm = SharingKVManager(8, block_size, enable_prefix_caching=False, free_order=[5, 2, 7, 0, 1, 3, 4, 6])
    parent = bm.new_table()
    bm.allocate_prompt(parent, list(range(prompt_len)))
    return bm, parent, parent.fork()


def test_fork_maps_the_parents_blocks_one_more_reference_each():
    """A fork maps the same blocks as its parent, each block's count goes up by one, and no K/V is
    copied (no pending copy, no new block)."""
    bm, parent, child = _forked(prompt_len=6)
    assert child.blocks == parent.blocks == [5, 2], f"the fork maps {child.blocks}, its parent {parent.blocks}"
    assert child.num_tokens == 6 and child.blocks is not parent.blocks, "the fork must own a copy of the list"
    counts = [bm.allocator.ref_count(b) for b in parent.blocks]
    assert counts == [2, 2], f"after one fork each block is mapped by 2 tables; the counts are {counts}"
    assert bm.allocator.num_used == 2 and not child.pending_copies, "a fork copies nothing"


def test_copy_on_write_drops_the_reference_on_the_block_it_leaves():
    """The child writes into the shared, open last block: it takes a fresh block, queues the copy
    (old, new), and drops its reference on the old block, which only the parent maps now (count 1)."""
    bm, parent, child = _forked()
    old = parent.blocks[-1]
    slots = child.append(1)
    new = child.blocks[-1]
    assert new != old and child.pending_copies == [(old, new)], (
        f"the child must write into a fresh block and queue the copy ({old}, fresh); it maps {child.blocks} "
        f"and queued {child.pending_copies}")
    assert bm.allocator.ref_count(old) == 1, (
        f"block {old}, which the child left, has reference count {bm.allocator.ref_count(old)}; only the parent "
        "maps it now, so it must be 1 (the child's decref is missing?)")
    assert bm.allocator.ref_count(new) == 1 and slots == [new * 4 + 3]


def test_append_nothing_changes_nothing_even_on_a_shared_block():
    """``append(0)`` on a table whose last block is shared and open takes no block, queues no copy and
    returns no slot: copy-on-write happens only when a token is written."""
    bm, parent, child = _forked()
    free_before = bm.allocator.num_free
    assert child.append(0) == []
    assert child.blocks == parent.blocks and not child.pending_copies, (
        f"append(0) copied the shared block: the child maps {child.blocks}, queued {child.pending_copies}")
    assert bm.allocator.num_free == free_before
