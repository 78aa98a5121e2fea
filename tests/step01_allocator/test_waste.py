"""Figure 2 accounting: paged vs Orca schedules on random traces (paper §3, §4.2).

Exact integer properties of the simulated schedules, on random short traces
and caches small enough to force preemption and head-of-line blocking:

* the four shares sum to 1 (up to float rounding, ``SHARES_SUM``) and are >= 0;
* every request finishes, all paged blocks are free at the end and the buddy
  arena is coalesced back into its roots;
* token-state slot-iterations are conserved: each request holds
  ``prompt + j`` tokens in the j-th iteration it runs, whatever the system;
* paged holds at most ``B - 1`` unfilled slots per live sequence;
* Orca (Oracle) has no internal fragmentation; free memory counts only while
  a request waits.
"""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import paged.step01_allocator.orca as orca_module
import paged.step01_allocator.paging as paging_module
from paged.step01_allocator import (
    BlockAllocator,
    BuddyAllocator,
    InvalidTraceError,
    TraceRequest,
    simulate_orca,
    simulate_paged,
)
from paged.step01_allocator.waste import CATEGORIES
from tests.strategies import block_sizes, length_traces
from tests.tolerances import SHARES_SUM

MAX_LEN = 80  # >= any drawn prompt + output (40 + 40)


def _trace(pairs):
    return [TraceRequest(p, o) for p, o in pairs]


