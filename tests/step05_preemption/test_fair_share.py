"""``FairShare``, the order across clients: rules pinned on small scenarios, and two state machines.

Model-free (the scheduler stepped with the stand-in runner, ``tests/scheduler_harness.py``). Every
check is exact: iteration counts, request ids, queue contents, and — for one client — the whole plan,
every event and every output compared with first-come-first-served's by ``==``.
"""

from collections import Counter

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from paged.step05_preemption.fair import FairShare
from tests.scheduler_harness import Harness, step05
from tests.step05_preemption.order_scenarios import (ENGINES, SETTINGS, flood_then_newcomer, full_slots_then_newcomer,
                                                     machine_harness, wide_group_then_newcomer)
from tests.step05_preemption.test_scheduler_model_free import ModelFreeSchedulerMachine

@pytest.mark.parametrize("mode, fcfs_wait, total", [("recompute", 78, 143), ("swap", 82, 161)])
def test_a_newcomer_does_not_wait_behind_another_clients_queue(mode, fcfs_wait, total):
    """Exact (iteration counts; the step05 page quotes them). First-come-first-served: the newcomer's one
    token waits until the hog's preempted requests, older than it, are back (78 iterations by recompute,
    82 by swap). Fair share: it starts in the first iteration with a free block (the 5th), and is never
    the victim; by swap, the hog's swapped requests do not hold it back (its client has nothing running).
    The whole run takes as many iterations under either order."""
    h_fcfs, fcfs, _ = flood_then_newcomer(None, mode, client="new")
    h, fair, iterations = flood_then_newcomer(FairShare(), mode, client="new")
    assert (fcfs, fair) == (fcfs_wait, 5)
    assert not any(e.kind == "preempted" and e.request_id == "new" for it in iterations for e in it.events)
    admitted = next(it for it in iterations if "new" in it.kinds("admitted"))
    if mode == "swap":
        assert admitted.swapped_before, "the rule under test: admitted while the hog had requests swapped out"
    h.run()
    h_fcfs.run()
    assert len(h.history) == len(h_fcfs.history) == total
    assert h.allocator.num_used == 0 and h.host.num_used == 0


def test_the_victim_is_the_newest_request_of_the_client_with_the_most_running():
    """Exact (request ids). Client a runs three requests, b one, the newest of all. When the pool runs
    out, first-come-first-served preempts b's (the newest); fair share preempts a's newest."""
    victims = {}
    for name, order in (("fcfs", None), ("fair", FairShare())):
        h = Harness(step05, 12, 4, preemption_mode="recompute", **({"order": order} if order else {}))
        for i in range(3):
            h.add(4, max_tokens=20, rid=f"a{i}", client="a", ignore_eos=True)
        h.add(4, max_tokens=20, rid="b0", client="b", ignore_eos=True)
        while not any(e.kind == "preempted" for e in h.events):
            h.step()
        victims[name] = h.last.kinds("preempted")
    assert victims == {"fcfs": ["b0"], "fair": ["a2"]}


def test_a_client_holding_every_sequence_slot_leaves_one_for_a_newcomer():
    """Exact (iteration counts). 12 requests of one client, 8 sequence slots (``max_num_seqs``), memory to
    spare: 8 run, 4 wait. A second client's one-token request: FCFS starts it when the first of the 8 ends
    (96 iterations later); fair share keeps its slot out of the running groups' budget, so it is answered
    in the next iteration."""
    orders = (("fcfs", None), ("fair", FairShare()))
    waited = {name: full_slots_then_newcomer(order, client="new") for name, order in orders}
    assert waited == {"fcfs": 96, "fair": 1}


def test_a_kept_slot_never_keeps_a_group_as_wide_as_the_budget_from_running():
    """Exact (iteration counts). A 3-sequence group holds every slot and the blocks a newcomer of another
    client needs: fair share would keep a slot for the newcomer, and the group, finding 2 slots, would never
    run again (the newcomer never got its blocks: a hang, found by the three-client machine). The kept slots
    leave room for the widest running group; the run ends in 5 iterations, as under FCFS."""
    assert wide_group_then_newcomer(None, client="new") == 5
    assert wide_group_then_newcomer(FairShare(), client="new") == 5


def test_within_one_client_the_order_is_first_come_first_served():
    """Exact: the waiting head of each client is its oldest request; the least-served client's goes first."""
    order = FairShare()
    h = Harness(step05, 64, 4, order=order)
    for rid, client in (("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b")):
        h.add(4, max_tokens=4, rid=rid, client=client)
    assert order.first(h.waiting).request_id == "a0"
    order.counts["running"]["a"] += 1  # as if a had one running: b's oldest goes first
    assert order.first(h.waiting).request_id == "b0"


class OneClientMachine(ModelFreeSchedulerMachine):
    """With one client, fair share is first-come-first-served: the model-free machine's rules and
    invariants (FCFS included), over a ``Lockstep`` harness; here also with few sequence slots."""

    @initialize(**ENGINES)
    def start(self, block_size, num_blocks, mode, host_blocks, budget, max_seqs):
        super().start(block_size, num_blocks, mode, host_blocks, budget)
        self.engine = machine_harness(FairShare(), block_size, num_blocks, mode, host_blocks, budget, max_seqs,
                                      lockstep=True)


class ClientsMachine(ModelFreeSchedulerMachine):
    """Three clients: the model-free machine's rules, and its invariants but FCFS across clients (no
    leak, exact coverage, every request finished, ...); instead, within each client the admissions and
    swap-ins keep arrival order, nobody is admitted in an iteration that preempted, and ``FairShare``'s
    counts are the queues' own."""

    @initialize(**ENGINES)
    def start(self, block_size, num_blocks, mode, host_blocks, budget, max_seqs):
        super().start(block_size, num_blocks, mode, host_blocks, budget)
        self.order = FairShare()
        self.engine = machine_harness(self.order, block_size, num_blocks, mode, host_blocks, budget, max_seqs)
        self.clients = {}

    def client(self, data) -> str:
        return data.draw(st.sampled_from("abc"), label="client")

    def _check_fcfs_decisions(self):
        e = self.engine
        if e.last.kinds("admitted"):
            assert not e.last.kinds("preempted"), "admitted in an iteration that preempted"
        live = {r.request_id: r for r in e.requests.values()}
        for kind, queue in (("admitted", e.scheduler.waiting), ("swapped_in", e.scheduler.swapped)):
            for rid in e.last.kinds(kind):
                if rid in live:
                    mine = live[rid]
                    assert all(mine.arrival < r.arrival for r in queue if r.client == mine.client), \
                        f"{rid} ({kind}) overtook an older request of its own client"
        for name in ("waiting", "running", "swapped"):
            held = Counter(r.client for r in getattr(e.scheduler, name))
            assert self.order.counts[name] == held, f"FairShare's {name} counts {self.order.counts[name]} != {held}"


OneClientMachine.TestCase.settings = SETTINGS
ClientsMachine.TestCase.settings = SETTINGS
test_one_client_is_scheduled_exactly_as_fcfs = OneClientMachine.TestCase
test_fair_share_across_clients_keeps_every_invariant = ClientsMachine.TestCase
