"""Step04's scheduling rules on the scheduler alone (no model): prefix lookups and groups.

Step04's scheduler (the loop over a ``SharingKVManager`` with ``SequenceGroups`` decoding) with the
stand-in runner (``tests/scheduler_harness.py``); every equality is exact (token counts, positions, block ids).
"""

import pytest

from paged.errors import RequestError
from paged.step01_allocator import OutOfBlocksError
from paged.sampling.result import num_top_logprobs
from paged.step03_attention.stand_in import token_for
from paged.step04_sharing import SharingKVManager, sample_seed
from tests.beam_oracle import HistoryStandIn, beam_search, proposals_of
from tests.scheduler_harness import EOS, Harness, NumberTokenizer, step04

pytestmark = pytest.mark.step04

PROMPT = list(range(10, 19))  # 9 tokens: blocks [0..3] [4..7] [8]


@pytest.mark.parametrize("length, cached", [(8, 4), (9, 8), (4, 0), (5, 4)])
def test_rule_a_cached_prefix_never_covers_a_prompts_last_token(length, cached):
    """A prompt whose first blocks are cached maps them, except the block holding its last token,
    which is always computed (its logits are needed, and generated tokens must not write into a
    block another request may read): an 8-token prompt over two cached full blocks computes 4."""
    h = Harness(step04, num_blocks=16)
    h.add(PROMPT, max_tokens=1, rid="first")
    h.run()
    h.add(PROMPT[:length], max_tokens=1, rid="again")
    it = h.tick()
    assert it.plan.positions[0] == cached and it.plan.query_lens == [length - cached]
    assert h.outputs["again"].num_cached_tokens == cached


def test_rule_a_group_computes_its_prompt_once_and_forks():
    """``n=3``: one sequence computes the 6-token prompt; its two siblings are forked in the same
    iteration and map the same 2 blocks (reference count 3), no block copied yet."""
    h = Harness(step04, num_blocks=16)
    req = h.add(6, max_tokens=2, n=3, temperature=1.0, seed=1)
    it = h.tick()
    assert it.plan.query_lens == [6] and len(req.seqs) == 3
    tables = [s.block_table.blocks for s in req.seqs]
    assert tables[0] == tables[1] == tables[2] and len(tables[0]) == 2
    assert all(h.allocator.ref_count(b) == 3 for b in tables[0])


BEAMS = [  # k, n, length_penalty, early_stopping, more params, max_model_len, vocab of the proposals
    (3, 2, 1.0, False, {}, 4096, 24),
    (4, 4, 0.0, True, {}, 4096, 24),
    (2, 2, 0.5, "never", {}, 4096, 24),
    (3, 3, 1.0, False, {"logprobs": 9}, 4096, 24),  # 9 > 2k proposals: the answer carries all of them
    (4, 4, 0.0, True, {"logprobs": 9}, 4096, 24),  # ... also for the hypotheses ended by EOS
    (2, 1, 1.0, False, {"ignore_eos": True, "stop_token_ids": [5]}, 4096, 24),  # a stop id ends, EOS does not
    (3, 2, 1.0, False, {}, len(PROMPT) + 5, 24),  # the context is full before max_tokens
    (2, 2, 1.0, False, {}, 4096, 8),  # EOS often: k hypotheses end early, the search weighs live against them
    (2, 2, 1.0, True, {}, 4096, 8),  # ... and stops once k have ended
    (2, 2, 0.5, "never", {}, 4096, 8),  # ... or not while a live beam could still win at max_tokens
]


@pytest.mark.parametrize("k, n, length_penalty, early_stopping, more, max_model_len, vocab", BEAMS,
                         ids=["k3", "k4-early", "k2-never", "k3-logprobs", "k4-early-logprobs", "k2-stop-id",
                              "k3-context", "k2-eos-often", "k2-eos-often-early", "k2-eos-often-never"])
