"""Step05's scheduling rules on the scheduler alone (no model): preemption, swapping, chunked prefill.

Step05's scheduler (the loop with ``Preemption``, ``SwappingKVManager``, ``ChunkedPrefill``) with
the stand-in runner (``tests/scheduler_harness.py``);
every equality is exact (queues, events, token counts).
"""

import logging

import pytest

from paged.step05_preemption.chunked import ChunkedPrefill
from paged.step05_preemption.policy import Cost
from tests.scheduler_harness import Harness, step05

pytestmark = pytest.mark.step05


def _pressure(mode, swap_blocks=16):
    """6 blocks of 4: A (3 tokens, 1 block) starts, then G (``n=2``: 5-token prompt, 2 blocks,
    forked), then S (1 token, 1 block); they decode until the pool runs out."""
    h = Harness(step05, num_blocks=6, swap_blocks=swap_blocks, preemption_mode=mode)
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
def test_rule_the_newest_group_is_the_victim_and_goes_back_in_arrival_order(mode, caplog):
    """A (the oldest) needs a block: S, the newest, is preempted; then G's two sequences need a block
    each and nobody newer is left, so G preempts itself. Victims go newest first; the queue they
    join (swapped, or waiting for recompute) is in arrival order: G before S."""
    h = _pressure(mode)
    with caplog.at_level(logging.DEBUG, logger="paged"):
        it = _until_preempted(h)
    assert it.running_before == ["A", "G", "S"] and it.kinds("preempted") == ["S", "G"]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", f"preempted S by {mode}"), ("DEBUG", f"preempted G by {mode}")]
    assert h.ids(h.running) == ["A"] and it.plan.seq_ids == [h.running[0].seqs[0].seq_id]
    assert h.ids(h.swapped if mode == "swap" else h.waiting) == ["G", "S"]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_rule_a_group_is_evicted_whole(mode):
    """Evicting G (``n=2``, sharing its prompt blocks) takes both its sequences, all or nothing: by
    swap every block of both tables moves to the host pool (shared ones once), by recompute both
    tables are emptied; none of G's sequences stays on the device."""
    h = Harness(step05, num_blocks=5, swap_blocks=16, preemption_mode=mode)
    h.add(3, max_tokens=12, rid="A")
    h.add(5, max_tokens=12, rid="G", n=2, temperature=1.0, seed=3)
    it = _until_preempted(h)
    assert it.kinds("preempted") == ["G"]
    g = [r for r in (h.swapped if mode == "swap" else h.waiting) if r.request_id == "G"][0]
    live = [s for s in g.seqs if not s.is_finished]
    assert len(live) == 2
    if mode == "swap":
        assert all(s.block_table.allocator is h.host and s.block_table.blocks for s in live)
        assert h.host.num_used == len({b for s in live for b in s.block_table.blocks})
    else:
        assert all(not s.block_table.blocks and s.block_table.num_tokens == 0 for s in live)
    device = {b for r in h.running for s in r.seqs for b in s.block_table.blocks}
    assert h.allocator.num_used == len(device)  # only A's blocks are on the device


def test_rule_swapped_groups_return_before_new_requests_oldest_first():
    """Under swap pressure with arrivals behind: in every iteration, the groups swapped in are the
    oldest of the swapped queue, in order; nobody new is admitted while a group stays swapped out,
    nor in an iteration that preempted."""
    h = Harness(step05, num_blocks=8, swap_blocks=32, preemption_mode="swap")
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
    assert h.allocator.num_used == 0 and h.host.num_used == 0


