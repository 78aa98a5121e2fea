"""The scenarios and machine settings that the order components' tests share (``test_fair_share.py``,
``test_priority.py``): each test runs them under FCFS and under its own order, with its own newcomer."""

from __future__ import annotations

from hypothesis import HealthCheck, settings, strategies as st

from tests.scheduler_harness import Harness, Lockstep, step05
from tests.step05_preemption.test_scheduler_model_free import MAX_LEN

HOGS, HOG_TOKENS, POOL = 20, 60, 80  # one client's 20 requests of 60 tokens need 20 x 16 blocks of 4: 4x the pool
SLOTS = 8  # max_num_seqs of the slot scenario


def flood_then_newcomer(order, mode: str, **newcomer) -> tuple[Harness, int, list]:
    """One client ("hog") fills the pool until its first preemption; then "new" (``newcomer``: its client,
    priority) asks for one token. Returns the harness, the iterations "new" took to finish, and those
    iterations. ``order`` None: FCFS."""
    h = Harness(step05, POOL, 4, preemption_mode=mode, swap_blocks=1000 if mode == "swap" else 0,
                **({"order": order} if order else {}))
    for i in range(HOGS):
        h.add(4, max_tokens=HOG_TOKENS, rid=f"hog{i}", client="hog", ignore_eos=True)
    while not any(e.kind == "preempted" for e in h.events):
        h.step()
    h.add(2, max_tokens=1, rid="new", **newcomer)
    start = len(h.history)
    while "new" in h.requests:
        h.step()
    return h, len(h.history) - start, h.history[start:]


def full_slots_then_newcomer(order, **newcomer) -> int:
    """12 requests of one client, ``SLOTS`` sequence slots, memory to spare: 8 run, 4 wait. After 5
    iterations "new" (``newcomer``) asks for one token. Returns the iterations it took; checks that no
    iteration planned more than ``SLOTS`` sequences, and runs every request to its end."""
    h = Harness(step05, 1000, 4, max_num_seqs=SLOTS, **({"order": order} if order else {}))
    for i in range(12):
        h.add(4, max_tokens=100, rid=f"hog{i}", client="hog", ignore_eos=True)
    for _ in range(5):
        h.step()
    h.add(2, max_tokens=1, rid="new", **newcomer)
    start = len(h.history)
    while "new" in h.requests:
        h.step()
    waited = len(h.history) - start
    h.run()
    assert all(len(it.plan.seq_ids) <= SLOTS for it in h.history)
    return waited


# the engines a machine draws (groups: up to 3 sequences)
ENGINES = dict(block_size=st.sampled_from([2, 4]), num_blocks=st.integers(6, 14),
               mode=st.sampled_from(["swap", "recompute", "auto"]), host_blocks=st.integers(0, 12),
               budget=st.sampled_from([None, 4, 9]), max_seqs=st.sampled_from([3, 4, 256]))
SETTINGS = settings(max_examples=5 * settings().max_examples, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def machine_harness(order, block_size, num_blocks, mode, host_blocks, budget, max_seqs, lockstep=False) -> Harness:
    """The harness a machine drives, for one draw of ``ENGINES``: with ``order``; ``lockstep``: stepped beside
    an FCFS twin that must plan, record and answer the same (``Lockstep``)."""
    args = (step05, num_blocks, block_size)
    kwargs = dict(preemption_mode=mode, swap_blocks=host_blocks, max_num_batched_tokens=budget or 2048,
                  max_num_seqs=max_seqs, max_model_len=MAX_LEN)
    return Lockstep(order, *args, **kwargs) if lockstep else Harness(*args, order=order, **kwargs)


def wide_group_then_newcomer(order, **newcomer) -> int:
    """A group of 3 sequences holds 3 of 8 blocks and every sequence slot (``max_num_seqs=3``); then "new"
    (``newcomer``), whose 12-token prompt needs 6 blocks, waits for the group's. Returns the iterations of
    the whole run, or -1 if it has not ended after 100: the order keeping a slot for "new" must not keep the
    group from running, or each would wait for the other for ever."""
    h = Harness(step05, 8, 2, preemption_mode="recompute", max_num_seqs=3, **({"order": order} if order else {}))
    h.add([3], max_tokens=3, rid="wide", client="wide", n=3, temperature=1.0, seed=1, ignore_eos=True)
    h.step()
    h.step()
    assert h.scheduler.kv.num_free == 5
    h.add(list(range(3, 15)), max_tokens=2, rid="new", **newcomer)
    for _ in range(100):
        if not h.has_unfinished():
            return len(h.history)
        h.step()
    return -1