def test_rule_beam_search_returns_the_best_candidates(k, n, length_penalty, early_stopping, more, max_model_len,
                                                     vocab):
    """Beam search on the scheduler alone, its beams forking and dropping over shared blocks, equals the
    oracle over whole candidates (``tests/beam_oracle.py``) fed the same proposals: the same tokens and
    texts, the same cumulative log-probabilities bit for bit (the same float additions in the same order),
    finish and stop reasons, and, when asked for, each token's proposals. While it runs, its outputs are
    its live beams as they stand; every beam nobody chose is reported ``dropped`` and every sequence is
    released to the workers once; every block is free at the end."""
    tokenizer = NumberTokenizer()
    h = Harness(step04, num_blocks=64, max_model_len=max_model_len, tokenizer=tokenizer,
                runner=lambda s: HistoryStandIn(s, EOS, vocab))
    params = dict(n=n, best_of=k, use_beam_search=True, length_penalty=length_penalty,
                  early_stopping=early_stopping, **more)
    req = h.add(PROMPT, max_tokens=8, rid="beam", **params)
    seq_ids = set()
    for _ in range(20):  # bounded: a search that never ends fails here instead of hanging
        if not h.scheduler.has_unfinished():
            break
        seq_ids |= {s.seq_id for s in req.seqs}
        h.tick()
        seq_ids |= {s.seq_id for s in req.seqs}
        out = h.outputs["beam"]
        if not out.finished:
            assert [o.token_ids for o in out.outputs] == [s.output_token_ids for s in req.seqs]
    count = num_top_logprobs(req.params)
    stops = set(more.get("stop_token_ids", [])) | (set() if more.get("ignore_eos") else {EOS})
    expected = beam_search(lambda tokens: proposals_of(PROMPT + tokens, count, EOS, vocab), k, n,
                           min(8, max_model_len - len(PROMPT)), length_penalty, early_stopping, stops.__contains__)
    assert out.finished and out.error is None
    assert [o.token_ids for o in out.outputs] == [e.token_ids for e in expected]
    assert [o.text for o in out.outputs] == [tokenizer.decode(e.token_ids) for e in expected]
    assert [o.cumulative_logprob for o in out.outputs] == [e.cumulative_logprob for e in expected]
    assert [(o.finish_reason, o.stop_reason) for o in out.outputs] == [
        ("length", None) if e.ended_by is None else ("stop", None if e.ended_by == EOS else e.ended_by)
        for e in expected]
    assert [o.logprobs for o in out.outputs] == [e.logprobs if "logprobs" in more else None for e in expected]
    last = {s.seq_id for s in req.seqs}
    reasons = {ev.seq_id: ev.detail["reason"] for it in h.history for ev in it.events if ev.kind == "finished"}
    assert reasons == {i: "stop" if i in last else "dropped" for i in seq_ids}
    released = [i for it in h.history for i in it.plan.finished_seq_ids] + h.scheduler.schedule().finished_seq_ids
    assert sorted(released) == sorted(seq_ids)
    assert h.allocator.num_used == 0


def test_rule_a_beam_search_ended_early_answers_with_its_live_beams():
    """Step04 cannot preempt: a beam search that runs out of blocks ends (``kv_cache_exhausted``), and its
    live beams, as they stand after ``j`` tokens, join its finished hypotheses — so it answers what the
    oracle answers for ``max_tokens = j``, bit for bit; every block is free."""
    h = Harness(step04, num_blocks=6, runner=lambda s: HistoryStandIn(s, EOS))
    req = h.add(PROMPT, max_tokens=8, rid="beam", n=2, best_of=3, use_beam_search=True)
    h.run()
    j = len(h.history) - 1  # one token per beam in each iteration but the last, which ended it
    assert 1 < j < 8 and h.last.kinds("finished") == ["beam"]
    assert {ev.detail["reason"] for ev in h.last.events if ev.kind == "finished"} == {"kv_cache_exhausted"}
    expected = beam_search(lambda tokens: proposals_of(PROMPT + tokens, num_top_logprobs(req.params), EOS),
                           3, 2, j, 1.0, False, {EOS}.__contains__)
    out = h.outputs["beam"]
    assert out.finished and [o.token_ids for o in out.outputs] == [e.token_ids for e in expected]
    assert [o.cumulative_logprob for o in out.outputs] == [e.cumulative_logprob for e in expected]
    assert h.allocator.num_used == 0


