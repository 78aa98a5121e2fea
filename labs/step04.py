"""Lab 04 — sharing blocks: fork, and copy-on-write on the first write (paper §4.4, Figure 8).

Write ``CowBlockTable.fork`` and ``CowBlockTable.append``; ``make lab STEP=04`` runs step 04's
sharing tests with them in place of the reference ones (``paged/step04_sharing/cow_table.py``)
and tells you which invariant broke, with Hypothesis's smallest sequence of calls.

What you have on ``self`` (a ``CowBlockTable``, a step 02 ``BlockTable`` that may share blocks):
``self.blocks`` (physical block of each logical block), ``self.num_tokens``, ``self.block_size``
(``B``), ``self.hashes`` (prefix-cache names of its leading full blocks: a child inherits them),
``self.pending_copies`` (``(src, dst)`` pairs the engine copies before the next forward pass),
``self.allocator`` (step 01's: ``allocate()``, ``incref(b)``, ``decref(b)``, ``ref_count(b)``,
``num_free``), ``self.slots_for(n)`` (new blocks ``append(n)`` takes, a copy included) and
``self._last_is_shared_and_open()`` (the last block has room left and another table maps it).

What must hold after every call: a block's reference count equals the number of table entries
mapping it; a table never writes into a block another table maps; a refused call changes nothing.
"""

from paged.step01_allocator import OutOfBlocksError  # noqa: F401
from paged.step02_block_table import BlockTable  # noqa: F401


def fork(self):
    """A child table (``type(self)(self.allocator, self.block_size)``) mapping the same blocks.

    No K/V moves: each block gains one reference. The child has the parent's ``num_tokens``, and
    its own copies of the parent's lists (``blocks``, ``hashes``), so that they part ways later.
    """
    ...  # your code here


def append(self, n: int) -> list[int]:
    """Slots for ``n`` new tokens; copy-on-write first if the last block is shared and open.

    Copy-on-write: take a fresh block, queue ``(old, new)`` in ``self.pending_copies``, drop this
    table's reference on the old block (another table still maps it), map the new one instead.
    All or nothing: if the free blocks do not cover ``self.slots_for(n)``, raise
    ``OutOfBlocksError`` before changing anything. Then ``BlockTable.append(self, n)`` (step 02's)
    gives the slots (``super()`` does not work in a function outside the class).
    """
    ...  # your code here
