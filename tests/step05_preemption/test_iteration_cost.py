"""Chunks cut to a time: ``IterationCost`` (iteration_cost.py), ``ChunkedPrefill``'s ``cost``, the engine's
``long_prefill_seconds``.

The fit is checked on iterations whose seconds are made by a known rule (no clock: every result is a
rule's, so the tests do not depend on this machine's speed); the engine test feeds the fit through the
engine's own observer and checks the chunks it then cuts, and that the answers are the uncut engine's.
"""

import tempfile

import pytest
import torch

from paged.models import load_model
from paged.step05_preemption import PreemptingEngine, SamplingParams
from paged.step05_preemption.chunked import ChunkedPrefill
from paged.step05_preemption.iteration_cost import MIN_CHUNK, IterationCost, chunk_pairs, plan_work
from tests.hf_models import build_hf_model, save_checkpoint
from tests.scheduler_harness import Harness, step05

A, B = 0.004, 3.6e-6  # seconds per token and per query-key pair: an AVX2 CPU's, for SmolLM2-135M


def seconds(tokens, pairs):
    return A * tokens + B * pairs


def test_plan_work_counts_tokens_and_the_pairs_they_attend():
    """Exact: a decode at context 10 attends 10 keys; a 4-token chunk after 6 cached tokens attends
    7 + 8 + 9 + 10; a whole 5-token prompt 1 + ... + 5."""
    assert plan_work([1], [10]) == (1, 10)
    assert plan_work([4], [10]) == (4, 7 + 8 + 9 + 10) == (4, chunk_pairs(6, 4))
    assert plan_work([1, 4, 5], [10, 10, 5]) == (10, 10 + 34 + 15)
    assert chunk_pairs(0, 5) == 15 and chunk_pairs(3, 0) == 0


def test_the_fit_finds_the_rule_that_made_the_seconds():
    """Toleranced (relative 1e-6: a 2x2 solve in float64 with a 1e-9 ridge): iterations of mixed shapes
    timed by seconds = A tokens + B pairs give back A and B; older iterations weigh less, so when the rule
    changes (the machine got busy: twice the seconds) the fit follows it."""
    cost = IterationCost(0.4)
    assert cost.predict(10, 10) is None
    shapes = [(256, chunk_pairs(0, 256)), (3, 3 * 900), (128, chunk_pairs(2000, 128)), (40, 40 * 500),
              (64, chunk_pairs(3000, 64))]
    for t, p in shapes:
        cost.observe(t, p, seconds(t, p))
    assert cost.observed == 5
    assert cost.a == pytest.approx(A, rel=1e-6) and cost.b == pytest.approx(B * 1000, rel=1e-6)
    assert cost.predict(100, 50_000) == pytest.approx(seconds(100, 50_000), rel=1e-6)
    for _ in range(6):
        for t, p in shapes:
            cost.observe(t, p, 2 * seconds(t, p))
    # the 5 old iterations keep 0.9 ** 30 (4 %) of their weight: within 2 % of the new rule (without
    # forgetting, 5 old against 30 new would predict 1.86 times the old seconds)
    assert 1.96 * seconds(100, 50_000) <= cost.predict(100, 50_000) <= 2 * seconds(100, 50_000) * (1 + 1e-9)


def test_the_fit_never_takes_a_negative_cost():
    """Exact: seconds that only the pairs explain (tokens cost nothing, and noise would make a negative)
    leave a = 0 and b > 0; seconds that only the tokens explain leave b = 0 and a > 0; a prediction
    never falls below zero."""
    cost = IterationCost(0.4)
    cost.observe(100, 10_000, 0.01)
    cost.observe(10, 100_000, 0.2)
    cost.observe(50, 40_000, 0.079)
    assert cost.a == 0 and cost.b > 0 and cost.predict(1000, 0) == 0
    cost = IterationCost(0.4)
    cost.observe(100, 10_000, 0.4)
    cost.observe(10, 100_000, 0.03)
    cost.observe(50, 40_000, 0.19)
    assert cost.b == 0 and cost.a > 0 and cost.predict(0, 10**6) == 0