def test_rule_a_write_into_a_shared_block_copies_it_first():
    """``n=2`` over a 6-token prompt: both samples map blocks [0..3] [4, 5]. Their first decode writes
    position 6, into the shared, partly filled second block: the first sample takes a new block and
    the plan copies the old one into it (``blocks_to_copy``, one ``cow`` record); the second is then
    the block's only owner and writes in place. The full first block stays shared."""
    h = Harness(step04, num_blocks=16)
    req = h.add(6, max_tokens=3, n=2, temperature=1.0, seed=1)
    h.tick()
    first, second = (list(s.block_table.blocks) for s in req.seqs)
    assert first == second and len(first) == 2 and h.last.plan.blocks_to_copy == []
    it = h.tick()
    (src, dst), = it.plan.blocks_to_copy
    assert src == first[1] and [s.block_table.blocks for s in req.seqs] == [[first[0], dst], [first[0], src]]
    assert [(ev.seq_id, ev.detail) for ev in it.events if ev.kind == "cow"] == [
        (req.seqs[0].seq_id, {"src": src, "dst": dst})]
    assert [h.allocator.ref_count(b) for b in (first[0], src, dst)] == [2, 1, 1]


def test_rule_blocks_filled_by_generation_are_cached_too():
    """A 6-token prompt that generates 7 tokens has K/V for 12 positions: three full blocks, the third
    holding generated tokens. A later prompt made of those 12 tokens and one more maps all three from
    the cache (12 cached tokens) and computes only its last token."""
    h = Harness(step04, num_blocks=16)
    first = h.add(6, max_tokens=7, rid="first")
    h.run()
    tokens = first.seqs[0].token_ids
    h.add(tokens[:12] + [99], max_tokens=1, rid="again")
    it = h.tick()
    assert it.plan.positions == [12] and it.plan.query_lens == [1]
    assert h.outputs["again"].num_cached_tokens == 12


def test_rule_a_request_for_prompt_logprobs_maps_no_cached_block():
    """Prompt log-probabilities need every prompt row computed, so a request that asks for them maps
    none of its cached blocks: the same 9-token prompt whose first 8 tokens are cached computes all 9."""
    h = Harness(step04, num_blocks=16)
    h.add(PROMPT, max_tokens=1, rid="first")
    h.run()
    h.add(PROMPT, max_tokens=1, rid="logprobs", prompt_logprobs=0)
    h.add(PROMPT, max_tokens=1, rid="plain")
    it = h.tick()
    assert it.plan.positions[0::9] == [0, 8] and it.plan.query_lens == [9, 1]
    assert [h.outputs[r].num_cached_tokens for r in ("logprobs", "plain")] == [0, 8]


def test_rule_parallel_sample_i_starts_from_the_seed_sample_seed():
    """``n=3`` seeded 5: the prompt's iteration forks two samples, and sample ``i`` draws its first token
    from the seed ``sample_seed(5, i)`` (sample 0 keeps the request's own): as a lone ``n=1`` request with
    that seed does. (The stand-in keys later draws by the request's seed; that each sample then follows
    its own generator is the engine's part, checked with a model in ``test_sharing_engine.py``.)"""
    h = Harness(step04, num_blocks=16)
    h.add(6, max_tokens=2, rid="group", n=3, temperature=1.0, seed=5)
    for i in range(3):
        h.add(6, max_tokens=1, rid=f"lone{i}", temperature=1.0, seed=sample_seed(5, i))
    it = h.tick()
    parent = it.plan.seq_ids[0]
    assert [(p, seed) for p, _, seed in it.plan.fanout] == [(parent, sample_seed(5, 1)), (parent, sample_seed(5, 2))]
    assert sample_seed(5, 0) == 5 and len({sample_seed(5, i) for i in range(8)}) == 8
    first = [o.token_ids for o in h.outputs["group"].outputs]
    assert first == [h.outputs[f"lone{i}"].outputs[0].token_ids for i in range(3)]