def test_rule_a_swapped_group_returns_only_with_room_for_its_next_tokens():
    """A group swapped back in beside running ones gets its blocks *and* one block per sequence for
    its next token, so it runs in the very iteration it returns; while the free blocks cover its
    blocks but not that room, it stays swapped out."""
    h = Harness(step05, num_blocks=8, swap_blocks=32, preemption_mode="swap")
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
    h = Harness(step05, num_blocks=6, swap_blocks=16, preemption_mode="swap")
    h.add(2, max_tokens=12, rid="A")
    g = h.add(5, max_tokens=12, rid="G", n=2, temperature=1.0, seed=3)
    assert _until_preempted(h).kinds("preempted") == ["G"]
    blocks = len({b for s in g.seqs for b in s.block_table.blocks})
    assert blocks == 3, (f"swapped out, G's two sequences map {blocks} distinct host blocks; they share their "
                         "prompt's blocks, so 3 (a shared block moved once per table instead of once?)")
    assert h.allocator.num_free == 4
    it = h.tick()
    assert it.kinds("swapped_in") == [] and h.ids(h.swapped) == ["G"] and h.ids(h.running) == ["A"]
    back = [it for it in h.run() if it.kinds("swapped_in")]
    assert len(back) == 1 and back[0].running_before == [] and h.outputs["A"].finished


def test_rule_a_prompt_is_chunked_to_the_token_budget():
    """Budget 5 tokens: a lone 12-token prompt runs as 5 + 5 + 2 and samples only after the last
    chunk; beside a decoding request D, the prompt takes what D's one token leaves (4)."""
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=5)
    h.add(12, max_tokens=2, rid="P")
    plans = [h.tick().plan for _ in range(3)]
    assert [p.query_lens for p in plans] == [[5], [5], [2]]
    assert [p.sample for p in plans] == [[False], [False], [True]]
    assert [p.positions[0] for p in plans] == [0, 5, 10]
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=5)
    h.add(2, max_tokens=8, rid="D")
    h.tick()
    h.add(9, max_tokens=1, rid="P")
    assert h.tick().plan.query_lens == [1, 4]


def test_rule_a_group_wider_than_the_budget_runs_whole_when_alone():
    """A group's sequences run together (beams in lockstep): 3 decoding sequences and a budget of 2
    tokens — it is not split, and runs over the budget because the plan is otherwise empty."""
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=4)
    h.add(4, max_tokens=3, n=3, temperature=1.0, seed=1)
    h.tick()  # the prompt (4 tokens), then the forks
    h.scheduler.max_num_batched_tokens = 2
    assert h.tick().plan.query_lens == [1, 1, 1]


def test_rule_a_request_that_outgrows_the_pool_alone_is_ended_not_preempted_forever(caplog):
    """Alone on the device and still short of blocks, a request can never continue: it is ended
    (``length``), not swapped out and in forever; a request waiting behind starts next iteration."""
    h = Harness(step05, num_blocks=2, swap_blocks=8, preemption_mode="swap")
    h.add(7, max_tokens=20, rid="A")  # 2 blocks; its 9th token needs a third, in iteration 3
    for _ in range(2):
        h.tick()
    h.add(1, max_tokens=1, rid="B")
    with caplog.at_level(logging.WARNING, logger="paged"):
        it = h.tick()
    assert h.finish_reasons("A") == ["length"] and it.kinds("preempted") == []
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "request A needs more KV blocks than the cache has (2); ending it")]
    assert it.kinds("admitted") == [] and h.ids(h.waiting) == ["B"]
    h.run(max_iterations=5)
    assert h.allocator.num_used == 0 and h.host.num_used == 0


def test_rule_preemption_mode_is_one_of_the_three():
    with pytest.raises(ValueError, match="preemption_mode must be one of"):
        Harness(step05, num_blocks=4, swap_blocks=4, preemption_mode="sometimes")


