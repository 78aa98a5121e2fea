"""Penalties, biases, bans, grammar masks and min-p on hand-computed logit vectors.

* Each penalty and the bias give exactly the vector written out by hand
  (bitwise: every value below is a dyadic fraction, so float32 represents the
  inputs, the products and the sums exactly).
* Rows without a context are untouched, and a batch without any contexts
  returns the very tensor it was given (the plain path does no work).
* A grammar mask leaves only the allowed tokens; when bans remove all of them
  the row keeps the grammar's tokens (the output must still parse).
* min-p: no draw ever falls below ``min_p`` times the top probability, and
  the tokens at or above it stay drawable.
* New ``SamplingParams`` bounds raise ``RequestError`` naming the field.
"""

import re

import pytest
import torch

from paged.step03_attention import RequestError, SamplingParams, sample
from paged.sampling.logits_processors import SamplingContext, process_logits, token_counts
from paged.sampling.structured import GuidedDecodingParams

pytestmark = pytest.mark.step03  # sampling lies below the ladder; its tests keep the step that first uses them

NEG = float("-inf")
# token:     0     1     2    3     4    5
LOGITS = [2.0, -1.0, 0.5, 3.0, -2.0, 0.0]
PROMPT = [0, 2]
OUTPUT = [3, 3, 1]  # token 3 generated twice, token 1 once


def _one(params: SamplingParams, ctx: SamplingContext) -> list[float]:
    return process_logits(torch.tensor([LOGITS]), [params], [ctx])[0].tolist()


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    """Seen = prompt {0, 2} + output {1, 3}: 2/2, -1*2, 0.5/2, 3/2; tokens 4, 5 unchanged."""
    got = _one(SamplingParams(repetition_penalty=2.0), SamplingContext(PROMPT, OUTPUT))
    assert got == [1.0, -2.0, 0.25, 1.5, -2.0, 0.0]


def test_frequency_penalty_subtracts_once_per_generated_occurrence():
    """Output counts {3: 2, 1: 1}; prompt tokens are not counted: 3 - 2*0.5, -1 - 0.5."""
    got = _one(SamplingParams(frequency_penalty=0.5), SamplingContext(PROMPT, OUTPUT))
    assert got == [2.0, -1.5, 0.5, 2.0, -2.0, 0.0]


def test_presence_penalty_subtracts_once_per_generated_token():
    got = _one(SamplingParams(presence_penalty=0.25), SamplingContext(PROMPT, OUTPUT))
    assert got == [2.0, -1.25, 0.5, 2.75, -2.0, 0.0]


def test_negative_additive_penalties_encourage_repeats():
    got = _one(SamplingParams(presence_penalty=-1.0, frequency_penalty=-0.5), SamplingContext(PROMPT, OUTPUT))
    assert got == [2.0, 0.5, 0.5, 5.0, -2.0, 0.0]


def test_all_three_penalties_in_vllm_order():
    """Repetition first (3 -> 1.5, -1 -> -2), then 1.5 - 2*0.5 - 0.25 = 0.25 and -2 - 0.5 - 0.25."""
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = _one(params, SamplingContext(PROMPT, OUTPUT))
    assert got == [1.0, -2.75, 0.25, 0.25, -2.0, 0.0]


def test_logit_bias_adds_before_the_penalties():
    """Bias 4 on token 1 (-1 -> 3) and -0.5 on token 5; then repetition 2 on seen token 1: 3 / 2."""
    params = SamplingParams(logit_bias={1: 4.0, 5: -0.5}, repetition_penalty=2.0)
    got = _one(params, SamplingContext(PROMPT, OUTPUT))
    assert got == [1.0, 1.5, 0.25, 1.5, -2.0, -0.5]


def test_banned_tokens_get_minus_infinity():
    got = _one(SamplingParams(min_tokens=1), SamplingContext(output_token_ids=[], banned_token_ids=[3, 5]))
    assert got == [2.0, -1.0, 0.5, NEG, -2.0, NEG]