def test_rule_a_finished_sample_gives_its_blocks_back_before_its_siblings_end():
    """``n=2``: sample 1 draws a stop token as its first token, sample 0 goes on. From that iteration on,
    sample 1's table is empty and the prompt blocks it shared hold sample 0's reference only."""
    h = Harness(step04, num_blocks=16)
    stop = token_for(sample_seed(7, 1), 6)  # the stand-in draws from (seed, position)
    req = h.add(6, max_tokens=8, n=2, temperature=1.0, seed=7, stop_token_ids=[stop])
    h.tick()
    zero, one = req.seqs
    assert one.is_finished and one.output_token_ids == [stop] and not zero.is_finished
    assert one.block_table.blocks == [] and [h.allocator.ref_count(b) for b in zero.block_table.blocks] == [1, 1]
    assert h.allocator.num_used == 2
    h.run()
    assert h.outputs[req.request_id].error is None and len(zero.output_token_ids) == 8


def test_rule_a_prompt_whose_cached_blocks_are_in_use_needs_blocks_only_for_the_rest():
    """A (the 9-token prompt) runs and holds 3 of 4 blocks, its two full ones named in the cache. B, the
    same prompt, maps those two (in use: they take no free block) and needs one block for its last
    token: the one free block admits it at once."""
    h = Harness(step04, num_blocks=4)
    h.add(PROMPT, max_tokens=3, rid="A")
    h.tick()
    h.add(PROMPT, max_tokens=1, rid="B")
    it = h.tick()
    assert it.kinds("admitted") == ["B"] and h.outputs["B"].num_cached_tokens == 8
    assert it.plan.query_lens == [1, 1] and it.plan.positions == [9, 8]  # A's decode, B's last prompt token


def test_rule_a_hit_on_a_parked_block_takes_a_free_block():
    """A cached block nobody maps is parked on the free list: a hit on it takes it off. A (the 9-token
    prompt) ended, its two full blocks parked; C holds 2 of the 4 blocks, so 2 are free — both parked.
    B, the same prompt, needs them and one more for its last token: it waits until C is done."""
    h = Harness(step04, num_blocks=4)
    h.add(PROMPT, max_tokens=1, rid="A")
    h.run()
    h.add(list(range(40, 45)), max_tokens=2, rid="C")
    h.add(PROMPT, max_tokens=1, rid="B")
    it = h.tick()
    assert it.kinds("admitted") == ["C"] and h.allocator.num_free == 2 and h.ids(h.waiting) == ["B"]
    h.tick()
    assert h.tick().kinds("admitted") == ["B"] and h.outputs["B"].num_cached_tokens == 8


def test_rule_the_hit_rate_is_found_blocks_over_looked_up_blocks():
    """The 9-token prompt twice: the first looks up its first block and misses (1 lookup), the second
    finds both cacheable blocks (2 lookups, 2 hits): 2 of 3. With prefix caching off nothing is looked
    up or found, and the second prompt computes all 9 tokens."""
    for caching, rate, computed in ((True, 2 / 3, 1), (False, 0.0, 9)):
        h = Harness(step04, num_blocks=16, enable_prefix_caching=caching)
        h.add(PROMPT, max_tokens=1, rid="first")
        h.run()
        h.add(PROMPT, max_tokens=1, rid="again")
        assert h.tick().plan.query_lens == [computed]
        assert h.scheduler.kv.hit_rate() == rate
        assert [h.outputs[r].error for r in ("first", "again")] == [None, None]


