"""``take_snapshot`` equals the engine's block state, and the aggregation rule (exact integer equalities).

After every iteration of a run that forks (parallel samples share prompt
blocks), copies on write, and parks and revives prefix-cache blocks, the
snapshot's cells (one block each) are compared with the allocator's reference
counts and parked list, the fill of each block with the tables that map it
(``BlockTable.filled``), each listed table with the sequence's table, and the
summed fill with ``engine.stats()``. An aggregated pool is checked against the
one-block-per-cell pool it sums.
"""

import tempfile

import pytest
import torch

from paged.models import load_model
from paged.step04_sharing import SamplingParams, SharingEngine
from paged.step04_sharing.snapshot import blocks_per_cell, pool_view
from paged.step04_sharing.snapshot_html import LABELLED_CELLS
from tests.hf_models import build_hf_model, save_checkpoint

pytestmark = pytest.mark.step04

B = 4
PREFIX = [7, 3, 9, 4, 11, 2, 8, 5]  # two full blocks: cached after the first request fills them


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp()), dtype=torch.float64)


def assert_pool_matches(pool: dict, allocator, snap: dict, tables_by_request: dict) -> None:
    """One-block-per-cell ``pool`` equals ``allocator`` and the tables ``{request id: [table]}`` mapping it."""
    n = allocator.num_blocks
    parked = set(allocator.parked_blocks()) if hasattr(allocator, "parked_blocks") else set()
    assert pool["blocks_per_cell"] == 1 and len(pool["used"]) == n
    assert pool["used"] == [int(allocator.ref_count(b) > 0) for b in range(n)]
    assert pool["shared"] == [int(allocator.ref_count(b) > 1) for b in range(n)]
    assert pool["parked"] == [int(b in parked) for b in range(n)]
    fill, holders = [0] * n, [set() for _ in range(n)]
    for rid, tables in tables_by_request.items():
        for t in tables:
            for i, block in enumerate(t.blocks):
                fill[block] = max(fill[block], t.filled(i))
                holders[block].add(rid)
    assert pool["filled"] == fill
    owners = [snap["requests"][o]["id"] if o >= 0 else None for o in pool["owner"]]
    for block in range(n):
        assert (owners[block] in holders[block]) if holders[block] else owners[block] is None, block


def assert_tables_match(snap: dict, queues: dict) -> None:
    """Every listed request is in its queue, and each sequence's table is its real table."""
    for name, queue in queues.items():
        listed = [snap["requests"][i] for i in snap["queues"][name]]
        assert [r["id"] for r in listed] == [r.request_id for r in queue]
        for view, req in zip(listed, queue):
            assert [s["seq_id"] for s in view["seqs"]] == [s.seq_id for s in req.seqs]
            for sv, seq in zip(view["seqs"], req.seqs):
                t = seq.block_table
                assert sv["table"] == [[block, t.filled(i)] for i, block in enumerate(t.blocks)]


def check_device(engine, snap) -> None:
    tables = {r.request_id: [s.block_table for s in r.seqs] for r in engine.scheduler.running}
    assert_pool_matches(snap["pools"]["device"], engine.scheduler.kv.allocator, snap, tables)
    assert sum(snap["pools"]["device"]["filled"]) == snap["stats"]["token_slots_filled"]


def test_snapshot_equals_block_state_through_fork_cow_and_prefix_cache(model):
    """Exact: cells, tables and fill equal the allocator and tables after every iteration."""
    engine = SharingEngine(model, block_size=B, num_blocks=24, free_order=list(range(24))[::-1])
    seen = {"shared": 0, "parked": 0}

    def observe(eng, plan, results):
        snap = eng.kv_snapshot()
        check_device(eng, snap)
        assert_tables_match(snap, {"waiting": eng.scheduler.waiting, "running": eng.scheduler.running})
        seen["shared"] += sum(snap["pools"]["device"]["shared"])
        seen["parked"] += sum(snap["pools"]["device"]["parked"])

    engine.add_observer(observe)
    engine.add_request("par", [1, 2, 3, 4, 5, 6], SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=5,
                                                                 ignore_eos=True))
    engine.add_request("first", PREFIX + [1, 2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    engine.add_request("second", PREFIX + [6], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert seen["shared"] > 0 and seen["parked"] > 0, seen  # the run really shared and parked blocks
    assert engine.scheduler.kv.hit_rate() > 0


@pytest.mark.parametrize("num_blocks, max_cells, per", [(24, 24, 1), (24, 100, 1), (24, 12, 2), (24, 5, 5),
                                                        (13, 4, 4), (1, 1, 1), (0, 8, 1)])
def test_aggregation_rule_sums_consecutive_blocks(model, num_blocks, max_cells, per):
    """Exact: ``per`` is the fewest blocks per cell keeping <= max_cells cells; each cell sums its blocks."""
    assert blocks_per_cell(num_blocks, max_cells) == per
    assert -(-num_blocks // per) <= max_cells
    assert per == 1 or -(-num_blocks // (per - 1)) > max_cells
    if num_blocks < 12:
        return
    engine = SharingEngine(model, block_size=B, num_blocks=num_blocks)
    engine.add_request("par", [1, 2, 3, 4, 5, 6], SamplingParams(n=2, temperature=1.0, max_tokens=3,
                                                                 ignore_eos=True))
    engine.add_request("one", PREFIX, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    engine.step()
    engine.step()
    owned = [(i, s.block_table) for i, r in enumerate(engine.scheduler.running) for s in r.seqs]
    fine = pool_view(engine.scheduler.kv.allocator, owned, B, num_blocks)
    coarse = pool_view(engine.scheduler.kv.allocator, owned, B, max_cells)
    assert coarse["blocks_per_cell"] == per and len(coarse["used"]) == -(-num_blocks // per)
    for column in ("used", "shared", "parked", "filled"):
        assert coarse[column] == [sum(fine[column][c:c + per]) for c in range(0, num_blocks, per)], column
    assert sum(coarse["shared"]) > 0


def test_aggregation_rule_refuses_zero_cells():
    """``max_cells < 1`` is refused with the bound."""
    with pytest.raises(ValueError, match="max_cells must be >= 1"):
        blocks_per_cell(10, 0)


def test_repr_html_draws_a_square_per_block_and_names_each_request(model):
    """Exact counts: one square per cell of the pool, every running request named in the queue table."""
    engine = SharingEngine(model, block_size=B, num_blocks=20)
    engine.add_request("par", [1, 2, 3, 4, 5, 6], SamplingParams(n=2, temperature=1.0, max_tokens=3,
                                                                 ignore_eos=True))
    engine.step()
    html = engine._repr_html_()
    assert html.count("title=\"block ") == 20
    assert "par" in html and "0&rarr;" in html and "token states" in html


def test_repr_html_numbers_the_squares_of_a_small_pool_only(model):
    """Exact markup: a 20-block pool draws 28 px squares numbered 0..19 (readable in a notebook);
    a pool of more than ``LABELLED_CELLS`` blocks keeps 14 px squares without numbers."""
    small = SharingEngine(model, block_size=B, num_blocks=20)._repr_html_()
    assert small.count("width:28px") == 20 and ">19</span>" in small and "width:14px" not in small
    big = SharingEngine(model, block_size=B, num_blocks=LABELLED_CELLS + 1)._repr_html_()
    assert big.count("width:14px") == LABELLED_CELLS + 1 and "width:28px" not in big
