"""The step04 engine end to end on tiny random checkpoints (float64).

* Parallel sampling: sample ``i`` of an ``n``-sample request equals an
  independent single-sample run seeded with ``sample_seed(seed, i)``
  (token-identical); ``best_of > n`` returns the ``n`` best by cumulative
  log-probability.
* Beam search equals a plain beam search written here over a contiguous KV
  cache (recomputing every candidate from scratch) with the rules of
  ``paged/step04_sharing/beam.py`` — token-identical, log-probabilities within
  ``FLOAT64`` (same float64 model, other operation order).
* Prefix caching changes nothing: greedy outputs with caching on equal caching
  off, for partial last blocks, a fully cached prompt, and a prefix evicted and
  then recomputed.
* A mixed batch (greedy, sampled, parallel, beam) gives each request what it
  gets alone; every block is free afterwards.
"""

import pytest
import torch

from paged.models import ContiguousAttention, load_model
from paged.step04_sharing import SamplingParams, SharingEngine, sample_seed
from tests.beam_oracle import beam_search
from tests.engine_loop import drain
from tests.hf_models import build_hf_model, save_checkpoint
from tests.tolerances import FLOAT64

PROMPT = [5, 9, 14, 3, 7, 22, 8]
NUM_BLOCKS = 96


@pytest.fixture(scope="module")
def model():
    import tempfile

    path = save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp())
    return load_model(path, dtype=torch.float64)


def _engine(model, **kw):
    kw.setdefault("num_blocks", NUM_BLOCKS)
    return SharingEngine(model, block_size=4, free_order=list(range(kw["num_blocks"]))[::-1], **kw)


def _tokens(out):
    return [o.token_ids for o in out.outputs]


def test_parallel_sample_i_equals_independent_seeded_run(model):
    params = SamplingParams(n=4, temperature=1.0, top_p=0.95, seed=99, max_tokens=12, ignore_eos=True)
    group = drain(_engine(model), [("g", PROMPT, params)])["g"]
    assert len(group.outputs) == 4
    for i, out in enumerate(group.outputs):
        single = SamplingParams(temperature=1.0, top_p=0.95, seed=sample_seed(99, i), max_tokens=12, ignore_eos=True)
        alone = drain(_engine(model, enable_prefix_caching=False), [("s", PROMPT, single)])["s"]
        assert out.token_ids == alone.outputs[0].token_ids, i


def test_parallel_samples_share_prompt_blocks_then_copy_on_write(model):
    engine = _engine(model, enable_prefix_caching=False)
    engine.add_request("g", PROMPT, SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=4, ignore_eos=True))
    engine.step()  # the prompt: 7 tokens in 2 blocks, mapped by all 3 samples
    assert engine.scheduler.kv.allocator.num_used == 2
    plan_copies = []

    def observe(engine, plan, results):
        plan_copies.extend(plan.blocks_to_copy)

    engine.add_observer(observe)
    engine.step()  # each sample writes its first token into the shared, partly filled block
    engine.remove_observer(observe)
    assert len(plan_copies) == 2  # two copy-on-writes; the last sample writes in place
    assert engine.scheduler.kv.allocator.num_used == 4
    while engine.has_unfinished():
        engine.step()
    assert engine.scheduler.kv.allocator.num_used == 0


def test_best_of_keeps_the_n_most_likely(model):
    params = SamplingParams(n=2, best_of=5, temperature=1.0, seed=3, max_tokens=8, ignore_eos=True)
    out = drain(_engine(model), [("b", PROMPT, params)])["b"]
    every = drain(_engine(model), [("a", PROMPT, SamplingParams(n=5, temperature=1.0, seed=3, max_tokens=8,
                                                              ignore_eos=True, logprobs=0))])["a"]
    ranked = sorted(every.outputs, key=lambda o: -o.cumulative_logprob)[:2]
    assert _tokens(out) == [o.token_ids for o in ranked]


