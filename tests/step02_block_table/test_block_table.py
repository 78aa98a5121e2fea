"""BlockTable: on-demand allocation, derived #filled, slots, free (paper §4.2–4.3).

Plain Python, no tensors. The stateful machine runs several interleaved block
tables over one allocator whose free list is shuffled, and after every rule
checks the invariants of docs/architecture.md: free + used = total, no block both free and
used, reference count = number of table entries pointing at the block, and
each table's shape (``ceil(len / B)`` blocks, ``#filled``, slots).
"""


import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from paged.step01_allocator import BlockAllocator, DoubleFreeError, OutOfBlocksError
from paged.step02_block_table import BlockTable
from tests.invariants import check_allocator, failing
from tests.strategies import block_sizes, seq_lens, shuffled_free_list


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def snapshot(table: BlockTable, allocator: BlockAllocator):
    """Everything a failed call must leave as it was."""
    refs = [allocator.ref_count(b) for b in range(allocator.num_blocks)]
    return list(table.blocks), table.num_tokens, allocator.free_blocks(), refs


def check_shape(table: BlockTable) -> None:
    """A table of n tokens has ceil(n / B) blocks, all full but the last, and the token at position p
    sits in slot blocks[p // B] * B + p % B."""
    b, n = table.block_size, table.num_tokens
    assert table.num_blocks == ceil_div(n, b), (
        f"{n} tokens with B = {b} need ceil({n} / {b}) = {ceil_div(n, b)} blocks; the table has "
        f"{table.num_blocks}: {table.blocks}")
    filled = [table.filled(i) for i in range(table.num_blocks)]
    assert all(f == b for f in filled[:-1])
    assert all(1 <= f <= b for f in filled)
    assert sum(filled) == n
    for p in range(n):
        want = table.blocks[p // b] * b + p % b
        assert table.slot(p) == want, (
            f"slot({p}) = {table.slot(p)}; position {p} is in logical block {p // b} (physical "
            f"{table.blocks[p // b]}) at offset {p % b}, so its slot is {table.blocks[p // b]} * {b} + {p % b} = {want}")


# -- the stateful machine ------------------------------------------------------
class BlockTableMachine(RuleBasedStateMachine):
    """Interleaved sequences appending prefill chunks and single tokens, then freeing."""

    tables = Bundle("tables")

    def __init__(self):
        super().__init__()
        self.allocator = None
        self.live: list[BlockTable] = []
        self.issued: dict[int, list[int]] = {}  # id(table) -> every slot append returned

    @rule(target=tables, data=st.data())
    def new_sequence(self, data):
        """A new, empty sequence over the shared pool (the first one draws B and the pool)."""
        if self.allocator is None:
            self.block_size = data.draw(block_sizes, label="B")
            n = data.draw(st.integers(1, 24), label="num_blocks")
            self.allocator = BlockAllocator(n, free_order=data.draw(shuffled_free_list(n)))
        table = BlockTable(self.allocator, self.block_size)
        self.live.append(table)
        self.issued[id(table)] = []
        return table

    @rule(table=tables, data=st.data())
    def append(self, table, data):
        """append(n) returns n slots and takes exactly the blocks slots_for(n) predicted (none while
        the last block has room); when the pool is short it raises OutOfBlocksError and changes nothing."""
        if table not in self.live:
            return
        n = data.draw(st.one_of(st.just(1), seq_lens(self.block_size, max_blocks=3)), label="n")
        before = snapshot(table, self.allocator)
        predicted = table.slots_for(n)
        assert snapshot(table, self.allocator) == before, "slots_for changed something"
        if predicted > self.allocator.num_free:
            with pytest.raises(OutOfBlocksError):
                table.append(n)
            assert snapshot(table, self.allocator) == before, "a refused append changed the table or the pool"
            return
        start = table.num_tokens
        slots = table.append(n)
        assert len(slots) == n, f"append({n}) returned {len(slots)} slots"
        assert table.num_blocks == len(before[0]) + predicted, (
            f"append({n}) to a table of {start} tokens (B = {self.block_size}, blocks {before[0]}) took "
            f"{table.num_blocks - len(before[0])} new block(s); it needs {predicted}: a new block only when the last is full")
        assert table.blocks[: len(before[0])] == before[0], "existing entries moved"
        b = self.block_size
        want = [table.blocks[p // b] * b + p % b for p in range(start, start + n)]
        assert slots == want, (f"append({n}) at positions {start}..{start + n - 1} returned slots {slots}; "
                               f"blocks[p // B] * B + p % B gives {want} (table {table.blocks}, B = {b})")
        check_shape(table)  # slot(p) of every position, by the same formula
        self.issued[id(table)] += slots

    @rule(table=consumes(tables))
    def free(self, table):
        """free() empties the table and puts each of its blocks back on the free list."""
        if table not in self.live:
            return
        held = set(table.blocks)
        free_before = self.allocator.num_free
        table.free()
        self.live.remove(table)
        assert table.blocks == [] and table.num_tokens == 0
        assert self.allocator.num_free == free_before + len(held)
        assert held <= set(self.allocator.free_blocks())

    @invariant()
    def tables_are_well_formed(self):
        """After every call, each table has ceil(n / B) blocks, and its slots are the ones append gave."""
        for table in self.live:
            check_shape(table)
            assert self.issued[id(table)] == [table.slot(p) for p in range(table.num_tokens)]

    @invariant()
    def slots_never_collide(self):
        """After every call, no two live tokens share a slot."""
        slots = [s for t in self.live for s in self.issued[id(t)]]
        assert len(slots) == len(set(slots)), "two live tokens share a slot"

    @invariant()
    def allocator_matches_tables(self):
        """After every call, reference counts equal the table entries, and free + used = total."""
        if self.allocator is not None:
            check_allocator(self.allocator, self.live)

    def teardown(self):
        """Freeing every table returns every block."""
        if failing():
            return
        for table in self.live:
            table.free()
        if self.allocator is not None:
            assert self.allocator.num_free == self.allocator.num_blocks


TestBlockTableMachine = BlockTableMachine.TestCase


# -- properties of one table ---------------------------------------------------
@given(data=st.data(), b=block_sizes)
def test_block_table_chunked_appends_match_token_by_token(data, b):
    """Prefill in chunks or token by token: same blocks, same #filled, same slots."""
    length = data.draw(seq_lens(b), label="len")
    n = ceil_div(length, b) + 1
    order = data.draw(shuffled_free_list(n))
    one, chunked = BlockTable(BlockAllocator(n, order), b), BlockTable(BlockAllocator(n, order), b)
    slots_one = [s for _ in range(length) for s in one.append(1)]
    slots_chunked, left = [], length
    while left:
        c = data.draw(st.integers(1, left), label="chunk")
        slots_chunked += chunked.append(c)
        left -= c
    assert one.blocks == chunked.blocks == order[: ceil_div(length, b)]
    assert slots_one == slots_chunked
    check_shape(one)
    check_shape(chunked)


@given(data=st.data(), b=block_sizes)
def test_block_table_free_returns_every_block(data, b):
    length = data.draw(seq_lens(b), label="len")
    n = ceil_div(length, b)
    allocator = BlockAllocator(n, data.draw(shuffled_free_list(n)))
    table = BlockTable(allocator, b)
    table.append(length)
    assert allocator.num_free == 0
    table.free()
    assert allocator.num_free == n and table.blocks == [] and table.num_tokens == 0
    table.free()  # an empty table frees nothing, and does not fail
    assert allocator.num_free == n


def test_block_table_figure6_of_the_paper():
    """Figure 6: B = 4, 7-token prompt, 2 generated tokens -> blocks 7, 1, 3; #filled 4, 4, 1."""
    table = BlockTable(BlockAllocator(8, free_order=[7, 1, 3, 0, 2, 4, 5, 6]), 4)
    assert table.append(7) == [28, 29, 30, 31, 4, 5, 6]
    assert [table.filled(i) for i in range(2)] == [4, 3]
    assert table.append(1) == [7]  # "fathers" fills logical block 1: no new block
    assert table.blocks == [7, 1]
    assert table.append(1) == [12]  # "brought" opens logical block 2 at physical block 3
    assert table.blocks == [7, 1, 3]
    assert [table.filled(i) for i in range(3)] == [4, 4, 1]


def test_block_table_append_zero_allocates_nothing():
    allocator = BlockAllocator(2)
    table = BlockTable(allocator, 4)
    assert table.slots_for(0) == 0 and table.append(0) == []
    assert allocator.num_free == 2 and table.blocks == []


def test_block_table_free_releases_shared_block_only_at_last_reference():
    """free() decrefs: a block another owner also references stays used."""
    allocator = BlockAllocator(3)
    table = BlockTable(allocator, 2)
    table.append(3)
    shared = table.blocks[0]
    allocator.incref(shared)  # as step04's fork will
    table.free()
    assert allocator.ref_count(shared) == 1
    assert shared not in allocator.free_blocks() and allocator.num_free == 2


# -- errors: the specific exception, nothing changed ---------------------------
@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError)])
def test_block_table_rejects_bad_block_size(bad, error):
    allocator = BlockAllocator(4)
    with pytest.raises(error, match="block_size"):
        BlockTable(allocator, bad)
    assert allocator.num_free == 4