def _bitmask(allowed: list[int], vocab: int) -> bytes:
    words = [0] * ((vocab + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor(words, dtype=torch.int64).to(torch.int32).numpy().tobytes()


def test_grammar_mask_keeps_only_allowed_tokens():
    ctx = SamplingContext(allowed_bitmask=_bitmask([1, 4], 6))
    got = _one(SamplingParams(presence_penalty=0.25), ctx)
    assert got == [NEG, -1.0, NEG, NEG, -2.0, NEG]


def test_grammar_wins_when_bans_take_every_allowed_token():
    """Bad words banned the only token the grammar allows: the grammar's token stays (penalised logit)."""
    ctx = SamplingContext(output_token_ids=[1], banned_token_ids=[1], allowed_bitmask=_bitmask([1], 6))
    got = _one(SamplingParams(presence_penalty=0.25), ctx)
    assert got == [NEG, -1.25, NEG, NEG, NEG, NEG]


def test_rows_without_context_are_untouched_and_no_context_is_no_work():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(), SamplingParams(frequency_penalty=1.0), SamplingParams()]
    out = process_logits(logits, params, [None, SamplingContext(output_token_ids=[7, 7]), None])
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert out[1, 7] == logits[1, 7] - 2.0
    assert process_logits(logits, params, [None, None, None]) is logits


def test_a_penalised_row_does_not_change_what_its_neighbours_draw():
    """Bitwise: the plain rows draw the same tokens with and without a penalised row beside them."""
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    plain = [SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=0)]
    gens = lambda: [torch.Generator().manual_seed(s) for s in (11, 12, 13)]  # noqa: E731
    alone = sample(logits[:2], plain, gens()[:2])
    mixed = sample(logits, plain + [SamplingParams(repetition_penalty=1.5)], gens(),
                   [None, None, SamplingContext([1, 2], [3])])
    assert [r.token_id for r in mixed[:2]] == [r.token_id for r in alone]


def test_token_counts_counts_each_occurrence():
    counts = token_counts([[3, 3, 1], [], [0]], 5, "cpu")
    assert counts.tolist() == [[0, 1, 0, 2, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]]


def test_min_p_never_draws_below_the_floor():
    """Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625: min_p 0.2 keeps tokens 0-2 (>= 0.1) and only them."""
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]])
    params = [SamplingParams(temperature=1.0, min_p=0.2)]
    drawn = {sample(probs.log(), params, [torch.Generator().manual_seed(s)])[0].token_id for s in range(400)}
    assert drawn == {0, 1, 2}


BAD = [
    ("presence_penalty", dict(presence_penalty=2.5), "a number in [-2, 2]"),
    ("frequency_penalty", dict(frequency_penalty=-3), "a number in [-2, 2]"),
    ("repetition_penalty", dict(repetition_penalty=0), "a finite number > 0"),
    ("repetition_penalty", dict(repetition_penalty=float("inf")), "a finite number > 0"),
    ("min_p", dict(min_p=-0.1), "a number in [0, 1]"),
    ("min_p", dict(min_p=1.5), "a number in [0, 1]"),
    ("logit_bias", dict(logit_bias={3: 100.5}), "biases in [-100, 100]"),
    ("logit_bias", dict(logit_bias={-1: 1.0}), "a dict {token id (int >= 0): bias}"),
    ("bad_words", dict(bad_words=["ok", ""]), "a list of non-empty strings"),
    ("prompt_logprobs", dict(prompt_logprobs=21), "None or an integer in [0, 20]"),
    ("use_beam_search", dict(use_beam_search=True, n=2, temperature=0,
                             guided_decoding=GuidedDecodingParams(json_object=True)), "False with guided_decoding"),
    ("min_tokens", dict(min_tokens=2, guided_decoding=GuidedDecodingParams(regex="a+")), "0 with guided_decoding"),
]


@pytest.mark.parametrize("field, kwargs, bound", BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD)])
def test_bad_values_raise_request_error_naming_the_field(field, kwargs, bound):
    with pytest.raises(RequestError, match=re.escape(f"{field} must be {bound}")) as e:
        SamplingParams(**kwargs)
    assert e.value.param == field


@pytest.mark.parametrize("spec, words", [
    (dict(json={"type": "nonsense"}), "Invalid type"),
    (dict(json='{"type": '), "not valid JSON"),
    (dict(json=[1, 2]), "JSON schema object"),
    (dict(regex="[a-"), "unclosed character class"),
    (dict(choice=[]), "exactly one of"),
    (dict(json={"type": "object"}, regex="a"), "exactly one of"),
])
def test_invalid_grammars_are_refused_at_construction(spec, words):
    with pytest.raises(RequestError, match=re.escape(words)) as e:
        GuidedDecodingParams(**spec)
    assert e.value.param.startswith("guided_decoding")


def test_plain_params_do_not_process_logits():
    assert not SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, logprobs=3).processes_logits
    for kw in (dict(presence_penalty=0.1), dict(repetition_penalty=1.1), dict(logit_bias={1: 1.0}),
               dict(bad_words=["x"]), dict(min_tokens=1), dict(prompt_logprobs=0),
               dict(guided_decoding=GuidedDecodingParams(choice=["a"]))):
        assert SamplingParams(**kw).processes_logits, kw