def _oracle_beam_search(m, prompt, k, n, max_tokens, length_penalty, early_stopping, eos):
    """Beam search over a contiguous KV cache, every candidate recomputed from its tokens
    (``tests/beam_oracle.py``: the model's 2k most likely next tokens are its proposals)."""
    def propose(tokens):
        attn = ContiguousAttention(m.config.num_layers)
        attn.begin([0], [len(prompt) + len(tokens)])
        with torch.no_grad():
            hidden = m(torch.tensor(prompt + tokens), torch.arange(len(prompt) + len(tokens)), attn)
            top = m.compute_logits(hidden[-1:])[0].log_softmax(-1).topk(2 * k)
        return dict(zip(top.indices.tolist(), top.values.tolist()))

    return beam_search(propose, k, n, max_tokens, length_penalty, early_stopping, eos.__contains__)


@pytest.mark.parametrize("k, n, length_penalty, early_stopping, eos", [
    (3, 2, 1.0, False, ()),
    (4, 4, 0.0, True, (13,)),
    (2, 2, 0.5, "never", (13, 14)),
    (3, 3, 1.0, False, (152,)),
], ids=["k3-no-eos", "k4-early-eos", "k2-never-eos", "k3-late-eos"])
def test_beam_search_equals_contiguous_kv_oracle(model, k, n, length_penalty, early_stopping, eos):
    model.eos_token_ids = list(eos)
    try:
        params = SamplingParams(n=n, best_of=k, use_beam_search=True, temperature=0, max_tokens=8,
                                length_penalty=length_penalty, early_stopping=early_stopping)
        out = drain(_engine(model), [("beam", PROMPT, params)])["beam"]
    finally:
        model.eos_token_ids = []
    expected = _oracle_beam_search(model.model, PROMPT, k, n, 8, length_penalty, early_stopping, set(eos))
    assert _tokens(out) == [h.token_ids for h in expected]
    for o, h in zip(out.outputs, expected):
        assert o.cumulative_logprob == pytest.approx(h.cumulative_logprob, rel=FLOAT64["rtol"], abs=FLOAT64["atol"])
    # the EOS cases really end some hypotheses by EOS (the tokens were picked so they do)
    assert any(o.finish_reason == "stop" for o in out.outputs) == bool(eos)


def test_prefix_caching_on_equals_off(model):
    system = list(range(20, 33))  # 13 tokens: 3 full blocks and a partial one
    prompts = [
        system + [40, 41],  # shares 3 full blocks
        system + [40, 41],  # the same prompt again: fully cached but for the last block
        system[:12],  # exactly 3 blocks: the last prompt block is recomputed, never shared
        system[:5],  # a partial last block
        [7] + system,  # other first token: no hit at all
    ]
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    off = _engine(model, enable_prefix_caching=False)
    on = _engine(model)
    for i, p in enumerate(prompts):  # one by one, so later prompts can hit earlier ones
        a = drain(off, [(f"r{i}", p, greedy)])[f"r{i}"]
        b = drain(on, [(f"r{i}", p, greedy)])[f"r{i}"]
        assert _tokens(a) == _tokens(b), i
    assert on.scheduler.kv.hit_rate() > 0


def test_a_cache_salt_shares_prompt_blocks_only_within_its_salt(model):
    """Exact counts: a prompt of 3 full blocks and a partial one, sent again, is found in the cache (12 tokens)
    only under the salt it was computed with; another salt or none finds nothing, and neither does a salted
    prompt that an unsalted one computed. The tokens are the same every time (greedy, bitwise: the cache
    is transparent). ``n`` > 1 with a salt forks tables that keep naming their blocks under it."""
    system = list(range(20, 33))  # 13 tokens, block size 4
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine = _engine(model)
    runs = [("a1", "tenant-a"), ("a2", "tenant-a"), ("b1", "tenant-b"), ("n1", None), ("n2", None),
            ("b2", "tenant-b")]
    outs = {rid: drain(engine, [(rid, system, SamplingParams(**{**vars(greedy), "cache_salt": salt}))])[rid]
            for rid, salt in runs}
    assert {rid: out.num_cached_tokens for rid, out in outs.items()} == \
        {"a1": 0, "a2": 12, "b1": 0, "n1": 0, "n2": 12, "b2": 12}
    assert len({tuple(_tokens(out)[0]) for out in outs.values()}) == 1
    # a 3-token prompt forks before any block is full: each sample's first block is named when its first
    # token fills it, under the salt the fork kept
    forked = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=5, ignore_eos=True, cache_salt="tenant-c")
    first = [7, 8, 9, drain(engine, [("c", [7, 8, 9], forked)])["c"].outputs[1].token_ids[0]]  # a forked one
    found = {salt: drain(engine, [(f"c-{salt}", first + [1], SamplingParams(**{**vars(greedy), "cache_salt": salt}))])
             [f"c-{salt}"].num_cached_tokens for salt in ("tenant-c", None)}
    assert found == {"tenant-c": 4, None: 0}
    # the scheduler's count of free blocks a prompt needs finds the hits of its own salt only
    engine.add_request("held", system, SamplingParams(**{**vars(greedy), "cache_salt": "tenant-a"}))
    engine.step()  # its prompt computed: its 3 full blocks in use
    need = {salt: engine.scheduler.kv.blocks_needed_for_prompt(system, None, True, salt)
            for salt in ("tenant-a", "tenant-b", None)}
    assert need == {"tenant-a": 1, "tenant-b": 4, None: 4}  # a parked hit takes a free block all the same
    drain(engine, [])