def test_block_table_rejects_non_allocator():
    with pytest.raises(TypeError, match="BlockAllocator"):
        BlockTable([0, 1, 2], 4)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.5, TypeError), (None, TypeError)])
def test_block_table_bad_n_changes_nothing(bad, error):
    allocator = BlockAllocator(4, free_order=[2, 0, 3, 1])
    table = BlockTable(allocator, 4)
    table.append(5)
    before = snapshot(table, allocator)
    with pytest.raises(error, match="n must be"):
        table.append(bad)
    with pytest.raises(error, match="n must be"):
        table.slots_for(bad)
    assert snapshot(table, allocator) == before


def test_block_table_out_of_blocks_changes_nothing():
    allocator = BlockAllocator(3, free_order=[1, 2, 0])
    table, other = BlockTable(allocator, 4), BlockTable(allocator, 4)
    other.append(4)  # takes block 1
    table.append(5)  # takes blocks 2 and 0
    before = snapshot(table, allocator)
    with pytest.raises(OutOfBlocksError, match="cannot append 4 tokens to a sequence of 5"):
        table.append(4)  # needs one more block, none free
    assert snapshot(table, allocator) == before
    assert table.append(3) == [0 * 4 + 1, 0 * 4 + 2, 0 * 4 + 3]  # still fits the last block


