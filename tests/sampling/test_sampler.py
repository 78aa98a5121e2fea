"""``SamplingParams`` validation, the vectorised sampler, and stop strings in the engine.

* Validation: every bound of every field raises ``RequestError`` (a
  ``ValueError``) whose ``param`` is the field and whose message names the bound; the values on the bound itself are accepted.
* Greedy rows are the argmax (exact: the same ``argmax``), and ``top_k=1`` is
  greedy at any temperature.
* Top-k / top-p never draw a token outside the allowed set, which the test
  computes on its own in float64 Python arithmetic (vLLM's rule: keep the k
  most likely tokens, renormalise, then keep the smallest prefix whose mass
  reaches p).
* A row's draw depends only on its own generator: the same tokens, exactly,
  whatever the other rows of the batch are.
* The empirical distribution of many seeded draws passes a chi-square
  goodness-of-fit test against softmax(logits / T) (restricted and
  renormalised for top-k / top-p), at significance ``SAMPLER_CHI2_ALPHA``.
* Log-probabilities are ``log_softmax`` of the raw logits (toleranced,
  ``FLOAT32``: the sampler computes them in float32, the test in float64); each
  carries its rank among the whole vocabulary (exact, ties included).
* A stop string spanning several tokens ends generation through the engine,
  and is not in the returned text.
"""

import math
import re

import pytest
import torch

from paged.sampling.sampler import logprobs_of
from paged.step03_attention import LLM, RequestError, SamplingParams, sample
from tests.hf_models import build_hf_model, save_checkpoint, write_tokenizer
from tests.tolerances import FLOAT32, SAMPLER_CHI2_ALPHA

pytestmark = pytest.mark.step03  # sampling lies below the ladder; its tests keep the step that first uses them


# -- SamplingParams validation -------------------------------------------------

# (field, keyword arguments, the bound the message must state)
BAD = [
    ("n", dict(n=0), "an integer >= 1"),
    ("n", dict(n=1.5), "an integer >= 1"),
    ("best_of", dict(n=3, best_of=2), "an integer >= n (3)"),
    ("temperature", dict(temperature=-1e-3), "a number in [0, 100]"),
    ("temperature", dict(temperature=100.5), "a number in [0, 100]"),
    ("temperature", dict(temperature=float("nan")), "a number in [0, 100]"),
    ("top_p", dict(top_p=0.0), "a number in (0, 1]"),
    ("top_p", dict(top_p=1.0 + 1e-9), "a number in (0, 1]"),
    ("top_k", dict(top_k=-2), "-1 (disabled), 0 (disabled) or a positive integer <= 9223372036854775807"),
    ("top_k", dict(top_k=2.0), "-1 (disabled), 0 (disabled) or a positive integer <= 9223372036854775807"),
    ("top_k", dict(top_k=2**70), "-1 (disabled), 0 (disabled) or a positive integer <= 9223372036854775807"),
    ("max_tokens", dict(max_tokens=0), "an integer >= 1"),
    ("min_tokens", dict(min_tokens=-1), "an integer in [0, max_tokens=16]"),
    ("min_tokens", dict(max_tokens=4, min_tokens=5), "an integer in [0, max_tokens=4]"),
    ("stop", dict(stop=""), "a list of non-empty strings"),
    ("stop", dict(stop=["ok", 3]), "a list of non-empty strings"),
    ("stop_token_ids", dict(stop_token_ids=[5, -1]), "a list of non-negative token ids"),
    ("stop_token_ids", dict(stop_token_ids=["5"]), "a list of non-negative token ids"),
    ("stop_token_ids", dict(stop_token_ids=[2**70]), "a list of non-negative token ids"),
    ("seed", dict(seed=-1), "None or a non-negative integer <= 9223372036854775807 (2**63 - 1)"),
    ("seed", dict(seed=1.0), "None or a non-negative integer <= 9223372036854775807 (2**63 - 1)"),
    ("seed", dict(seed=2**64), "None or a non-negative integer <= 9223372036854775807 (2**63 - 1)"),
    ("logprobs", dict(logprobs=-1), "None or an integer in [0, 20]"),
    ("logprobs", dict(logprobs=21), "None or an integer in [0, 20]"),
    ("length_penalty", dict(length_penalty="1"), "a number in [-10, 10]"),
    ("length_penalty", dict(length_penalty=1e308), "a number in [-10, 10]"),
    ("length_penalty", dict(length_penalty=-1e308), "a number in [-10, 10]"),
    ("length_penalty", dict(length_penalty=float("nan")), "a number in [-10, 10]"),
    ("early_stopping", dict(early_stopping="sometimes"), "True, False or 'never'"),
]