def test_rule_a_swap_moves_each_distinct_block_once_and_back():
    """Swapping G (``n=2``) and S out moves each distinct device block once, in table order, to a fresh
    host block: the plan's ``blocks_to_swap_out`` are those ``(device, host)`` pairs, and each table now
    maps the host block of every entry. Swapping back in does the reverse (``blocks_to_swap_in``)."""
    h = _pressure("swap")
    for _ in range(50):
        before = {r.request_id: [list(s.block_table.blocks) for s in r.seqs] for r in h.running}
        it = h.tick()
        if it.kinds("preempted"):
            break
    out = it.plan.blocks_to_swap_out
    victims = [b for rid in ("S", "G") for table in before[rid] for b in table]
    assert [d for d, _ in out] == list(dict.fromkeys(victims)) and len({hb for _, hb in out}) == len(out)
    to_host = dict(out)
    for r in h.swapped:
        assert [s.block_table.blocks for s in r.seqs] == [[to_host[b] for b in t] for t in before[r.request_id]]
    g = next(r for r in h.swapped if r.request_id == "G")
    host = [list(s.block_table.blocks) for s in g.seqs]
    it = next(it for it in (h.tick() for _ in range(50)) if "G" in it.kinds("swapped_in"))
    to_device = dict(it.plan.blocks_to_swap_in)
    assert [hb for hb, _ in it.plan.blocks_to_swap_in] == list(dict.fromkeys(b for t in host for b in t))
    assert [s.block_table.blocks[:len(t)] for s, t in zip(g.seqs, host)] == [[to_device[b] for b in t] for t in host]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_rule_preemption_is_counted_and_recorded_by_mode(mode):
    """Each preemption counts once under its mode (``preemptions``, for /metrics) and its record names it."""
    h = _pressure(mode)
    it = _until_preempted(h)
    assert h.scheduler.preemptions == {"swap": 2 * (mode == "swap"), "recompute": 2 * (mode == "recompute")}
    assert [ev.detail for ev in it.events if ev.kind == "preempted"] == [{"mode": mode}] * 2


@pytest.mark.parametrize("num_params, mode", [(1, "recompute"), (10**12, "swap")])
def test_rule_auto_preemption_prices_a_lone_sequence(num_params, mode):
    """``auto`` swaps a group (its samples' K/V cannot be recomputed apart) but prices a lone sequence:
    recomputing its tokens against moving its blocks twice, by the model's size (``policy.choose``)."""
    h = Harness(step05, num_blocks=3, swap_blocks=8, preemption_mode="auto", cost=Cost(num_params, 1024))
    h.add(4, max_tokens=6, rid="A")
    h.add(4, max_tokens=6, rid="B")
    it = _until_preempted(h)
    assert [ev.detail["mode"] for ev in it.events if ev.kind == "preempted"] == [mode]
    h = _pressure("auto")
    assert [ev.detail["mode"] for ev in _until_preempted(h).events if ev.kind == "preempted"] == ["recompute", "swap"]


def test_rule_swap_falls_back_to_recompute_when_the_host_pool_is_full():
    """``swap`` with no host blocks to take the victim: it is recomputed instead (nothing is lost)."""
    h = _pressure("swap", swap_blocks=0)
    it = _until_preempted(h)
    assert [ev.detail["mode"] for ev in it.events if ev.kind == "preempted"] == ["recompute", "recompute"]
    assert h.ids(h.waiting) == ["G", "S"]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_rule_preemption_does_not_change_what_a_request_draws(mode):
    """Under preemption every request draws exactly the tokens it draws in a pool with room for all: the
    stand-in's draws depend on the seed and the position, so a wrong position after a swap or a
    recomputation (or a token sampled twice, or skipped) shows. A recomputed request still reports the
    cached tokens of its first computation (none), not the prefix hits its recomputation found."""
    def run(num_blocks):
        h = Harness(step05, num_blocks=num_blocks, swap_blocks=16, preemption_mode=mode,
                    max_num_batched_tokens=6)
        for i in range(5):  # distinct prompts: no prefix hits but a recomputation's own
            h.add([3 + 50 * i + j for j in range(5 + 2 * i)], max_tokens=9, rid=f"r{i}", n=1 + i % 2,
                  temperature=1.0, seed=i)
        h.run(max_iterations=500)
        return h, {rid: ([o.token_ids for o in out.outputs], out.num_cached_tokens) for rid, out in h.outputs.items()}

    starved, got = run(10)
    assert sum(len(it.kinds("preempted")) for it in starved.history) >= 2
    assert got == run(64)[1]