@pytest.mark.parametrize("start, limit, beside", [
    (0, 256, (0, 0)), (4000, 256, (0, 0)), (8000, 256, (0, 0)), (1000, 2048, (0, 0)), (0, 40, (0, 0)),
    (0, 12, (0, 0)), (150_000, 256, (0, 0)), (0, 256, (40, chunk_pairs(2000, 40))), (0, 256, (100, 10**6))])
def test_most_tokens_is_the_largest_chunk_within_the_target(start, limit, beside):
    """Exact (against every n): the chunk's predicted seconds with those of the prompt chunks beside it
    fit the target and one more token's would not; never above the limit, never below MIN_CHUNK (a
    prompt advances even where one token's attention alone is over the target, 150 000 cached tokens,
    or where the chunks beside it fill the target)."""
    cost = IterationCost(0.4)
    for t, p in [(256, chunk_pairs(0, 256)), (1, 700), (64, chunk_pairs(900, 64))]:
        cost.observe(t, p, seconds(t, p))
    n = cost.most_tokens(start, limit, beside)
    fits = [k for k in range(1, limit + 1)
            if cost.predict(beside[0] + k, beside[1] + chunk_pairs(start, k)) <= 0.4]
    assert n == max([min(limit, MIN_CHUNK)] + fits)
    if start == 150_000 or beside[1] == 10**6:
        assert not fits and n == MIN_CHUNK


def test_before_any_iteration_only_the_token_cap_cuts():
    cost = IterationCost(0.4)
    assert cost.most_tokens(8000, 256) == 256


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True, "0.4"])
def test_a_target_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="target_seconds must be a number of seconds > 0"):
        IterationCost(bad)


def test_rule_a_timed_chunk_shrinks_as_the_prompt_s_context_grows():
    """Exact (the stand-in's seconds are the rule's): with a target of 0.4 s a 2 000-token prompt's chunks
    are the largest whose own predicted seconds fit, each at most the token cap (256), and shrink as the
    context grows; the chat decoding beside it runs first every iteration and is not counted against the
    chunk. Before the first iteration was observed the first chunk is the token cap's."""
    cost = IterationCost(0.4)
    h = Harness(step05, num_blocks=600, chunking=ChunkedPrefill(256, cost=cost), max_model_len=4096)
    h.add(2, max_tokens=40, rid="chat")
    h.add(2000, max_tokens=1, rid="long")
    chunks = []  # (chunk tokens, its context)
    while h.has_unfinished():
        plan = h.tick().plan
        h.scheduler.chunking.observe(plan, seconds(*plan_work(plan.query_lens, plan.context_lens)))
        chunks += [(q, ctx) for q, ctx in zip(plan.query_lens, plan.context_lens) if q > 2]
    assert sum(q for q, _ in chunks) == 2000 and chunks[0][0] == 256
    # from the third chunk on the fit has seen two shapes of iteration: it is the rule (see above)
    for q, ctx in chunks[2:]:
        start = ctx - q
        assert q <= 256 and seconds(q, chunk_pairs(start, q)) <= 0.4 * (1 + 1e-9)
        assert q == 2000 - start or seconds(q + 1, chunk_pairs(start, q + 1)) > 0.4 * (1 - 1e-9)
    sizes = [q for q, _ in chunks[2:-1]]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


def test_rule_two_long_prompts_share_the_target():
    """Exact: two 1 000-token prompts prefilling side by side: in every iteration from the third on (the
    fit is the rule), the older one's chunk is the largest that fits alone, and the newer one's the
    largest that fits beside it (at least MIN_CHUNK), so their chunks together stay within 0.4 s."""
    cost = IterationCost(0.4)
    h = Harness(step05, num_blocks=600, chunking=ChunkedPrefill(256, cost=cost))
    h.add(1000, max_tokens=1, rid="first")
    h.add([5000 + i for i in range(1000)], max_tokens=1, rid="second")
    checked = 0
    while h.has_unfinished():
        plan = h.tick().plan
        h.scheduler.chunking.observe(plan, seconds(*plan_work(plan.query_lens, plan.context_lens)))
        chunks = [(q, ctx - q) for q, ctx in zip(plan.query_lens, plan.context_lens) if q > 1]
        if len(h.history) >= 3 and len(chunks) == 2 and all(q < 256 for q, _ in chunks):
            (q1, s1), (q2, s2) = chunks
            assert q1 == cost.most_tokens(s1, min(256, 1000 - s1))
            assert q2 == cost.most_tokens(s2, 256, beside=(q1, chunk_pairs(s1, q1)))
            assert q2 == MIN_CHUNK or seconds(q1 + q2, chunk_pairs(s1, q1) + chunk_pairs(s2, q2)) <= 0.4 * (1 + 1e-9)
            checked += 1
    assert checked >= 3


