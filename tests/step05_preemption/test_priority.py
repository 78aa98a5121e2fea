"""``PriorityFirst``, vLLM's priority order: rules pinned on small scenarios, two state machines, and the
engine's check of a request's ``priority``.

Model-free (the scheduler stepped with the stand-in runner, ``tests/scheduler_harness.py``) but for the
engine's check. Every check is exact: iteration counts, request ids, queue contents, error fields, and —
with every priority equal — the whole plan, every event and every output compared with
first-come-first-served's by ``==``.
"""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from paged import LLM, SamplingParams
from paged.errors import RequestError
from paged.models.default import DEFAULT_MODEL_PATH
from paged.step05_preemption.priority import PriorityFirst
from tests.scheduler_harness import Harness, step05
from tests.step05_preemption.order_scenarios import (ENGINES, SETTINGS, flood_then_newcomer, full_slots_then_newcomer,
                                                     machine_harness, wide_group_then_newcomer)
from tests.step05_preemption.test_scheduler_model_free import ModelFreeSchedulerMachine


def flooded(order, mode: str, priority: int) -> tuple[int, int]:
    """The flood scenario with a newcomer of ``priority``: the iterations it took, and those of the whole run
    (every block free at its end)."""
    h, waited, _ = flood_then_newcomer(order, mode, priority=priority)
    h.run()
    assert h.allocator.num_used == 0 and h.host.num_used == 0
    return waited, len(h.history)


@pytest.mark.parametrize("mode, fcfs_wait, total", [("recompute", 78, 143), ("swap", 82, 161)])
def test_a_smaller_priority_goes_before_older_requests(mode, fcfs_wait, total):
    """Exact (iteration counts). First-come-first-served: the newcomer's one token waits until the preempted
    flood, older than it, is back (78 iterations by recompute, 82 by swap). By priority it does so too at
    priority 0 or 1 (FCFS within a priority, and 1 comes after 0); at -1 it starts in the first iteration
    with a free block (the 5th), by swap while the flood has requests swapped out. The run is as long."""
    assert flooded(None, mode, 0) == (fcfs_wait, total)
    assert flooded(PriorityFirst(), mode, 0) == (fcfs_wait, total)
    assert flooded(PriorityFirst(), mode, 1) == (fcfs_wait, total)
    assert flooded(PriorityFirst(), mode, -1) == (5, total)


def test_the_victim_is_the_newest_of_the_largest_priority():
    """Exact (request ids). a0 (priority 1), a1 and a2 (0), b0 (-1), in this order of arrival. When the pool
    runs out, first-come-first-served preempts the newest (b0); by priority the largest, a0, the oldest."""
    victims = {}
    for name, order in (("fcfs", None), ("priority", PriorityFirst())):
        h = Harness(step05, 12, 4, preemption_mode="recompute", **({"order": order} if order else {}))
        for rid, priority in (("a0", 1), ("a1", 0), ("a2", 0), ("b0", -1)):
            h.add(4, max_tokens=20, rid=rid, priority=priority, ignore_eos=True)
        while not any(e.kind == "preempted" for e in h.events):
            h.step()
        victims[name] = h.last.kinds("preempted")
    assert victims == {"fcfs": ["b0"], "priority": ["a0"]}


def test_requests_holding_every_sequence_slot_leave_one_for_a_smaller_priority():
    """Exact (iteration counts). 12 requests of priority 0, 8 sequence slots, memory to spare: 8 run, 4 wait.
    A request of priority -1 asks for one token: FCFS starts it when the first of the 8 ends (96 iterations
    later); by priority its slot is kept out of the running groups' budget: answered in the next iteration."""
    orders = (("fcfs", None), ("priority", PriorityFirst()))
    waited = {name: full_slots_then_newcomer(order, priority=-1) for name, order in orders}
    assert waited == {"fcfs": 96, "priority": 1}


def test_a_kept_slot_never_keeps_a_group_as_wide_as_the_budget_from_running():
    """Exact (iteration counts). A 3-sequence group of priority 0 holds every slot and the blocks a request of
    priority -1 needs: the slot kept for that request would keep the group from running for ever (each
    waiting for the other); kept slots leave room for the widest running group, so the run ends in 5
    iterations, as under FCFS."""
    assert wide_group_then_newcomer(None, priority=-1) == 5
    assert wide_group_then_newcomer(PriorityFirst(), priority=-1) == 5


def by_priority(queue) -> dict[int, list[str]]:
    """``queue``'s request ids grouped by priority, each group in the queue's (arrival) order."""
    groups: dict[int, list[str]] = {}
    for req in queue:
        groups.setdefault(req.priority, []).append(req.request_id)
    return groups


def test_first_and_waits_follow_the_priorities():
    """Exact: the first of a queue is the oldest of its smallest priority; swapped requests hold a waiting
    one back only when one of them has its priority or a smaller one."""
    order = PriorityFirst()
    h = Harness(step05, 64, 4, order=order)
    for rid, priority in (("a", 2), ("b", 0), ("c", 0), ("d", -5), ("e", -5)):
        h.add(4, max_tokens=4, rid=rid, priority=priority)
    assert order.first(h.waiting).request_id == "d"
    assert {p: [r.request_id for r in reqs] for p, reqs in order.lists["waiting"].items()} == \
        {2: ["a"], 0: ["b", "c"], -5: ["d", "e"]}
    order.lists["swapped"][0] = [object()]  # as if a request of priority 0 were swapped out
    by_id = {r.request_id: r for r in h.waiting}
    assert [order.waits(by_id[rid], ()) for rid in "abcd"] == [True, True, True, False]