def test_rule_a_group_back_alone_whose_next_tokens_cannot_fit_ends_at_once():
    """Pool 3: G (``n=2``, 2 shared blocks) must copy its shared last block for both samples while A runs:
    it is swapped out. When A is done G returns alone — its 2 blocks fit, but not the 2 copies its next
    tokens need on top: it can never continue, so it ends (``length``) in the iteration it returns."""
    h = Harness(step05, num_blocks=3, swap_blocks=8, preemption_mode="swap")
    h.add(1, max_tokens=3, rid="A")
    h.add(5, max_tokens=8, rid="G", n=2, temperature=1.0, seed=3)
    assert _until_preempted(h).kinds("preempted") == ["G"]
    back = next(it for it in (h.tick() for _ in range(10)) if it.kinds("swapped_in"))
    assert back.running_before == [] and back.kinds("finished") == ["G"]
    assert h.finish_reasons("G") == ["length", "length"] and not h.scheduler.has_unfinished()
    assert h.allocator.num_used == 0 and h.host.num_used == 0


def test_rule_a_group_wider_than_the_budget_waits_behind_others():
    """The other side of running over the budget when alone: beside a decoding request D, a group of 3
    decoding sequences and a budget of 2 tokens does not run (it is not split); when D is done it does."""
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=5)
    h.add(1, max_tokens=4, rid="D")
    group = h.add(4, max_tokens=3, rid="G", n=3, temperature=1.0, seed=1)
    h.tick()
    h.scheduler.max_num_batched_tokens = 2
    it = h.tick()
    assert it.plan.query_lens == [1] and not h.plan_seq(it, "G")
    h.run(max_iterations=10)
    assert [len(s.output_token_ids) for s in group.seqs] == [3, 3, 3]


def test_rule_a_chunked_prompt_forks_its_samples_after_its_last_chunk():
    """Budget 5: an ``n=2`` request's 12-token prompt runs as 5 + 5 + 2; its second sample is forked in the
    iteration of the last chunk (when the prompt's K/V is complete), not before."""
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=5)
    req = h.add(12, max_tokens=2, n=2, temperature=1.0, seed=4)
    plans = [h.tick().plan for _ in range(3)]
    assert [len(p.fanout) for p in plans] == [0, 0, 1] and len(req.seqs) == 2
    assert h.scheduler.prompt_tokens_total == 12


def test_rule_the_sequence_budget_caps_a_chunked_batch():
    """``max_num_seqs=2`` holds for chunked prefill too: of three one-block requests exactly the first two
    run; and a token budget spent to the last token leaves no room for an empty entry: a request waiting
    behind a prompt that takes the whole budget is not started with nothing to compute."""
    h = Harness(step05, num_blocks=16, max_num_seqs=2)
    for rid in "ABC":
        h.add(2, max_tokens=3, rid=rid)
    assert h.tick().kinds("admitted") == ["A", "B"] and h.ids(h.waiting) == ["C"]
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=5)
    h.add(12, max_tokens=1, rid="P")
    h.add(2, max_tokens=1, rid="Q")
    it = h.tick()
    assert it.plan.query_lens == [5] and it.kinds("admitted") == ["P"] and h.ids(h.waiting) == ["Q"]


def test_rule_a_group_that_fits_the_budget_left_runs_beside_others():
    """Budget 4: a decoding request D (1 token) and a group of 3 decoding sequences (3 tokens) fit it
    exactly, and run together."""
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=5)
    h.add(1, max_tokens=4, rid="D")
    h.add(4, max_tokens=3, rid="G", n=3, temperature=1.0, seed=1)
    h.tick()
    h.scheduler.max_num_batched_tokens = 4
    assert h.tick().plan.query_lens == [1, 1, 1, 1]