def test_prefix_cache_evicted_then_recomputed_gives_same_output(model):
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = list(range(50, 63))
    engine = _engine(model, num_blocks=8)
    first = drain(engine, [("a", prompt, greedy)])["a"]
    # fill the pool with other content so the cached blocks are evicted
    drain(engine, [("flood", list(range(100, 128)), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))])
    again = drain(engine, [("b", prompt, greedy)])["b"]
    assert again.num_cached_tokens == 0
    assert _tokens(first) == _tokens(again)


def test_mixed_batch_gives_each_request_its_solo_output(model):
    reqs = [
        ("greedy", PROMPT, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)),
        ("sampled", [3, 4, 5], SamplingParams(temperature=0.8, top_k=30, seed=5, max_tokens=7, ignore_eos=True)),
        ("parallel", [9, 9, 9, 9, 9], SamplingParams(n=3, temperature=1.0, seed=8, max_tokens=6, ignore_eos=True)),
        ("beam", [11, 12], SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0, max_tokens=6)),
    ]
    together = drain(_engine(model, enable_prefix_caching=False), reqs)
    for rid, prompt, params in reqs:
        alone = drain(_engine(model, enable_prefix_caching=False), [(rid, prompt, params)])[rid]
        assert _tokens(together[rid]) == _tokens(alone), rid


@pytest.mark.parametrize("params, match", [
    (dict(n=2, best_of=100), "best_of"),
    (dict(use_beam_search=True, best_of=2, temperature=0.7), "temperature=0"),
], ids=["best_of-over-limit", "beam-with-temperature"])
def test_sharing_engine_rejects_bad_groups(model, params, match):
    engine = _engine(model)
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", PROMPT, SamplingParams(**params))
    assert not engine.has_unfinished() and engine.scheduler.kv.allocator.num_used == 0


@pytest.mark.parametrize("num_logprobs", [1, 9])  # 9 > 2k: more entries than the beams choose from
def test_beam_search_returns_the_logprobs_it_was_asked_for(model, num_logprobs):
    """Each returned beam carries one entry per token: the chosen token's logprob equals a contiguous
    recompute of it (toleranced, float64: a different summation order), the entries sum to the
    beam's cumulative logprob (bitwise: the engine adds them in the same order), and asking for
    logprobs changes no beam (token-identical)."""
    plain = SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0, max_tokens=6)
    asked = SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0, max_tokens=6,
                           logprobs=num_logprobs)
    got = drain(_engine(model), [("plain", PROMPT, plain), ("asked", PROMPT, asked)])
    assert _tokens(got["asked"]) == _tokens(got["plain"])
    for o in got["asked"].outputs:
        assert o.logprobs is not None and len(o.logprobs) == len(o.token_ids)
        total = 0.0
        for i, (tok, entry) in enumerate(zip(o.token_ids, o.logprobs)):
            assert tok in entry and len(entry) >= num_logprobs
            attn = ContiguousAttention(model.model.config.num_layers)
            tokens = PROMPT + o.token_ids[:i]
            attn.begin([0], [len(tokens)])
            with torch.no_grad():
                hidden = model.model(torch.tensor(tokens), torch.arange(len(tokens)), attn)
                want = model.model.compute_logits(hidden[-1:])[0].log_softmax(-1)[tok].item()
            assert entry[tok] == pytest.approx(want, rel=FLOAT64["rtol"], abs=FLOAT64["atol"])
            total += entry[tok]
        assert total == o.cumulative_logprob
