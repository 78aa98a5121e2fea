"""Step05's scheduling rules on the scheduler alone (no model): preemption, swapping, chunked prefill.

``PreemptingScheduler`` with the stand-in runner (``tests/scheduler_harness.py``);
every equality is exact (queues, events, token counts).
"""

import pytest

from paged.step05_preemption import ChunkedPrefillScheduler, PreemptingScheduler
from tests.scheduler_harness import Harness

pytestmark = pytest.mark.step05


def _pressure(mode, swap_blocks=16):
    """6 blocks of 4: A (3 tokens, 1 block) starts, then G (``n=2``: 5-token prompt, 2 blocks,
    forked), then S (1 token, 1 block); they decode until the pool runs out."""
    h = Harness(PreemptingScheduler, num_blocks=6, swap_blocks=swap_blocks, preemption_mode=mode)
    h.add(3, max_tokens=12, rid="A")
    h.add(5, max_tokens=12, rid="G", n=2, temperature=1.0, seed=3)
    h.add(1, max_tokens=12, rid="S")
    return h


def _until_preempted(h):
    for _ in range(50):
        it = h.tick()
        if it.kinds("preempted"):
            return it
    raise AssertionError("nobody was preempted")


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_rule_the_newest_group_is_the_victim_and_goes_back_in_arrival_order(mode):
    """A (the oldest) needs a block: S, the newest, is preempted; then G's two sequences need a block
    each and nobody newer is left, so G preempts itself. Victims go newest first; the queue they
    join (swapped, or waiting for recompute) is in arrival order: G before S."""
    h = _pressure(mode)
    it = _until_preempted(h)
    assert it.running_before == ["A", "G", "S"] and it.kinds("preempted") == ["S", "G"]
    assert h.ids(h.running) == ["A"] and it.plan.seq_ids == [h.running[0].seqs[0].seq_id]
    assert h.ids(h.swapped if mode == "swap" else h.waiting) == ["G", "S"]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_rule_a_group_is_evicted_whole(mode):
    """Evicting G (``n=2``, sharing its prompt blocks) takes both its sequences, all or nothing: by
    swap every block of both tables moves to the host pool (shared ones once), by recompute both
    tables are emptied; none of G's sequences stays on the device."""
    h = Harness(PreemptingScheduler, num_blocks=5, swap_blocks=16, preemption_mode=mode)
    h.add(3, max_tokens=12, rid="A")
    h.add(5, max_tokens=12, rid="G", n=2, temperature=1.0, seed=3)
    it = _until_preempted(h)
    assert it.kinds("preempted") == ["G"]
    g = [r for r in (h.swapped if mode == "swap" else h.waiting) if r.request_id == "G"][0]
    live = [s for s in g.seqs if not s.is_finished]
    assert len(live) == 2
    if mode == "swap":
        assert all(s.block_table.allocator is h.swap.allocator and s.block_table.blocks for s in live)
        assert h.swap.allocator.num_used == len({b for s in live for b in s.block_table.blocks})
    else:
        assert all(not s.block_table.blocks and s.block_table.num_tokens == 0 for s in live)
    device = {b for r in h.running for s in r.seqs for b in s.block_table.blocks}
    assert h.allocator.num_used == len(device)  # only A's blocks are on the device


def test_rule_swapped_groups_return_before_new_requests_oldest_first():
    """Under swap pressure with arrivals behind: in every iteration, the groups swapped in are the
    oldest of the swapped queue, in order; nobody new is admitted while a group stays swapped out,
    nor in an iteration that preempted."""
    h = Harness(PreemptingScheduler, num_blocks=8, swap_blocks=32, preemption_mode="swap")
    for i in range(6):
        h.add(3 + i % 3, max_tokens=10, n=2, temperature=1.0, seed=i)
    h.add(2, max_tokens=3, rid="late")
    seen_waiting_behind_swapped = 0
    for it in h.run():
        back = it.kinds("swapped_in")
        assert back == it.swapped_before[:len(back)], "a younger swapped group came back first"
        if it.kinds("admitted"):
            assert not it.kinds("preempted")
            assert set(it.swapped_before) <= set(back), "admitted while a group was still swapped out"
        seen_waiting_behind_swapped += bool(it.swapped_before and it.waiting_before)
    assert seen_waiting_behind_swapped and sum(len(it.kinds("swapped_in")) for it in h.history) >= 2
    assert h.allocator.num_used == 0 and h.swap.allocator.num_used == 0