def test_rule_an_aborted_swapped_group_frees_its_host_blocks():
    """Aborting a group while it is swapped out takes it off the swapped queue and frees its host blocks;
    the others stay where they are. The scheduler's default preemption mode is ``auto``."""
    h = _pressure("swap")
    _until_preempted(h)
    s = next(r for r in h.swapped if r.request_id == "S")
    g_host = len({b for r in h.swapped if r.request_id == "G" for q in r.seqs for b in q.block_table.blocks})
    h.scheduler.abort(s)
    assert h.ids(h.swapped) == ["G"] and h.host.num_used == g_host
    assert Harness(step05, num_blocks=4, swap_blocks=4).scheduler.eviction.mode == "auto"


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_rule_the_records_agree_with_the_plans_under_preemption(mode):
    """A mixed batch (parallel samples, beams, a shared prefix, a long chunked prompt) in a starved pool,
    one request aborted on the way, so every kind of decision happens: after each iteration its records
    agree with its plan, its tables and its queues (``Harness.check_records``); every sequence is reported
    ``finished`` exactly once; an abort's records open the next iteration's."""
    h = Harness(step05, num_blocks=10, swap_blocks=16, preemption_mode=mode, max_num_batched_tokens=8)
    shared = [3 + j for j in range(8)]
    h.add(shared + [40, 41], max_tokens=8, rid="prefix-a")
    h.add(5, max_tokens=8, rid="parallel", n=3, temperature=1.0, seed=1)
    h.add(3, max_tokens=6, rid="beam", n=2, best_of=3, use_beam_search=True)
    h.add(shared + [50], max_tokens=8, rid="prefix-b")
    h.add(14, max_tokens=4, rid="long")
    doomed = h.add(3, max_tokens=30, rid="doomed")
    finished, seen, seq_ids = set(), set(), set()
    for step in range(300):
        if not h.scheduler.has_unfinished():
            break
        seq_ids |= {q.seq_id for r in h.requests.values() for q in r.seqs}
        if step == 4:
            h.abort("doomed")
            h.tick()
            assert [ev.kind for ev in h.events[:2]] == ["aborted", "finished"] and h.events[0].request_id == "doomed"
        else:
            h.tick()
        seq_ids |= {q.seq_id for r in h.requests.values() for q in r.seqs}
        h.check_records(finished)
        h.check_statuses()
        seen |= {ev.kind for ev in h.events}
    assert not h.scheduler.has_unfinished() and doomed.seqs[0].finish_reason == "abort"
    kinds = {"admitted", "allocated", "cow", "preempted", "finished", "aborted"}
    assert seen >= kinds | ({"swapped_out", "swapped_in"} if mode == "swap" else set()), seen
    assert finished == seq_ids and h.allocator.num_used == 0 and h.host.num_used == 0


def test_rule_a_chunked_prompt_starts_with_the_blocks_of_its_first_chunk():
    """Budget 5, pool 4: R decodes in 2 blocks, so a 12-token prompt's first chunk is 4 tokens — one block
    — and the 2 free blocks admit it at once, though the whole prompt will need 3."""
    h = Harness(step05, num_blocks=4, max_num_batched_tokens=5)
    h.add(5, max_tokens=6, rid="R")
    h.tick()
    h.add(list(range(100, 112)), max_tokens=1, rid="P")  # no prefix in common with R
    it = h.tick()
    assert it.kinds("admitted") == ["P"] and it.plan.query_lens == [1, 4]