@pytest.mark.parametrize("field, kwargs, bound", BAD, ids=[f"{f}-{list(k.values())[-1]!r}" for f, k, _ in BAD])
def test_sampling_params_out_of_bound_raises_naming_field_and_bound(field, kwargs, bound):
    """A ``RequestError`` (a ``ValueError``) whose ``param`` is the field and whose message states the bound."""
    with pytest.raises(RequestError, match="^" + re.escape(f"{field} must be {bound}, got")) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, ValueError) and info.value.param == field


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0), dict(temperature=100), dict(top_p=1.0), dict(top_p=1e-6),
    dict(top_k=-1), dict(top_k=0), dict(top_k=1), dict(max_tokens=1), dict(min_tokens=16),
    dict(seed=0), dict(logprobs=0), dict(logprobs=20), dict(n=2, best_of=2),
    dict(stop="x"), dict(stop_token_ids=[0]), dict(early_stopping="never"),
], ids=repr)
def test_sampling_params_values_on_the_bound_are_accepted(kwargs):
    SamplingParams(**kwargs)


# -- sample() ------------------------------------------------------------------

V = 32


def _logits(seed: int, rows: int = 1, vocab: int = V, scale: float = 2.0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(rows, vocab, generator=g, dtype=torch.float64)).to(dtype)  # [S, V]


def _draw(row: torch.Tensor, params: SamplingParams, n: int, seed: int) -> list[int]:
    """``n`` draws for one row of logits, as ``n`` rows of one batch sharing one generator stream."""
    g = torch.Generator().manual_seed(seed)
    results = sample(row.expand(n, -1), [params] * n, [g] * n)
    return [r.token_id for r in results]


def _allowed(row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> dict[int, float]:
    """The tokens top-k then top-p keep, with their renormalised probabilities (float64 Python)."""
    z = [x / temperature for x in row.double().tolist()]
    order = sorted(range(len(z)), key=lambda i: -z[i])
    if top_k > 0:
        order = order[:top_k]
    top = z[order[0]]
    weights = [math.exp(z[i] - top) for i in order]
    total = sum(weights)
    kept, mass = {}, 0.0
    for i, w in zip(order, weights):
        kept[i] = w / total
        mass += w / total
        if top_p >= 1.0:
            continue  # top-p off: keep all
        # float32 in the sampler, float64 here: stay clear of a cumulative mass equal to top_p
        assert abs(mass - top_p) > 1e-6, "test case too close to the top_p boundary to be decided"
        if mass >= top_p:  # the smallest prefix whose mass reaches top_p
            break
    kept_mass = sum(kept.values())
    return {i: p / kept_mass for i, p in kept.items()}


def test_sample_greedy_rows_are_the_argmax():
    """Exact: a greedy row takes ``argmax`` of its logits, also in a batch with sampled rows."""
    logits = _logits(1, rows=6)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0)] * 3
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    tokens = [r.token_id for r in sample(logits, params, gens)]
    expected = logits.argmax(dim=1).tolist()
    assert [t for t, p in zip(tokens, params) if p.greedy] == expected[0::2]
    bf16 = logits.bfloat16()
    assert [r.token_id for r in sample(bf16, [SamplingParams(temperature=0)] * 6, gens)] == \
        bf16.float().argmax(dim=1).tolist()


@pytest.mark.parametrize("temperature", [0.01, 0.5, 1.0, 7.0, 100.0])
def test_sample_top_k_1_is_greedy_at_any_temperature(temperature):
    logits = _logits(2, rows=16)
    params = [SamplingParams(temperature=temperature, top_k=1, top_p=0.3 + 0.04 * i) for i in range(16)]
    gens = [torch.Generator().manual_seed(100 + i) for i in range(16)]
    for _ in range(5):  # five iterations: fresh uniforms each time, still the argmax
        assert [r.token_id for r in sample(logits, params, gens)] == logits.argmax(dim=1).tolist()


CASES = [  # (logits seed, temperature, top_k, top_p)
    (3, 1.0, 5, 1.0),
    (4, 0.7, -1, 0.6),
    (5, 1.5, 0, 0.9),
    (6, 1.0, 8, 0.5),  # both: top-p over the renormalised top 8
    (7, 2.0, 12, 0.75),
    (8, 0.3, 3, 0.95),
]