MODEL = dict(model=str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=64, seed=0)


@pytest.fixture(scope="module")
def engines():
    return {policy: LLM(**MODEL, scheduling_policy=policy) for policy in ("fcfs", "fair", "priority")}


@pytest.mark.parametrize("priority, policies, message", [
    (3, ("fcfs", "fair"), "priority must be 0 here, got 3: this engine's order"),
    (True, ("fcfs", "fair", "priority"), "priority must be an integer, got bool"),
    (1.0, ("fcfs", "fair", "priority"), "priority must be an integer, got float"),
    (2 ** 63, ("priority",), "priority must be in [-2**63, 2**63), got 9223372036854775808"),
    (-2 ** 63 - 1, ("priority",), "priority must be in [-2**63, 2**63), got -9223372036854775809"),
])
def test_a_bad_priority_is_refused_and_queues_nothing(engines, priority, policies, message):
    """Exact (the error's text and field): the engine refuses a priority that is no integer, beyond 64 bits,
    or other than 0 under an order that does not rank by it; the prompt before it is not queued either."""
    for policy in policies:
        llm = engines[policy]
        with pytest.raises(RequestError) as e:
            llm.generate(["a", "b"], SamplingParams(max_tokens=2), priority=[0, priority])
        assert str(e.value).startswith(f"prompt 1: {message}") and e.value.param == "priority", (policy, e.value)
        assert not llm.engine.has_unfinished()


def test_priorities_reach_the_order(engines):
    """Exact: under "priority" the engine's requests carry the priorities given (the extremes included); 0
    is every request's priority under any policy; outputs come back in prompt order."""
    seen = {}
    llm = engines["priority"]
    llm.engine.add_observer(lambda engine, plan, results: seen.update(
        {r.prompt: r.priority for r in engine.scheduler.running}))
    outs = llm.generate(["a", "b", "c"], SamplingParams(max_tokens=2), priority=[-2 ** 63, 0, 2 ** 63 - 1])
    assert [o.prompt for o in outs] == ["a", "b", "c"]
    assert seen == {"a": -2 ** 63, "b": 0, "c": 2 ** 63 - 1}
    with pytest.raises(ValueError, match="2 prompts but 1 priorities"):
        llm.generate(["a", "b"], priority=[0])
    for policy in ("fcfs", "fair"):
        assert len(engines[policy].generate(["a"], SamplingParams(max_tokens=1), priority=[0])) == 1


class EqualPriorityMachine(ModelFreeSchedulerMachine):
    """With every priority equal (whichever it is), the priority order is first-come-first-served: the
    model-free machine's rules and invariants (FCFS included), over a ``Lockstep`` harness."""

    @initialize(**ENGINES, level=st.sampled_from([-3, 0, 7]))
    def start(self, block_size, num_blocks, mode, host_blocks, budget, max_seqs, level):
        super().start(block_size, num_blocks, mode, host_blocks, budget)
        self.level = level
        self.engine = machine_harness(PriorityFirst(), block_size, num_blocks, mode, host_blocks, budget, max_seqs,
                                      lockstep=True)

    def priority(self, data) -> int:
        return self.level


class PrioritiesMachine(ModelFreeSchedulerMachine):
    """Three priorities: the model-free machine's rules, and its invariants but FCFS across priorities (no
    leak, exact coverage, every request finished, ...); instead: whoever an iteration admits (or swaps in)
    ranks before everyone who waited (was swapped out) before it and still does, nobody is admitted in an
    iteration that preempted or while a request of its priority or a smaller one is swapped out, and
    ``PriorityFirst``'s lists are the queues' own requests by priority, in the queues' order."""

    @initialize(**ENGINES)
    def start(self, block_size, num_blocks, mode, host_blocks, budget, max_seqs):
        super().start(block_size, num_blocks, mode, host_blocks, budget)
        self.order = PriorityFirst()
        self.engine = machine_harness(self.order, block_size, num_blocks, mode, host_blocks, budget, max_seqs)

    def priority(self, data) -> int:
        return data.draw(st.sampled_from([-1, 0, 2]), label="priority")

    def _check_fcfs_decisions(self):
        e, rank = self.engine, self.order.rank
        if e.last.kinds("admitted"):
            assert not e.last.kinds("preempted"), "admitted in an iteration that preempted"
        live = {r.request_id: r for r in e.requests.values()}
        for kind, queue, before in (("admitted", e.scheduler.waiting, e.last.waiting_before),
                                    ("swapped_in", e.scheduler.swapped, e.last.swapped_before)):
            still = [r for r in queue if r.request_id in before]
            for rid in e.last.kinds(kind):
                if rid in live:
                    mine = live[rid]
                    assert all(rank(mine) < rank(r) for r in still), f"{rid} ({kind}) overtook {still}"
                    if kind == "admitted":
                        assert all(r.priority > mine.priority for r in e.scheduler.swapped), \
                            f"{rid} admitted while a request of its priority or a smaller one was swapped out"
        for name in ("waiting", "running", "swapped"):
            mine = {p: [r.request_id for r in reqs] for p, reqs in self.order.lists[name].items()}
            held = by_priority(getattr(e.scheduler, name))
            assert mine == held, f"PriorityFirst's {name} lists {mine} != the queue's {held}"


EqualPriorityMachine.TestCase.settings = SETTINGS
PrioritiesMachine.TestCase.settings = SETTINGS
test_equal_priorities_are_scheduled_exactly_as_fcfs = EqualPriorityMachine.TestCase
test_priorities_keep_every_invariant = PrioritiesMachine.TestCase
