"""The allocator invariants of docs/architecture.md, checked after every rule of every stateful machine.

``check_allocator(allocator, tables)``: the tables are the only owners of blocks, so

* no block is on the free list twice, and none is both free and mapped;
* free + used = total, and the used blocks are exactly the mapped ones;
* every block's reference count equals the number of table entries mapping it.

Each assertion says in words which of them broke and with which numbers: the labs
(``make lab``) print these messages to the learner.

``failing()`` tells a state machine's ``teardown`` that a rule or an invariant has already
failed: Hypothesis runs the teardown anyway, and a teardown check failing then would
hide the invariant that broke first behind its own message.
"""

import sys
from collections import Counter


def check_allocator(allocator, tables) -> None:
    """Every block's reference count equals the table entries that map it; a block is free exactly
    when none does; free + used = total."""
    free = allocator.free_blocks()
    entries = Counter(b for t in tables for b in t.blocks)
    twice = sorted(b for b, n in Counter(free).items() if n > 1)
    assert not twice, f"block {twice[0]} is on the free list twice (freed twice?)"
    assert allocator.num_free + allocator.num_used == allocator.num_blocks, (
        f"free ({allocator.num_free}) + used ({allocator.num_used}) != total ({allocator.num_blocks})")
    both = sorted(set(free) & set(entries))
    assert not both, (f"block {both[0]} is on the free list but {entries[both[0]]} table entry(ies) map it "
                      "(it was freed while still in use)")
    for block in range(allocator.num_blocks):
        count, mapped = allocator.ref_count(block), entries.get(block, 0)
        assert count == mapped, (
            f"block {block} has reference count {count}, but {mapped} table entry(ies) map it "
            + ("(a reference was never dropped: a decref missing?)" if count > mapped
               else "(a reference was dropped twice, or an entry was added without incref)"))
    assert allocator.num_used == len(entries), (
        f"{allocator.num_used} blocks are used but the tables map {len(entries)} (a block leaked)")


def failing() -> bool:
    """True inside a teardown that Hypothesis runs because a rule or an invariant failed."""
    return sys.exc_info()[0] is not None
