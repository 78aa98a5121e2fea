"""Penalties, logit bias, bad words, min_tokens and prompt logprobs through the step03 engine.

Model: the bundled demo model in float64, so a greedy argmax never flips on
reordering noise and the oracle comparisons below are exact or near it.

* The engine's penalties see the right history: greedy output with
  repetition, frequency and presence penalties is token-identical to a plain
  loop that recomputes every step over contiguous K/V and applies the
  penalties written out in Python.
* ``logit_bias`` +100 forces its token (greedy and sampled).
* ``bad_words``: a word the unconstrained output writes (as the tokens the
  tokenizer gives it, alone or after a space) never appears.
* ``min_tokens``: with EOS biased to be certain, it still comes only after
  ``min_tokens`` tokens.
* Prompt logprobs equal ``log_softmax`` of one contiguous forward pass over the
  prompt (toleranced ``FLOAT64``: paged and contiguous attention sum in other orders),
  and each token's rank is its place in that pass's whole vocabulary (exact), also
  with ``prompt_logprobs=0`` (the prompt's own token only).
* ``logit_bias`` ids outside the vocabulary are refused with ``param="logit_bias"``.
"""

from collections import Counter

import pytest
import torch

from paged.demo import DEFAULT_MODEL_PATH
from paged.models import ContiguousAttention, load_model
from paged.step03_attention import Engine, RequestError, SamplingParams
from tests.engine_loop import drain
from tests.tolerances import FLOAT64

pytestmark = pytest.mark.step03  # sampling lies below the ladder; its tests keep the step that first uses them

TEXT = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n"


@pytest.fixture(scope="module")
def model():
    return load_model(str(DEFAULT_MODEL_PATH), dtype=torch.float64)


@pytest.fixture(scope="module")
def prompt(model):
    return model.tokenizer.encode(TEXT).ids


def _run(model, prompt, **params):
    engine = Engine(model, block_size=8, num_blocks=64)
    return drain(engine, [("r", prompt, SamplingParams(**params))])["r"]


def contiguous_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits at every position of ``tokens``, one forward pass over contiguous K/V."""
    attn = ContiguousAttention(model.config.num_layers)
    attn.begin([0], [len(tokens)])
    with torch.no_grad():
        hidden = model.model(torch.tensor(tokens), torch.arange(len(tokens)), attn)
        return model.model.compute_logits(hidden)


def test_penalties_match_a_contiguous_loop_applying_them_by_hand(model, prompt):
    rep, freq, pres, steps = 1.3, 0.4, 0.3, 12
    out = []
    for _ in range(steps):
        logits = contiguous_logits(model, prompt + out)[-1].tolist()
        counts = Counter(out)
        for t in set(prompt) | set(out):
            logits[t] = logits[t] / rep if logits[t] > 0 else logits[t] * rep
        for t, c in counts.items():
            logits[t] -= freq * c + pres
        out.append(max(range(len(logits)), key=logits.__getitem__))
    got = _run(model, prompt, temperature=0, max_tokens=steps, ignore_eos=True, repetition_penalty=rep,
               frequency_penalty=freq, presence_penalty=pres)
    plain = _run(model, prompt, temperature=0, max_tokens=steps, ignore_eos=True)
    assert got.outputs[0].token_ids == out
    assert plain.outputs[0].token_ids != out  # the penalties changed the output


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_forces_its_token(model, prompt, temperature):
    forced = 300
    out = _run(model, prompt, temperature=temperature, seed=1, max_tokens=6, logit_bias={forced: 100.0})
    assert out.outputs[0].token_ids == [forced] * 6


def _contains(tokens: list[int], part: list[int]) -> bool:
    return any(tokens[i:i + len(part)] == part for i in range(len(tokens) - len(part) + 1))


@pytest.mark.parametrize("word", ["self", "return self"])
def test_bad_words_are_never_generated(model, word):
    prompt = model.tokenizer.encode("class Foo:\n    def __init__(self):\n        ").ids
    spellings = [model.tokenizer.encode(w, add_special_tokens=False).ids for w in (word, " " + word)]
    plain = _run(model, prompt, temperature=0, max_tokens=24, ignore_eos=True).outputs[0]
    assert any(_contains(plain.token_ids, s) for s in spellings)  # without the ban the model writes it
    banned = _run(model, prompt, temperature=0, max_tokens=24, ignore_eos=True, bad_words=[word]).outputs[0]
    assert not any(_contains(banned.token_ids, s) for s in spellings)


def test_min_tokens_holds_back_eos(model, prompt):
    eos = model.eos_token_ids[0]
    eager = _run(model, prompt, temperature=0, max_tokens=10, logit_bias={eos: 100.0}).outputs[0]
    held = _run(model, prompt, temperature=0, max_tokens=10, min_tokens=3, logit_bias={eos: 100.0}).outputs[0]
    assert eager.token_ids == [eos]
    assert len(held.token_ids) == 4 and held.token_ids[-1] == eos and eos not in held.token_ids[:3]
    assert held.finish_reason == "stop"


def assert_prompt_logprobs_match(model, prompt: list[int], got: list, k: int) -> None:
    """``got`` is the contiguous forward pass's log-softmax: top-k ids and every value (``FLOAT64``), and each
    token's rank among the whole vocabulary (exact: how many tokens are at least as likely; the model is
    float64 and its logits have no ties this close)."""
    want = contiguous_logits(model, prompt).log_softmax(dim=-1)  # row p predicts token p + 1
    assert len(got) == len(prompt) and got[0] is None
    for p in range(1, len(prompt)):
        entry, row = got[p], want[p - 1]
        top = row.topk(k)
        assert set(entry) == set(top.indices.tolist()) | {prompt[p]}
        for tok, lp in entry.items():
            torch.testing.assert_close(torch.tensor(lp, dtype=torch.float64), row[tok], **FLOAT64)
            assert lp.rank == int((row >= row[tok]).sum()), (p, tok, lp.rank)


@pytest.mark.parametrize("k", [3, 0])
def test_prompt_logprobs_equal_contiguous_log_softmax(model, prompt, k):
    out = _run(model, prompt, temperature=0, max_tokens=1, prompt_logprobs=k)
    assert_prompt_logprobs_match(model, prompt, out.prompt_logprobs, k)
    assert any(e[t].rank > k + 1 for e, t in zip(out.prompt_logprobs[1:], prompt[1:]))  # ranks past the top too


def test_logit_bias_outside_the_vocabulary_is_refused(model, prompt):
    engine = Engine(model, block_size=8, num_blocks=64)
    vocab = model.config.vocab_size
    with pytest.raises(RequestError, match=f"in \\[0, {vocab}\\)") as e:
        engine.add_request("r", prompt, SamplingParams(logit_bias={vocab: 1.0}))
    assert e.value.param == "logit_bias" and not engine.has_unfinished()
