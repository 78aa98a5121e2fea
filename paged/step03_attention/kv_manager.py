"""The KV manager: the one owner of the block pool, the block tables and the reference counts.

The scheduler decides *who* runs; every change to *which block holds what*
goes through this object (paper §4.2-4.3: the block table and the physical
blocks it maps). It holds no tensor — block ids and token counts only — so
the scheduler and its tests run without a model; the runner moves the data.

What the scheduler asks it, each iteration:

* ``blocks_needed(work)`` — how many free blocks giving ``work`` (``[(seq,
  tokens)]``) its slots would take. Changes nothing;
* ``allocate(seq, n)`` — slots for ``seq``'s next ``n`` tokens: a new block
  only when its last block is full (``BlockTable.append``);
* ``take_copies(seq)`` — block copies the slots it just gave need first
  (none here: step04's tables copy on write);
* ``written(seq)`` — the K/V of every token of ``seq`` with a slot is now in
  the cache (nothing to do here: step04 names full blocks for its prefix
  cache);
* ``free(seq)`` — give every block of ``seq``'s table back.

Later steps extend this class by their idea, and only by it: step04's
``SharingKVManager`` forks tables, copies on write and finds cached prompt
blocks; step05's ``SwappingKVManager`` moves tables to a host pool and back.

Invariants (``tests/invariants.py``, after every scheduler operation): a
block's reference count equals the number of table entries mapping it;
free + used = total; an operation that fails changes nothing.
"""

from __future__ import annotations

from paged.step01_allocator import BlockAllocator
from paged.step02_block_table import BlockTable, Sequence


class KVManager:
    """The device block pool and every sequence's table over it.

    Args:
        num_blocks: physical KV blocks (>= 1).
        block_size: tokens per block (B).
        free_order (list[int] | None): the allocator's initial free-list order (tests shuffle it).
    """

    def __init__(self, num_blocks: int, block_size: int, free_order=None) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks!r}")
        self.block_size = block_size
        self.allocator = self._pool(num_blocks, free_order)

    def _pool(self, num_blocks: int, free_order) -> BlockAllocator:
        """The device allocator (step04's remembers cached blocks)."""
        return BlockAllocator(num_blocks, free_order)

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def new_table(self, req) -> BlockTable:
        """An empty table for a new sequence of ``req``."""
        return BlockTable(self.allocator, self.block_size)

    # -- what the scheduler asks each iteration ---------------------------------------
    def blocks_needed(self, work: list[tuple[Sequence, int]]) -> int:
        """Free blocks that giving each ``(seq, n)`` of ``work`` slots for ``n`` tokens would take."""
        return sum(seq.block_table.slots_for(n) for seq, n in work)

    def allocate(self, seq: Sequence, n: int) -> tuple[int, list[int], int]:
        """Slots for ``seq``'s next ``n`` tokens: ``(position of the first, slots, tokens found cached)``."""
        start = seq.block_table.num_tokens
        return start, seq.block_table.append(n), 0

    def take_copies(self, seq: Sequence) -> list[tuple[int, int]]:
        """Block copies ``(src, dst)`` that ``seq``'s new slots need before the forward pass: none."""
        return []

    def written(self, seq: Sequence) -> None:
        """The K/V of every token of ``seq`` that has a slot is in the cache now (nothing to do here)."""

    def free(self, seq: Sequence) -> None:
        """Give back every block of ``seq``'s table (shared ones lose one reference)."""
        seq.block_table.free()

    @staticmethod
    def distinct_blocks(seqs) -> int:
        """Blocks the tables of ``seqs`` hold, a block shared between them counted once."""
        return len({b for s in seqs for b in s.block_table.blocks})

    # -- what /metrics and the viewers read ---------------------------------------------
    def usage(self, seqs) -> dict:
        """The pool's blocks and the live Figure 2 breakdown of its slots over ``seqs``' tables.

        ``token_slots_filled`` counts each physical slot holding a token once (a
        shared block once); ``internal_fragmentation_slots`` are the empty slots
        of used blocks; ``free_slots`` those of free blocks.
        """
        a, b = self.allocator, self.block_size
        filled: dict[int, int] = {}
        for seq in seqs:
            t = seq.block_table
            if t.allocator is a:
                for i, block in enumerate(t.blocks):
                    filled[block] = max(filled.get(block, 0), min(b, t.num_tokens - i * b))
        tokens = sum(filled.values())
        return {"blocks_total": a.num_blocks, "blocks_used": a.num_used, "blocks_free": a.num_free,
                "token_slots_filled": tokens, "internal_fragmentation_slots": a.num_used * b - tokens,
                "free_slots": a.num_free * b}
