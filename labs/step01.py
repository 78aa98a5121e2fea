"""Lab 01 — a free list and reference counts (paper §4.2).

Write the three methods of ``BlockAllocator`` below; ``make lab STEP=01`` runs step 01's
stateful allocator test with them in place of the reference ones
(``paged/step01_allocator/allocator.py``) and tells you which invariant broke, with
Hypothesis's smallest sequence of calls that breaks it.

What you have on ``self`` (set up by the reference ``__init__``):

* ``self._free``: a ``collections.deque`` of free block ids, next one to hand out first;
* ``self._ref_count``: a list, ``self._ref_count[b]`` = entries pointing at block ``b`` (0 = free);
* ``self.num_blocks``, ``self.num_free``; ``self._check_used(b)`` raises
  ``InvalidBlockError`` for an unknown id and ``DoubleFreeError`` for a free block.

What must hold after every call: a block is free (on the list, count 0) or used (count >= 1),
never both; ``num_free + num_used == num_blocks``; a call that raises changes nothing.
"""

from paged.step01_allocator.allocator import BlockAllocatorError, OutOfBlocksError  # noqa: F401


def allocate(self) -> int:
    """Take the next free block, give it one reference, return its id.

    Raises ``OutOfBlocksError`` when no block is free (changing nothing).
    """
    ...  # your code here


def decref(self, block: int) -> bool:
    """Drop one reference on a used block; when none is left, the block goes back on the free list.

    Returns True when the block became free. Check the id first (``self._check_used``).
    """
    ...  # your code here


def free(self, block: int) -> None:
    """Release a block held by exactly one entry.

    Raises ``BlockAllocatorError`` when the block is shared (its count is above 1): dropping one
    of its entries is ``decref``'s job. Changes nothing when it raises.
    """
    ...  # your code here