def test_rule_a_chunk_over_a_cached_prefix_counts_the_blocks_past_it():
    """Budget 5, pool 3, all held by R (the 9-token prompt: its two full blocks named in the cache). P
    starts with those 8 tokens: its first chunk maps them (in use: no free block) and computes its 3 more
    tokens, which need a third block — none is free, so P waits until R is done (then it maps them parked)."""
    prompt = list(range(10, 19))
    h = Harness(step05, num_blocks=3, max_num_batched_tokens=5)
    h.add(prompt, max_tokens=3, rid="R")
    h.tick()
    h.add(prompt[:8] + [60, 61, 62], max_tokens=1, rid="P")
    it = h.tick()
    assert it.kinds("admitted") == [] and h.ids(h.waiting) == ["P"] and h.allocator.num_free == 0
    h.run(max_iterations=10)
    assert h.outputs["P"].num_cached_tokens == 8 and h.outputs["P"].error is None


def test_rule_a_recomputed_group_comes_back_when_every_sequence_fits():
    """Pool 4, recompute: G (``n=2``, one prompt token) is preempted beside A, and its two sequences —
    each to recompute its own tokens — come back only when the blocks of both fit, not of one: every
    request then finishes its 8 tokens, none ended for want of a block."""
    h = Harness(step05, num_blocks=4, swap_blocks=0, preemption_mode="recompute")
    h.add([3], max_tokens=8, rid="A")
    h.add([100], max_tokens=8, rid="G", n=2, temperature=1.0, seed=3)
    history = h.run(max_iterations=200)
    back = [i for i, it in enumerate(history) if "G" in it.kinds("admitted")]
    assert any("G" in it.kinds("preempted") for it in history) and len(back) == 2
    assert {r: [len(o.token_ids) for o in out.outputs] for r, out in h.outputs.items()} == {"A": [8], "G": [8, 8]}
    assert all(out.error is None for out in h.outputs.values())


def test_rule_a_decode_is_never_skipped_for_a_prompt_chunk():
    """The loop serves the decodes first, then the prompt chunks: P (older, 12 tokens, chunks of at most
    3) and D (newer, 2 tokens) start together; then with a budget of 3 tokens D still decodes its token,
    first in the plan, and P's chunk takes the 2 that are left — not P's 3 and no token for D."""
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=6, chunking=ChunkedPrefill(3))
    p = h.add(12, max_tokens=4, rid="P")
    d = h.add(2, max_tokens=4, rid="D")
    first = h.tick()
    assert first.kinds("admitted") == ["P", "D"] and first.plan.query_lens == [3, 2]
    h.scheduler.max_num_batched_tokens = 3
    plan = h.tick().plan
    assert plan.seq_ids == [d.seqs[0].seq_id, p.seqs[0].seq_id] and plan.query_lens == [1, 2]


def test_rule_a_newcomer_starts_while_a_long_prompt_is_mid_prefill():
    """With chunks of at most 4 tokens a 40-token prompt leaves room in a budget of 8: a request that
    arrives after its first chunk is admitted in the very next iteration, beside the second chunk, and
    draws its token there; without the cap the prompt takes the whole budget and the newcomer waits
    until the prompt is done (5 iterations)."""
    h = Harness(step05, num_blocks=32, max_num_batched_tokens=8, chunking=ChunkedPrefill(4))
    h.add(40, max_tokens=2, rid="long")
    h.tick()
    h.add(2, max_tokens=1, rid="new")
    it = h.tick()
    assert it.kinds("admitted") == ["new"] and it.plan.query_lens == [4, 2] and h.outputs["new"].finished
    uncapped = Harness(step05, num_blocks=32, max_num_batched_tokens=8)
    uncapped.add(40, max_tokens=2, rid="long")
    uncapped.tick()
    uncapped.add(2, max_tokens=1, rid="new")
    waits = 0
    while not uncapped.tick().kinds("admitted"):
        waits += 1
    assert waits == 4 and uncapped.last.plan.query_lens[-1] == 2


def test_rule_the_long_prefill_cap_is_an_int_of_zero_or_more():
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="long_prefill_token_threshold must be an int >= 0"):
            ChunkedPrefill(bad)