def _token_slot_iterations(trace):
    # The j-th running iteration of a request (j = 1..output) holds prompt + j tokens.
    return sum(r.prompt_len * r.output_len + r.output_len * (r.output_len + 1) // 2 for r in trace)


def _run_all(trace, kv_slots, block_size):
    snaps = {}
    reports = [simulate_paged(trace, kv_slots, block_size, MAX_LEN,
                              observer=snaps.setdefault("paged", []).append)]
    for policy in ("max", "pow2", "oracle"):
        reports.append(simulate_orca(trace, kv_slots, policy, MAX_LEN,
                                     observer=snaps.setdefault(f"orca_{policy}", []).append))
    return reports, snaps


@given(pairs=length_traces(), block_size=block_sizes, kv_slots=st.integers(128, 600))
def test_waste_shares_sum_to_one_and_tokens_are_conserved(pairs, block_size, kv_slots):
    trace = _trace(pairs)
    reports, snaps = _run_all(trace, kv_slots, block_size)
    for report in reports:
        shares = report.shares()
        assert all(v >= 0 for v in shares.values())
        assert math.isclose(sum(shares.values()), 1.0, **SHARES_SUM)
        assert report.finished == len(trace)
        assert report.slot_iterations["token_states"] == _token_slot_iterations(trace), report.system
        assert report.iterations == len(snaps[report.system])
        for snap in snaps[report.system]:
            assert min(getattr(snap, c) for c in CATEGORIES) >= 0
            assert sum(getattr(snap, c) for c in CATEGORIES) <= kv_slots


@given(pairs=length_traces(), block_size=block_sizes, kv_slots=st.integers(128, 600))
def test_waste_paged_unfilled_slots_bounded_by_block_size_minus_one(pairs, block_size, kv_slots):
    snaps = []
    simulate_paged(_trace(pairs), kv_slots, block_size, observer=snaps.append)
    for s in snaps:
        assert s.reservation + s.internal_fragmentation <= (block_size - 1) * s.live


@given(pairs=length_traces(), kv_slots=st.integers(128, 600))
def test_waste_orca_oracle_never_over_reserves(pairs, kv_slots):
    snaps = []
    simulate_orca(_trace(pairs), kv_slots, "oracle", MAX_LEN, observer=snaps.append)
    assert all(s.internal_fragmentation == 0 for s in snaps)


@given(pairs=length_traces(), block_size=block_sizes, kv_slots=st.integers(128, 300),
       data=st.data())
def test_waste_every_block_and_slot_is_free_at_the_end(pairs, block_size, kv_slots, data):
    made = []

    class RecordingBlocks(BlockAllocator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    class RecordingBuddy(BuddyAllocator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paging_module, "BlockAllocator", RecordingBlocks)
        mp.setattr(orca_module, "BuddyAllocator", RecordingBuddy)
        order = data.draw(st.permutations(range(kv_slots // block_size)))  # shuffled free list
        simulate_paged(_trace(pairs), kv_slots, block_size, free_order=order)
        simulate_orca(_trace(pairs), kv_slots, "oracle", MAX_LEN)
    blocks, arena = made
    assert blocks.num_free == blocks.num_blocks
    assert arena.free_blocks() == arena.roots()


def test_waste_worked_example_paged():
    """Prompt 3, output 2, B = 4: 4 tokens in 1 block, then 5 tokens in 2 blocks."""
    report = simulate_paged([TraceRequest(3, 2)], kv_slots=8, block_size=4)
    assert report.slot_iterations == {
        "token_states": 4 + 5, "reservation": 0, "internal_fragmentation": 3,
        "external_fragmentation": 0,
    }
    assert report.shares()["token_states"] == 9 / 12


@pytest.mark.parametrize("exact, padding", [(True, 0), (False, 3)], ids=["exact", "classic"])
def test_waste_worked_example_orca_oracle(exact, padding):
    """Prompt 3, output 2: 5 slots reserved (8 with classic buddy padding)."""
    report = simulate_orca([TraceRequest(3, 2)], kv_slots=8, policy="oracle", exact_chunks=exact)
    assert report.slot_iterations == {
        "token_states": 4 + 5, "reservation": 1 + 0, "internal_fragmentation": 0,
        "external_fragmentation": 2 * padding,
    }


def test_waste_free_memory_counts_only_while_a_request_waits():
    # Two requests of 4 slots each reserve the Max of 8; the arena of 8 holds one.
    trace = [TraceRequest(2, 2), TraceRequest(2, 2)]
    snaps = []
    simulate_orca(trace, kv_slots=8, policy="max", max_len=8, observer=snaps.append)
    assert [s.live for s in snaps] == [1, 1, 1, 1]
    assert [s.external_fragmentation for s in snaps] == [0, 0, 0, 0]  # no free slot at all
    snaps = []
    simulate_orca(trace, kv_slots=12, policy="max", max_len=8, observer=snaps.append)
    assert [s.external_fragmentation for s in snaps] == [4, 4, 0, 0]  # 4 free while #2 waits


def test_waste_paged_preempts_when_the_cache_runs_out():
    trace = [TraceRequest(3, 6)] * 3  # 9 tokens each: 3 blocks of 4; the cache has 4
    report = simulate_paged(trace, kv_slots=16, block_size=4)
    assert report.preemptions > 0
    assert report.finished == 3
    assert report.slot_iterations["token_states"] == _token_slot_iterations(trace)


@pytest.mark.parametrize("trace, match", [
    ([], "no requests"),
    ([TraceRequest(0, 3)], "request 0: prompt_len and output_len must be >= 1"),
    ([TraceRequest(2, 2), TraceRequest(3, 0)], "request 1"),
    ([TraceRequest(70, 20)], "request 0: prompt_len \\+ output_len = 90 exceeds max_len = 80"),
], ids=["empty", "zero-prompt", "zero-output", "too-long"])
def test_waste_bad_trace_names_the_request(trace, match):
    with pytest.raises(InvalidTraceError, match=match):
        simulate_paged(trace, 256, 16, max_len=MAX_LEN)
    with pytest.raises(InvalidTraceError, match=match):
        simulate_orca(trace, 256, "pow2", max_len=MAX_LEN)


def test_waste_request_larger_than_the_cache_is_refused():
    with pytest.raises(InvalidTraceError, match="need 5 blocks of 16; the cache holds only 4"):
        simulate_paged([TraceRequest(40, 40)], kv_slots=70, block_size=16)
    with pytest.raises(InvalidTraceError, match="largest contiguous chunk \\(64\\) of 100 slots"):
        simulate_orca([TraceRequest(40, 40)], kv_slots=100, policy="oracle", max_len=MAX_LEN)
    with pytest.raises(ValueError, match="unknown Orca policy 'min'"):
        simulate_orca([TraceRequest(4, 4)], kv_slots=100, policy="min")