def test_block_table_slot_and_filled_out_of_range():
    table = BlockTable(BlockAllocator(4), 4)
    table.append(5)
    for bad in (-1, 5):
        with pytest.raises(IndexError, match="outside 0..4"):
            table.slot(bad)
    for bad in (-1, 2):
        with pytest.raises(IndexError, match="outside 0..1"):
            table.filled(bad)
    with pytest.raises(TypeError):
        table.slot(1.0)


def test_block_table_free_after_external_release_changes_nothing():
    """A block released behind the table's back: DoubleFreeError before any decref."""
    allocator = BlockAllocator(4)
    table = BlockTable(allocator, 2)
    table.append(5)  # blocks 0, 1, 2
    allocator.free(table.blocks[2])
    before = snapshot(table, allocator)
    with pytest.raises(DoubleFreeError, match="nothing was freed"):
        table.free()
    assert snapshot(table, allocator) == before


def test_block_table_errors_say_what_was_wrong():
    """Each error names the argument at fault and what it got, word for word; a bool is no index."""
    allocator = BlockAllocator(4)
    table = BlockTable(allocator, 4)
    table.append(5)
    cases = [
        (lambda: BlockTable(allocator, "4"), TypeError, "block_size must be an int, got str '4'"),
        (lambda: BlockTable([0, 1], 4), TypeError, "allocator must be a BlockAllocator, got list"),
        (lambda: table.filled("0"), TypeError, "logical block index must be an int, got '0'"),
        (lambda: table.filled(True), TypeError, "logical block index must be an int, got True"),
        (lambda: table.slot(1.0), TypeError, "position must be an int, got 1.0"),
        (lambda: table.slot(False), TypeError, "position must be an int, got False"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as caught:
            call()
        assert str(caught.value) == message, (
            f"the {error.__name__} says {str(caught.value)!r}; it must say, word for word, {message!r}")