def test_rule_a_prompt_with_two_tokens_left_is_a_chunk_served_after_the_decodes():
    """A prompt with exactly two tokens left to compute is still a prompt chunk, not a decode: with a budget
    of 2, the decoding D (newer) gets its token first and P's chunk the one token left."""
    h = Harness(step05, num_blocks=16, max_num_batched_tokens=6, chunking=ChunkedPrefill(3))
    p = h.add(8, max_tokens=4, rid="P")
    d = h.add(2, max_tokens=4, rid="D")
    h.tick()  # P 3, D 2
    h.tick()  # D 1, P 3: P has 2 left
    assert p.seqs[0].num_pending == 2
    h.scheduler.max_num_batched_tokens = 2
    plan = h.tick().plan
    assert plan.seq_ids == [d.seqs[0].seq_id, p.seqs[0].seq_id] and plan.query_lens == [1, 1]


def test_rule_a_cap_of_one_token_computes_a_prompt_one_token_an_iteration():
    """``long_prefill_token_threshold=1``: a 2-token prompt runs as 1 + 1 (the cap holds for a chunk of any
    size above a decode's one token)."""
    h = Harness(step05, num_blocks=16, chunking=ChunkedPrefill(1))
    h.add(2, max_tokens=1, rid="P")
    assert [h.tick().plan.query_lens for _ in range(2)] == [[1], [1]] and h.outputs["P"].finished


@pytest.mark.parametrize("tokens, blocks, bytes_per_block, device, expected", [
    (10, 1, 5e9, "cpu", "swap"),  # recompute 10 * 2 * 5e9 / 5e10 = 2.0 s == swap 2 * 1 * 5e9 / 5e9: a tie swaps
    (10, 1, 5.25e9, "cpu", "recompute"),  # swap 2.1 s > 2.0 s
    (10, 1, 4.75e9, "cpu", "swap"),  # swap 1.9 s < 2.0 s
    (10, 2, 2.4e9, "cpu", "swap"),  # swap 2 * 2 * 2.4e9 / 5e9 = 1.92 s
    (10, 2, 2.6e9, "cpu", "recompute"),  # 2.08 s
    (10, 1, 5e9, "tpu", "swap"),  # an unknown device is priced as a CPU
    (10, 1, 1.25e10, "cuda", "recompute"),  # cuda: recompute 10 * 2 * 5e9 / 1e14 = 1e-3 s, swap 1.0 s
])
def test_rule_auto_prices_recompute_against_swap_at_the_devices_rates(tokens, blocks, bytes_per_block, device,
                                                                       expected):
    """``choose`` in ``auto`` mode, for one lone sequence of a 5e9-parameter model, at the boundary: recompute
    costs ``tokens x 2 x params / FLOP/s``, a swap ``2 x blocks x bytes / bandwidth`` (out and back in), at
    the rates of ``RATES`` (an unknown device takes the CPU's); recompute only when strictly cheaper."""
    from paged.step05_preemption.policy import choose

    assert choose("auto", 1, tokens, blocks, 8, 5_000_000_000, bytes_per_block, device) == expected


def test_rule_a_victim_swaps_when_the_host_pool_has_exactly_its_blocks():
    """Swap needs the victim's distinct blocks free in the host pool, no more: 3 blocks and 3 free swap,
    3 blocks and 2 free recompute."""
    from paged.step05_preemption.policy import choose

    assert choose("swap", 1, 10, 3, 3, 1, 1, "cpu") == "swap" and choose("swap", 1, 10, 3, 2, 1, 1, "cpu") == "recompute"


def test_rule_preemption_defaults_and_what_it_weighs():
    """``Preemption()`` is ``auto`` over default costs; its answer for a victim weighs the cost's device
    (a 1e9-parameter model on a GPU recomputes a few tokens faster than it moves a 4 MiB block twice, on a
    CPU not)."""
    from paged.step05_preemption.policy import Preemption

    assert Preemption().mode == "auto" and Preemption().cost == Cost()
    answers = {}
    for device in ("cpu", "cuda"):
        h = Harness(step05, num_blocks=3, swap_blocks=8, preemption_mode="auto",
                    cost=Cost(10**9, 2**22, device))
        h.add(4, max_tokens=6, rid="A")
        h.add(4, max_tokens=6, rid="B")
        answers[device] = [ev.detail["mode"] for ev in _until_preempted(h).events if ev.kind == "preempted"]
    assert answers == {"cpu": ["swap"], "cuda": ["recompute"]}