@pytest.mark.parametrize("group", [dict(n=3, temperature=1.0, seed=2), dict(n=1, best_of=3, use_beam_search=True)],
                         ids=["parallel", "beam"])
def test_rule_a_group_held_back_does_not_hold_back_the_groups_behind_it(group):
    """Running groups are given their tokens oldest first, each on its own: a group of 3 sequences that
    the sequence budget (2) holds back is skipped (and, having drawn nothing, not reported), and the
    single request behind it still runs."""
    h = Harness(step04, num_blocks=16, runner=lambda s: HistoryStandIn(s, EOS, vocab=64))
    g = h.add(3, max_tokens=4, rid="G", **group)
    h.add(3, max_tokens=4, rid="S")
    h.tick()
    assert len(g.seqs) == 3
    h.scheduler.max_num_seqs = 2
    it = h.tick()
    assert [r.request_id for r in it.touched] == ["S"] and it.plan.query_lens == [1]


def test_rule_a_beam_search_failed_before_its_first_token_answers_empty():
    """A beam search that fails in its prompt's iteration still answers (with its error): its one live
    beam, no token, a cumulative log-probability of 0 — not of anything made up."""
    h = Harness(step04, num_blocks=16)
    req = h.add(PROMPT, max_tokens=4, rid="beam", n=1, best_of=2, use_beam_search=True)
    plan = h.scheduler.schedule()
    bad = RequestError("a logits processor refused")
    h.scheduler.fail(req, bad)
    h.scheduler.update(plan, {})
    out = req.to_output()
    assert out.finished and out.error is bad
    assert [(o.token_ids, o.cumulative_logprob) for o in out.outputs] == [([], 0.0)]


def test_rule_samples_are_numbered_and_blocks_come_in_free_list_order():
    """``n=3``: completions 0, 1, 2; the prompt's blocks are the free list's first, whatever its order; an
    ``allocated`` record names a prefix hit as ``cached``, before the block taken for the rest."""
    h = Harness(step04, num_blocks=8, free_order=[6, 3, 0, 7, 1, 2, 4, 5])
    req = h.add(PROMPT, max_tokens=1, rid="first", n=3, temperature=1.0, seed=2)
    it = h.tick()
    assert [o.index for o in h.outputs["first"].outputs] == [0, 1, 2]
    assert [(ev.seq_id, ev.detail) for ev in it.events if ev.kind == "allocated"] == [
        (req.seqs[0].seq_id, {"blocks": [6, 3, 0], "cached": []})]
    again = h.add(PROMPT, max_tokens=1, rid="again")
    it = h.tick()
    assert [(ev.seq_id, ev.detail) for ev in it.events if ev.kind == "allocated"] == [
        (again.seqs[0].seq_id, {"blocks": [7], "cached": [6, 3]})]  # 7: next on the free list


def test_rule_a_kv_manager_caches_prefixes_unless_told_not_to():
    """The ``SharingKVManager`` defaults: prefix caching on, tables that reuse cached blocks, and block counts
    that count the hits."""
    bm = SharingKVManager(8, 4)
    table = bm.new_table()
    assert bm.caching and table.reuse_cached
    bm.allocate_prompt(table, PROMPT)
    bm.register_full_blocks(table, PROMPT)
    assert bm.blocks_needed_for_prompt(PROMPT) == 1 and bm.blocks_needed_for_prompt(PROMPT, reuse_cached=False) == 3


def test_rule_a_prefix_cached_in_pieces_is_found_whole():
    """B's 13-token prompt starts with the 8 tokens of A's two cached blocks and computes its third block
    itself, naming it after them; C, B's prompt again, then finds all three (12 cached tokens)."""
    h = Harness(step04, num_blocks=16)
    h.add(PROMPT, max_tokens=1, rid="A")
    h.run()
    b = PROMPT[:8] + [30, 31, 32, 33, 34]
    h.add(b, max_tokens=1, rid="B")
    h.run()
    h.add(b, max_tokens=1, rid="C")
    h.run()
    assert [h.outputs[r].num_cached_tokens for r in "ABC"] == [0, 8, 12]


