"""The sampling and structured-output fields through the official ``openai`` client.

Equalities:

* Penalties, ``logit_bias``, ``min_p``, ``min_tokens``, ``bad_words``: the
  server's greedy tokens equal offline ``LLM.generate`` with the same
  ``SamplingParams`` (bitwise: same engine, model, dtype, batch of one).
* ``echo`` + ``logprobs``: the prompt part of the logprobs is the offline
  ``prompt_logprobs`` (toleranced ``FLOAT32``: the server serialises float32
  values through JSON, which rounds them to their shortest repr), led by null.
* ``response_format`` (``json_schema``, ``json_object``) and vLLM's
  ``guided_json`` / ``guided_regex`` / ``guided_choice``: every choice parses
  and validates, on both endpoints, with ``n=2`` and streamed.
"""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from paged import LLM, SamplingParams
from tests.serve.conftest import BLOCK_SIZE, NUM_BLOCKS
from tests.tolerances import FLOAT32

MODEL = "test-model"
PROMPT = "class Foo:\n    def __init__(self):\n        "
USER = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "role": {"enum": ["admin", "user"]}},
    "required": ["name", "age", "role"], "additionalProperties": False,
}


@pytest.fixture(scope="module")
def offline(model_path):
    return LLM(model_path, dtype="float32", device="cpu", block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS)


def test_penalties_bias_min_p_min_tokens_bad_words_equal_offline(client, offline):
    extra = {"repetition_penalty": 1.2, "min_p": 0.05, "min_tokens": 4, "bad_words": ["self"]}
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, presence_penalty=0.4,
                                  frequency_penalty=0.3, logit_bias={"201": -5}, extra_body=extra)
    want = offline.generate([PROMPT], SamplingParams(
        temperature=0, max_tokens=12, presence_penalty=0.4, frequency_penalty=0.3, logit_bias={201: -5.0},
        **extra), use_tqdm=False)[0].outputs[0]
    plain = offline.generate([PROMPT], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0].outputs[0]
    assert r.choices[0].text == want.text and want.text != plain.text
    assert "self" not in want.text


def test_logit_bias_forces_a_token(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0.8, seed=3,
                                  logit_bias={"300": 100})
    assert r.choices[0].text == offline.tokenizer.decode([300] * 5)


def test_echo_with_logprobs_returns_the_prompt_logprobs(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=2)
    want = offline.generate([PROMPT], SamplingParams(temperature=0, max_tokens=3, logprobs=2, prompt_logprobs=2),
                            use_tqdm=False)[0]
    lp = r.choices[0].logprobs
    n_prompt = len(want.prompt_token_ids)
    assert len(lp.tokens) == n_prompt + 3 and r.choices[0].text.startswith(PROMPT)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, n_prompt):
        got, expect = lp.token_logprobs[p], want.prompt_logprobs[p][want.prompt_token_ids[p]]
        assert math.isclose(got, expect, rel_tol=FLOAT32["rtol"], abs_tol=FLOAT32["atol"]), p
        assert len(lp.top_logprobs[p]) <= 3  # the top 2 and the prompt's own token


def test_echo_with_logprobs_streamed_starts_with_the_prompt(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.logprobs.token_logprobs[0] is None
    assert all(isinstance(x, float) for x in first.logprobs.token_logprobs[1:])


def test_chat_json_schema_validates_with_parallel_samples(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a user."}], max_tokens=96, temperature=1.0,
        seed=5, n=2, response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": USER}})
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), USER)


def test_completions_json_object_and_stream(client):
    prompt = 'data = {"name": "x", "id": 1}\nother = '  # a prompt after which the demo model closes its strings
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=96, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].text), dict)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=96, temperature=0, stream=True,
        extra_body={"response_format": {"type": "json_object"}}) if c.choices)
    assert streamed == r.choices[0].text


@pytest.mark.parametrize("extra, check", [
    ({"guided_json": USER}, lambda text: jsonschema.validate(json.loads(text), USER) is None),
    ({"guided_regex": r"[0-9]{3}-[a-z]{4}"}, lambda text: re.fullmatch(r"[0-9]{3}-[a-z]{4}", text) is not None),
    ({"guided_choice": ["yes", "no", "maybe"]}, lambda text: text in ("yes", "no", "maybe")),
], ids=["guided_json", "guided_regex", "guided_choice"])
def test_vllm_guided_fields(client, extra, check):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=96, temperature=0, extra_body=extra)
    assert r.choices[0].finish_reason == "stop" and check(r.choices[0].text)
