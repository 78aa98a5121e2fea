"""The allocator invariants of docs/architecture.md, checked after every rule of every stateful machine.

``check_allocator(allocator, tables)``: the tables are the only owners of blocks, so

* no block is on the free list twice, and none is both free and mapped;
* free + used = total, and the used blocks are exactly the mapped ones;
* every block's reference count equals the number of table entries mapping it.
"""

from collections import Counter


def check_allocator(allocator, tables) -> None:
    free = allocator.free_blocks()
    entries = Counter(b for t in tables for b in t.blocks)
    assert len(free) == len(set(free)), "a block is on the free list twice"
    assert allocator.num_free + allocator.num_used == allocator.num_blocks
    assert not set(free) & set(entries), "a block is both free and in a table"
    assert allocator.num_used == len(entries), "a used block is in no table (leaked)"
    for block in range(allocator.num_blocks):
        assert allocator.ref_count(block) == entries.get(block, 0), block