def test_rule_a_copy_on_write_with_no_block_free_fails_whole():
    """A table's copy-on-write needs a block for the copy: with none free, ``append`` raises, saying so,
    and changes nothing (the scheduler counts that block first, so it never gets here)."""
    bm = SharingKVManager(3, 4, enable_prefix_caching=False)
    table = bm.new_table()
    bm.allocate_prompt(table, [5, 6, 7, 8, 9])  # 2 blocks, the second partly filled
    child = table.fork()
    other = bm.new_table()
    bm.allocate_prompt(other, [5])  # the last free block
    with pytest.raises(OutOfBlocksError) as caught:
        child.append(1)
    assert str(caught.value) == "cannot append 1 tokens: needs 1 blocks (one for copy-on-write), 0 free"
    assert child.blocks == table.blocks and child.take_copies() == []


def test_rule_a_request_for_prompt_logprobs_counts_its_cached_prefix_as_new_blocks():
    """R holds the 9-token prompt's 3 blocks (two cached) of a 4-block pool: one is free. The same prompt
    asking for prompt logprobs maps no cached block, so it needs 3 free blocks, not 1: it waits for R."""
    h = Harness(step04, num_blocks=4)
    h.add(PROMPT, max_tokens=3, rid="R")
    h.tick()
    h.add(PROMPT, max_tokens=1, rid="L", prompt_logprobs=0)
    assert h.tick().kinds("admitted") == [] and h.ids(h.waiting) == ["L"] and h.allocator.num_free == 1
    h.run(max_iterations=10)
    assert h.outputs["L"].num_cached_tokens == 0 and h.outputs["L"].error is None


class ChosenProposals:
    """A stand-in runner whose beams propose what the test chooses: ``propose(generated tokens)`` ->
    ``{token: logprob}`` in the order given (ties and end tokens where the test wants them)."""

    def __init__(self, scheduler, propose):
        self.scheduler, self.propose = scheduler, propose

    def execute(self, plan):
        from paged.sampling.result import SampleResult

        out = {}
        for i, seq_id in enumerate(plan.seq_ids):
            if plan.sample[i]:
                seq = next(s for r in self.scheduler.running for s in r.seqs if s.seq_id == seq_id)
                tops = self.propose(list(seq.output_token_ids))
                first = next(iter(tops))
                out[seq_id] = SampleResult(first, tops[first], tops)
        return out


def _beam(propose, max_tokens=2, **params):
    h = Harness(step04, num_blocks=32, runner=lambda s: ChosenProposals(s, propose))
    h.add(PROMPT, max_tokens=max_tokens, rid="beam", use_beam_search=True, **params)
    h.run(max_iterations=20)
    out = h.outputs["beam"]
    assert out.finished and out.error is None and h.allocator.num_used == 0
    return [o.token_ids for o in out.outputs]


def test_rule_beam_ties_go_to_the_earlier_beam_then_the_lower_token():
    """Chosen proposals that tie: the prompt's row proposes 9, 7 and 5 at the same log-probability (listed
    out of order) and 11 below; width 2 takes 5 and 7. Both beams then propose 3 and 4 at the same score:
    the earlier beam (5) takes both and the other is dropped. With width 1 the 2k = 2 kept proposals of
    three tied ones are the two lowest tokens, so 5 is chosen, not the first listed."""
    first = {9: -1.0, 7: -1.0, 5: -1.0, 11: -3.0}
    after = {4: -0.5, 3: -0.5, 6: -2.0, 8: -2.0}
    assert _beam(lambda t: first if not t else after, n=2, best_of=2) == [[5, 3], [5, 4]]
    assert _beam(lambda t: {9: -1.0, 7: -1.0, 5: -1.0}, max_tokens=1, n=1, best_of=1, logprobs=3) == [[5]]