def test_rule_decodes_that_fill_the_target_do_not_starve_a_prompt():
    """Exact: 40 decodes at long contexts whose own predicted seconds are over the target: a 300-token
    prompt still gets the chunk it can compute in the target by itself (decodes are not counted)."""
    cost = IterationCost(0.4)
    cost.a, cost.b = A, B * 1000  # the rule, as if fitted
    h = Harness(step05, num_blocks=32_000, chunking=ChunkedPrefill(256, cost=cost), max_model_len=8192)
    for i in range(40):
        h.add(3000, max_tokens=50, rid=f"d{i}")
    while any(r.seqs[0].num_pending > 1 for r in h.running) or h.waiting:
        h.tick()
    decodes = h.tick().plan
    assert seconds(*plan_work(decodes.query_lens, decodes.context_lens)) > 0.4
    h.add([5000 + i for i in range(300)], max_tokens=1, rid="new")  # no prefix shared with the others
    plan = h.tick().plan
    chunk = [q for q in plan.query_lens if q > 1]
    assert not h.swapped and chunk == [cost.most_tokens(0, 256)] and chunk[0] > MIN_CHUNK


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama", max_position_embeddings=1024), tempfile.mkdtemp()),
                      dtype=torch.float64)


def _run(engine, prompts):
    answers = {}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        for out in engine.step():
            answers[out.request_id] = out.outputs[0].token_ids
    return answers


class RuleCost(IterationCost):
    """An ``IterationCost`` whose fit is the rule's (a second per token), recording what it is told."""

    def __init__(self, target_seconds):
        super().__init__(target_seconds)
        self.a, self.b, self.told = 1.0, 0.0, []

    def observe(self, tokens, pairs, seconds):
        self.told.append((tokens, pairs, seconds))


def test_the_engine_times_its_iterations_and_cuts_chunks_by_them(model):
    """The engine with ``long_prefill_seconds`` builds its chunking's ``IterationCost`` with that target
    and reports every iteration to it (exact: one report per iteration, its plan's tokens and pairs, a
    measured time > 0); the chunks are the ones the fit allows: with a second per token and a target of
    0.25 s every chunk is cut to MIN_CHUNK (300 tokens: 37 chunks of 8 and one of 4). The answers are
    the untimed engine's (float64, greedy: tokens compared exactly)."""
    prompts = {"long": [3 + i % 50 for i in range(300)], "short": [5, 6, 7]}
    plain = PreemptingEngine(model, block_size=4, num_blocks=200)
    assert plain.scheduler.chunking.cost is None
    timed = PreemptingEngine(model, block_size=4, num_blocks=200, long_prefill_seconds=0.25)
    assert type(timed.scheduler.chunking.cost) is IterationCost
    assert timed.scheduler.chunking.cost.target_seconds == 0.25
    cost = timed.scheduler.chunking.cost = RuleCost(0.25)
    plans = []
    timed.add_observer(lambda e, plan, _: plans.append(plan_work(plan.query_lens, plan.context_lens)))
    seen = []
    timed.add_observer(lambda e, plan, _: seen.append([q for q in plan.query_lens if q > 3]))
    answers = _run(timed, prompts)
    assert MIN_CHUNK == 8 and [q for qs in seen for q in qs] == [MIN_CHUNK] * 37 + [4]
    assert [(t, p) for t, p, _ in cost.told] == plans and all(s > 0 for _, _, s in cost.told)
    assert answers == _run(plain, prompts)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), True, "1"])
def test_the_engine_refuses_a_bad_long_prefill_seconds(model, bad):
    with pytest.raises(ValueError, match="long_prefill_seconds must be a number of seconds >= 0"):
        PreemptingEngine(model, block_size=4, num_blocks=16, long_prefill_seconds=bad)