def test_rule_a_swapped_group_returns_only_with_room_for_its_next_tokens():
    """A group swapped back in beside running ones gets its blocks *and* one block per sequence for
    its next token, so it runs in the very iteration it returns; while the free blocks cover its
    blocks but not that room, it stays swapped out."""
    h = Harness(PreemptingScheduler, num_blocks=8, swap_blocks=32, preemption_mode="swap")
    for i in range(6):
        h.add(3 + i % 3, max_tokens=10, n=2, temperature=1.0, seed=i)
    returns = 0
    for it in h.run():
        for rid in it.kinds("swapped_in"):
            req = next(r for r in it.touched if r.request_id == rid)
            assert any(s.seq_id in it.plan.seq_ids for s in req.seqs), f"{rid} came back without slots"
            returns += 1
    assert returns >= 2


def test_rule_a_swapped_group_waits_while_the_free_blocks_lack_room_for_its_next_tokens():
    """G (2 sequences over 3 distinct blocks) is swapped out beside A. The 4 free blocks would hold
    its 3 blocks, but not one more per sequence for its next tokens (3 + 2), so it stays out while
    A runs; it returns when A is done (alone, its blocks are enough)."""
    h = Harness(PreemptingScheduler, num_blocks=6, swap_blocks=16, preemption_mode="swap")
    h.add(2, max_tokens=12, rid="A")
    g = h.add(5, max_tokens=12, rid="G", n=2, temperature=1.0, seed=3)
    assert _until_preempted(h).kinds("preempted") == ["G"]
    blocks = len({b for s in g.seqs for b in s.block_table.blocks})
    assert blocks == 3 and h.allocator.num_free == 4
    it = h.tick()
    assert it.kinds("swapped_in") == [] and h.ids(h.swapped) == ["G"] and h.ids(h.running) == ["A"]
    back = [it for it in h.run() if it.kinds("swapped_in")]
    assert len(back) == 1 and back[0].running_before == [] and h.outputs["A"].finished


def test_rule_a_prompt_is_chunked_to_the_token_budget():
    """Budget 5 tokens: a lone 12-token prompt runs as 5 + 5 + 2 and samples only after the last
    chunk; beside a decoding request D, the prompt takes what D's one token leaves (4)."""
    h = Harness(ChunkedPrefillScheduler, num_blocks=16, max_num_batched_tokens=5)
    h.add(12, max_tokens=2, rid="P")
    plans = [h.tick().plan for _ in range(3)]
    assert [p.query_lens for p in plans] == [[5], [5], [2]]
    assert [p.sample for p in plans] == [[False], [False], [True]]
    assert [p.positions[0] for p in plans] == [0, 5, 10]
    h = Harness(ChunkedPrefillScheduler, num_blocks=16, max_num_batched_tokens=5)
    h.add(2, max_tokens=8, rid="D")
    h.tick()
    h.add(9, max_tokens=1, rid="P")
    assert h.tick().plan.query_lens == [1, 4]


def test_rule_a_group_wider_than_the_budget_runs_whole_when_alone():
    """A group's sequences run together (beams in lockstep): 3 decoding sequences and a budget of 2
    tokens — it is not split, and runs over the budget because the plan is otherwise empty."""
    h = Harness(ChunkedPrefillScheduler, num_blocks=16, max_num_batched_tokens=4)
    h.add(4, max_tokens=3, n=3, temperature=1.0, seed=1)
    h.tick()  # the prompt (4 tokens), then the forks
    h.scheduler.max_num_batched_tokens = 2
    assert h.tick().plan.query_lens == [1, 1, 1]


def test_rule_a_request_that_outgrows_the_pool_alone_is_ended_not_preempted_forever():
    """Alone on the device and still short of blocks, a request can never continue: it is ended
    (``length``), not swapped out and in forever; a request waiting behind starts next iteration."""
    h = Harness(PreemptingScheduler, num_blocks=2, swap_blocks=8, preemption_mode="swap")
    h.add(7, max_tokens=20, rid="A")  # 2 blocks; its 9th token needs a third, in iteration 3
    for _ in range(2):
        h.tick()
    h.add(1, max_tokens=1, rid="B")
    it = h.tick()
    assert h.finish_reasons("A") == ["length"] and it.kinds("preempted") == []
    assert it.kinds("admitted") == [] and h.ids(h.waiting) == ["B"]
    h.run(max_iterations=5)
    assert h.allocator.num_used == 0 and h.swap.allocator.num_used == 0