def test_rule_a_beam_search_whose_every_pick_ends_finishes_at_once():
    """When each of a beam's 2k best proposals ends the sequence (EOS, a stop token id), no beam lives on:
    the search ends with those hypotheses, best first. Only the 2k best compete — a fifth proposal (here
    asked for by ``logprobs=5``) that would have continued is not taken."""
    ends = {EOS: -0.1, 99: -0.2, 98: -0.3, 97: -0.4, 5: -0.5}
    assert _beam(lambda t: ends, max_tokens=4, n=2, best_of=2, stop_token_ids=[97, 98, 99], logprobs=5) == [
        [EOS], [99]]


def test_rule_sample_seeds_are_the_request_seed_then_golden_ratio_steps():
    """The generator seed of parallel sample ``i`` is part of what a seeded request promises (the same
    answers from one release to the next): sample 0 draws with the request's seed, sample ``i`` with
    ``seed + i * 0x9E3779B97F4A7C15`` modulo 2**63."""
    assert sample_seed(5, 0) == 5
    assert [sample_seed(5, i) for i in (1, 2)] == [(5 + i * 0x9E3779B97F4A7C15) % 2**63 for i in (1, 2)]
    assert sample_seed(2**63 - 1, 1) == (2**63 - 1 + 0x9E3779B97F4A7C15) % 2**63


def test_rule_an_empty_append_copies_nothing_and_an_exact_fit_copy_succeeds():
    """``append(0)`` on a table whose last block is shared and open takes no block and queues no copy
    (nothing is written); ``append(1)`` there copies on write, and does so when exactly one block is free."""
    bm = SharingKVManager(3, 4, enable_prefix_caching=False)
    table = bm.new_table()
    bm.allocate_prompt(table, [5, 6, 7, 8, 9])  # 2 blocks, the second partly filled
    child = table.fork()
    assert child.slots_for(0) == 0 and child.append(0) == [] and child.take_copies() == []
    assert bm.allocator.num_free == 1 and child.slots_for(1) == 1
    slots = child.append(1)
    copies = child.take_copies()
    assert len(copies) == 1 and copies[0][0] == table.blocks[1] and slots == [copies[0][1] * 4 + 1]
    assert bm.allocator.num_free == 0


def test_rule_a_one_token_prompt_decodes_without_a_prefix_lookup():
    """Block size 1: a one-token prompt, then decodes. Each decode's block is a fresh one, recorded as
    allocated, never as cached (a table that has K/V is not a new prompt to look up)."""
    h = Harness(step04, num_blocks=8, block_size=1)
    req = h.add([7], max_tokens=4, rid="A")
    records = [ev.detail for it in h.run() for ev in it.events if ev.kind == "allocated"]
    assert [r["cached"] for r in records] == [[]] * 4 and len({b for r in records for b in r["blocks"]}) == 4
    assert h.outputs["A"].num_cached_tokens == 0 and req.seqs[0].finish_reason == "length"


def test_rule_stats_count_a_shared_block_once_and_the_hit_rate():
    """Step04's stats: three samples of one 9-token prompt map its 3 blocks (9 slots filled, counted once,
    not three times); a second request with the same prompt finds its 2 full blocks cached: 2 hits of 3
    lookups (the first request's lookup stopped at its first block, a miss)."""
    h = Harness(step04, num_blocks=16)
    h.add(PROMPT, max_tokens=3, rid="A", n=3, temperature=1.0, seed=1)
    h.tick()  # the prompt, the forks, each sample's first token
    s = h.scheduler.stats()
    assert (s["blocks_used"], s["token_slots_filled"], s["prefix_cache_hit_rate"]) == (3, 9, 0.0)
    h.run()
    h.add(PROMPT, max_tokens=1, rid="B")
    h.run()
    assert h.scheduler.stats()["prefix_cache_hit_rate"] == 2 / 3 and h.outputs["B"].num_cached_tokens == 8