@pytest.mark.parametrize("seed, temperature, top_k, top_p", CASES)
def test_sample_top_k_top_p_never_leave_the_allowed_set(seed, temperature, top_k, top_p):
    row = _logits(seed)
    allowed = _allowed(row[0], temperature, top_k, top_p)
    assert len(allowed) > 1, "a one-token set would prove nothing"
    drawn = _draw(row, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p), 4000, seed)
    assert set(drawn) <= set(allowed), sorted(set(drawn) - set(allowed))
    # and the filter is not stricter than the rule: every allowed token of
    # probability >= 1% shows up in 4000 draws (missing one has odds < 0.99^4000)
    assert {i for i, p in allowed.items() if p >= 0.01} <= set(drawn)


def _chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(X >= statistic) for X ~ chi-square(k - 1): ``gammaincc(df / 2, x / 2)``."""
    n = counts.sum()
    expected = n * probs
    assert expected.min() >= 5, "chi-square needs >= 5 expected draws in every cell"
    stat = ((counts - expected) ** 2 / expected).sum()
    df = torch.tensor(len(probs) - 1, dtype=torch.float64)
    return torch.special.gammaincc(df / 2, stat / 2).item()


@pytest.mark.parametrize("seed, temperature, top_k, top_p", [
    (10, 0.7, -1, 1.0),  # plain softmax(logits / T) over 8 tokens
    (11, 1.8, -1, 1.0),
    (12, 1.2, 5, 0.85),  # top-k then top-p, renormalised
], ids=["T0.7", "T1.8", "T1.2-k5-p0.85"])
def test_sample_distribution_matches_softmax_chi_square(seed, temperature, top_k, top_p):
    """Toleranced, statistically: 20 000 draws from one fixed-seed stream.

    Under a correct sampler the statistic follows chi-square with k - 1
    degrees of freedom, so a random seed would fail with probability
    ``SAMPLER_CHI2_ALPHA``; with the seed fixed the outcome is deterministic.
    A sampler that ignores the temperature or renormalises wrongly is off by
    several percent in some cell, which at 20 000 draws puts the p-value
    below 1e-10.
    """
    row = _logits(seed, vocab=8, scale=1.0)
    allowed = _allowed(row[0], temperature, top_k, top_p)
    tokens = sorted(allowed)
    drawn = _draw(row, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p), 20_000, seed)
    assert set(drawn) <= set(tokens)
    counts = torch.tensor([drawn.count(t) for t in tokens], dtype=torch.float64)
    probs = torch.tensor([allowed[t] for t in tokens], dtype=torch.float64)
    assert _chi_square_p_value(counts, probs) > SAMPLER_CHI2_ALPHA


def test_sample_row_draw_depends_only_on_its_own_generator():
    """Exact: a seeded row draws the same tokens alone or in any batch, iteration after iteration."""
    row = _logits(20)
    mine = SamplingParams(temperature=0.9, top_k=20, top_p=0.95)
    others = [SamplingParams(temperature=0), SamplingParams(temperature=1.5),
              SamplingParams(temperature=0.5, top_k=3, logprobs=2), SamplingParams(temperature=1.0, top_p=0.5)]
    for seed in range(12):
        g_alone = torch.Generator().manual_seed(seed)
        alone = [sample(row, [mine], [g_alone])[0].token_id for _ in range(4)]
        # the row sits at a different place in batches of different sizes and neighbours
        k = seed % (len(others) + 1)
        batch_params = others[:k] + [mine] + others[k:]
        other_logits = _logits(1000 + seed, rows=len(others))
        logits = torch.cat([other_logits[:k], row, other_logits[k:]])
        gens = [torch.Generator().manual_seed(500 + j) for j in range(len(batch_params))]
        gens[k] = torch.Generator().manual_seed(seed)
        batched = [sample(logits, batch_params, gens)[k].token_id for _ in range(4)]
        assert batched == alone, seed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_sample_logprobs_are_log_softmax_of_raw_logits(dtype):
    """Toleranced (``FLOAT32``): float32 ``log_softmax`` against float64 over the same values.

    Temperature and top-k/top-p change what is drawn, not the reported
    log-probabilities: they are the model's distribution (as vLLM returns them).
    """
    logits = _logits(30, rows=4, vocab=50, dtype=dtype)
    params = [SamplingParams(temperature=0, logprobs=5), SamplingParams(temperature=0.4, top_k=3, logprobs=2),
              SamplingParams(temperature=2.0, top_p=0.5, logprobs=0), SamplingParams(temperature=1.0)]
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    results = sample(logits, params, gens)
    expected = torch.log_softmax(logits.double(), dim=1)  # [S, V]
    for i, (res, p) in enumerate(zip(results, params)):
        if p.logprobs is None:
            assert res.logprob is None and res.top_logprobs is None
            continue
        torch.testing.assert_close(torch.tensor(res.logprob, dtype=torch.float64),
                                   expected[i, res.token_id], **FLOAT32)
        top = expected[i].topk(p.logprobs)
        assert sorted(res.top_logprobs) == sorted(top.indices.tolist())
        got = torch.tensor([res.top_logprobs[t] for t in top.indices.tolist()], dtype=torch.float64)
        torch.testing.assert_close(got, top.values, **FLOAT32)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_logprob_ranks_count_the_tokens_at_least_as_likely(k):
    """Exact (integers): the top k are ranked 1..k in order; any other token has the rank vLLM gives it, the
    number of tokens at least as likely, itself included — past k even when it ties the k-th. The logits
    are small integers, so ties are exact and the reference counts them in Python on the integers."""
    ints = torch.randint(-3, 4, (6, 12), generator=torch.Generator().manual_seed(k))
    for r in range(ints.shape[0]):
        row = ints[r].tolist()
        every = torch.arange(len(row))  # each token of the row in turn is "the chosen one"
        chosen, tops = logprobs_of(ints[r:r + 1].float().expand(len(row), -1), every, [k] * len(row))
        top = tops[0]
        assert [lp.rank for lp in top.values()] == list(range(1, k + 1))
        assert sorted((row[t] for t in top), reverse=True) == sorted(row, reverse=True)[:k]  # the k likeliest
        for t, lp in enumerate(chosen):
            assert lp.rank == (top[t].rank if t in top else sum(v >= row[t] for v in row)), (r, t)
            assert t in top or lp.rank > k


# -- stop strings through the engine ------------------------------------------------


@pytest.fixture(scope="module")
def word_checkpoint(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer (token i is the word ``w{i}``)."""
    model = build_hf_model("llama", seed=3)
    path = save_checkpoint(model, tmp_path_factory.mktemp("llama_words"))
    write_tokenizer(path, model.config.vocab_size)
    return path


