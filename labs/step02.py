"""Lab 02 — a block table: blocks on demand, and the slot mapping (paper §4.2–4.3, Figure 6).

Write ``BlockTable.append`` and ``BlockTable.slot``; ``make lab STEP=02`` runs step 02's
block-table tests with them in place of the reference ones
(``paged/step02_block_table/block_table.py``) and tells you which invariant broke, with
Hypothesis's smallest counterexample.

What you have on ``self``: ``self.blocks`` (physical block of each logical block),
``self.num_tokens``, ``self.block_size`` (``B``), ``self.allocator`` (step 01's
``BlockAllocator``: ``allocate_many(n)`` takes ``n`` blocks or none), and
``self.slots_for(n)``, how many new blocks ``n`` more tokens need.

A token at position ``p`` lives in logical block ``p // B`` at offset ``p % B``; its slot is
``blocks[p // B] * B + p % B``.
"""

from paged.step01_allocator import OutOfBlocksError  # noqa: F401


def append(self, n: int) -> list[int]:
    """Reserve slots for ``n`` new tokens, taking new blocks only when the last one is full.

    Returns the slot of each new token, oldest first. When the pool has too few free blocks,
    raise ``OutOfBlocksError`` and leave the table and the allocator as they were. Start from
    ``self.slots_for(n)``: it also refuses a bad ``n`` (negative, not an int).
    """
    ...  # your code here


def slot(self, position: int) -> int:
    """The slot of the token at ``position``.

    Raises ``IndexError`` for a position outside ``0 .. num_tokens - 1`` (no slot yet), and
    ``TypeError`` for one that is not an int.
    """
    ...  # your code here
