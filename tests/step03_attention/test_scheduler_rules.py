"""Step03's scheduling rules, one deterministic test each, on the scheduler alone (no model, no tensor).

Each test builds a tiny pool (block size 4) and a few requests whose block
needs are counted by hand in its docstring, steps a ``Scheduler`` with the
stand-in runner (``tests/scheduler_harness.py``) and checks the one decision
the rule makes. The equalities are exact: queues, events, plans are integers
and ids.
"""

import pytest

from paged.step03_attention.scheduler import Reservation, Scheduler
from tests.scheduler_harness import Harness

pytestmark = pytest.mark.step03


def test_rule_fcfs_admission_without_overtaking():
    """4 blocks: A takes 3 (12 tokens), B needs 2 — so B waits, and C (1 block, which is free)
    waits behind it; when A ends, B then C start, in arrival order."""
    h = Harness(Scheduler, num_blocks=4)
    h.add(12, max_tokens=2, rid="A")
    h.add(8, max_tokens=1, rid="B")
    h.add(2, max_tokens=1, rid="C")
    first = h.tick()
    assert first.kinds("admitted") == ["A"] and first.plan.seq_ids == [0]
    assert h.ids(h.waiting) == ["B", "C"] and h.allocator.num_free == 1
    second = h.tick()  # A's last token; it holds its blocks while this iteration is decided
    assert second.kinds("admitted") == [] and h.finish_reasons("A") == ["length"]
    third = h.tick()
    assert third.kinds("admitted") == ["B", "C"] and third.plan.query_lens == [8, 2]


def _pressure():
    """4 blocks: A (3 tokens, 1 block), B (1 token, 1 block), X (5 tokens, 2 blocks) all start in
    iteration 1. In iteration 3 A's fifth token needs a new block and none is free."""
    h = Harness(Scheduler, num_blocks=4)
    h.add(3, max_tokens=10, rid="A")
    h.add(1, max_tokens=10, rid="B")
    h.add(5, max_tokens=10, rid="X")
    h.tick()
    h.tick()
    assert h.ids(h.running) == ["A", "B", "X"] and h.allocator.num_free == 0
    return h


def test_rule_the_newest_running_group_is_the_victim():
    """A, the oldest, needs a block: X (the newest) is evicted, not B — step03 cannot preempt, so X
    ends with ``kv_cache_exhausted`` and its 2 blocks are free at once; A and B go on."""
    h = _pressure()
    it = h.tick()
    assert it.kinds("finished") == ["X"] and h.finish_reasons("X") == ["kv_cache_exhausted"]
    assert h.ids(h.running) == ["A", "B"]
    assert [h.plan_seq(it, r) for r in ("A", "B")] == [True, True]
    assert h.allocator.num_free == 1  # X's 2 blocks, one of them now A's


def test_rule_no_admission_in_an_iteration_that_evicted():
    """C (1 block) arrives before the iteration that evicts X; that eviction leaves a block free,
    but C starts only in the next iteration: no newcomer takes the room an older request just lost."""
    h = _pressure()
    h.add(1, max_tokens=2, rid="C")
    it = h.tick()
    assert it.kinds("finished") == ["X"] and h.allocator.num_free == 1
    assert it.kinds("admitted") == [] and h.ids(h.waiting) == ["C"]
    assert h.tick().kinds("admitted") == ["C"]


def test_rule_a_request_larger_than_the_pool_is_ended_and_the_next_one_starts():
    """A prompt needing 3 blocks of a 2-block pool can never run: it ends at once (``length``),
    freeing nothing and holding nobody up — the request behind it starts in the same iteration."""
    h = Harness(Scheduler, num_blocks=2)
    h.add(9, rid="big")
    h.add(2, max_tokens=1, rid="small")
    it = h.tick()
    assert h.finish_reasons("big") == ["length"] and it.kinds("admitted") == ["small"]
    assert not h.waiting and h.outputs["big"].finished


def test_rule_a_request_that_outgrows_the_pool_alone_is_ended():
    """One request whose generation needs a third block of a 2-block pool: with nobody to evict it
    evicts itself (``kv_cache_exhausted``) instead of waiting forever, and every block is free."""
    h = Harness(Scheduler, num_blocks=2)
    h.add(7, max_tokens=10, rid="A")
    h.run(max_iterations=10)
    assert h.finish_reasons("A") == ["kv_cache_exhausted"] and h.allocator.num_free == 2


def test_rule_the_token_budget_holds_a_prompt_back_whole():
    """Step03 computes a prompt in one iteration: with a budget of 8 tokens, A's 6 start, and B's 4
    (6 + 4 > 8) wait for the next iteration, FCFS."""
    h = Harness(Scheduler, num_blocks=16, max_num_batched_tokens=8)
    h.add(6, max_tokens=1, rid="A")
    h.add(4, max_tokens=1, rid="B")
    it = h.tick()
    assert it.kinds("admitted") == ["A"] and it.plan.query_lens == [6]
    assert h.tick().kinds("admitted") == ["B"]


def test_rule_the_reservation_is_asked_at_admission_and_told_at_retirement():
    """The admission seam: a policy that says no keeps the head of the queue (and everyone behind it)
    waiting although its blocks are free; ``release`` comes once per request, when it retires."""

    class Log(Reservation):
        def __init__(self):
            self.allow, self.asked, self.released = False, [], []

        def reserve(self, req):
            self.asked.append(req.request_id)
            return self.allow

        def release(self, req):
            self.released.append(req.request_id)

    log = Log()
    h = Harness(Scheduler, num_blocks=8, reservation=log)
    h.add(2, max_tokens=1, rid="A")
    h.add(2, max_tokens=1, rid="B")
    assert h.tick().kinds("admitted") == [] and log.asked == ["A"]
    log.allow = True
    assert h.tick().kinds("admitted") == ["A", "B"] and log.asked == ["A", "A", "B"]
    assert log.released == ["A", "B"] and h.allocator.num_free == 8