def test_engine_stop_string_spanning_tokens_ends_generation_and_is_not_returned(word_checkpoint):
    llm = LLM(str(word_checkpoint), dtype="float64", block_size=4, num_blocks=32, attention_backend="reference")
    prompt = "w5 w9 w14 w3 w7"
    free_run = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    ids = free_run[0].outputs[0].token_ids
    decode = lambda t: llm.tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    words = decode(ids).split(" ")
    # the end of word 3, all of word 4, the start of word 5: a string across three tokens
    stop = words[3][-1:] + " " + words[4] + " " + words[5][:2]
    # the tokens the engine must produce: up to the first one that completes the string
    end = next(j for j in range(len(ids)) if stop in decode(ids[: j + 1]))
    assert end >= 2, "the stop string must need several tokens"
    text = decode(ids[: end + 1])
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == ids[: end + 1]
    assert out.text == text[: text.index(stop)] and stop not in out.text
    assert llm.engine.scheduler.kv.allocator.num_free == 32


@pytest.mark.parametrize("field, kwargs", [
    ("stop", dict(stop=[f"s{i}" for i in range(SamplingParams.MAX_STOP + 1)])),
    ("stop", dict(stop=["x" * (SamplingParams.MAX_STOP_CHARS + 1)])),
    ("stop_token_ids", dict(stop_token_ids=list(range(SamplingParams.MAX_LIST + 1)))),
    ("logit_bias", dict(logit_bias={t: 1.0 for t in range(SamplingParams.MAX_LIST + 1)})),
    ("bad_words", dict(bad_words=[f"w{i}" for i in range(SamplingParams.MAX_LIST + 1)])),
    ("bad_words", dict(bad_words=["w" * (SamplingParams.MAX_BAD_WORD_CHARS + 1)])),
], ids=["stop-count", "stop-length", "stop-token-ids", "logit-bias", "bad-words-count", "bad-word-length"])
def test_sampling_params_list_over_its_size_bound_is_refused(field, kwargs):
    """Per-iteration work grows with these lists, so each has a size bound the message states."""
    with pytest.raises(RequestError, match=r"at most \d+") as info:
        SamplingParams(**kwargs)
    assert info.value.param == field and info.value.bound is not None
    at_bound = {k: (v[:-1] if isinstance(v, list) and len(v) > 1 else
                    [v[0][:-1]] if isinstance(v, list) else dict(list(v.items())[:-1])) for k, v in kwargs.items()}
    SamplingParams(**at_bound)  # one less is accepted