def test_rule_a_swapping_kv_manager_defaults_to_no_host_pool_and_caching():
    """``SwappingKVManager(N, B)``: no host block, prefix caching on; ``free_order`` reaches its device pool."""
    from paged.step05_preemption import SwappingKVManager

    kv = SwappingKVManager(4, 4)
    assert kv.host.num_blocks == 0 and kv.caching
    assert SwappingKVManager(4, 4, free_order=[2, 0, 3, 1]).allocator.free_blocks() == [2, 0, 3, 1]


def test_rule_stats_count_the_swapped_queue_and_the_host_pool():
    """Step05's stats add the host pool's blocks and count the swapped queue and each preemption by mode."""
    h = _pressure("swap")
    _until_preempted(h)
    s = h.scheduler.stats()
    assert (s["swapped"], s["preemptions"], s["swap_blocks_total"]) == (2, {"swap": 2, "recompute": 0}, 16)
    assert s["swap_blocks_used"] == h.host.num_used > 0


def test_rule_a_swapped_group_returns_when_its_blocks_and_next_tokens_fit_exactly():
    """Pool 5: A, B and the group G (``n=3``, 2-token prompt: one block shared by its three samples) start.
    G's samples then need a block each for copy-on-write, none is left: G, the newest, is swapped out
    (one host block). Next iteration A has finished; B holds 1 block, so 4 are free — exactly G's one
    block plus one per sample for its next token — and G comes back and runs in that iteration."""
    h = Harness(step05, num_blocks=5, swap_blocks=32, preemption_mode="swap", max_num_batched_tokens=6)
    h.add(2, max_tokens=2, rid="A")
    h.add(2, max_tokens=5, rid="B")
    g = h.add(2, max_tokens=8, rid="G", n=3, temperature=1.0, seed=2)
    h.tick()
    assert h.tick().kinds("preempted") == ["G"] and h.ids(h.swapped) == ["G"]
    it = h.tick()
    assert it.running_before == ["B"] and it.kinds("swapped_in") == ["G"] and len(it.plan.blocks_to_swap_in) == 1
    assert all(s.seq_id in it.plan.seq_ids for s in g.seqs)


def test_rule_a_swapped_group_wider_than_the_budget_left_waits_whole():
    """Budget 4, groups of three samples: while B's three sequences take 3 of the 4 tokens, the swapped group
    G (three sequences, one token each) does not fit the 1 left; it is not split, and stays swapped out
    until it runs whole (alone, when B is done; it is ended later, outgrowing the pool alone)."""
    h = Harness(step05, num_blocks=6, swap_blocks=32, preemption_mode="swap", max_num_batched_tokens=4)
    h.add(1, max_tokens=3, rid="A", n=3, temperature=1.0, seed=0)
    h.add(1, max_tokens=7, rid="B", n=3, temperature=1.0, seed=1)
    h.add(1, max_tokens=10, rid="G", n=3, temperature=1.0, seed=2)
    history = h.run()
    waits = [it for it in history if it.swapped_before == ["G"] and it.running_before == ["B"]]
    assert waits and all(not it.kinds("swapped_in") and len(it.plan.seq_ids) == 3 for it in waits)
    back = [it for it in history if it.kinds("swapped_in") == ["G"]]
    assert len(back) == 1 and back[0].running_before == [] and len(back[0].plan.seq_ids) == 3
    assert h.outputs["G"].finished and h.allocator.num_used == 0 and h.host.num_used == 0
