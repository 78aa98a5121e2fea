"""The sampling and structured-output fields through the official ``openai`` client.

Equalities:

* Penalties, ``logit_bias``, ``min_p``, ``min_tokens``, ``bad_words``: the
  server's greedy tokens equal offline ``LLM.generate`` with the same
  ``SamplingParams`` (bitwise: same engine, model, dtype, batch of one).
* ``echo`` + ``logprobs``: the prompt part of the logprobs is the offline
  ``prompt_logprobs`` (toleranced ``FLOAT32``: the server serialises float32
  values through JSON, which rounds them to their shortest repr), led by null.
* vLLM's ``prompt_logprobs``: the offline ``prompt_logprobs`` (logprobs toleranced
  ``FLOAT32`` as above; token ids, ranks and texts exact); chat's are its
  prompt's as completions gives them (exact: the same server and engine).
* ``response_format`` (``json_schema``, ``json_object``) and vLLM's
  ``guided_json`` / ``guided_regex`` / ``guided_choice``: every choice parses
  and validates, on both endpoints, with ``n=2`` and streamed.
"""

from __future__ import annotations

import json
import math
import re

import httpx
import jsonschema
import pytest

from paged import LLM, SamplingParams
from tests.serve.conftest import API_KEY, BLOCK_SIZE, NUM_BLOCKS
from tests.tolerances import FLOAT32

MODEL = "test-model"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
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


def test_prompt_logprobs_are_the_engines(client, offline, server):
    """vLLM's ``prompt_logprobs``: each completions choice holds its prompt's — null first, then the top k ranked
    1..k and the prompt's own token (its rank among all tokens, also when not among them) — as offline ``LLM.generate`` gives
    them; with ``echo`` and ``logprobs`` beside it, each list keeps its own k and the values agree (exact);
    chat's (at the top of the response) are its rendered prompt's; with a stream, a 400 naming the field."""
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, n=2,
                                  extra_body={"prompt_logprobs": 2})
    want = offline.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2),
                            use_tqdm=False)[0]
    got = r.choices[0].prompt_logprobs
    assert r.choices[1].prompt_logprobs == got and got[0] is None and len(got) == len(want.prompt_token_ids)
    for p in range(1, len(got)):
        assert set(got[p]) == {str(t) for t in want.prompt_logprobs[p]}, p
        for t, lp in want.prompt_logprobs[p].items():
            mine = got[p][str(t)]
            assert (mine["rank"], mine["decoded_token"]) == (lp.rank, lp.decoded_token), p
            assert math.isclose(mine["logprob"], lp.logprob, rel_tol=FLOAT32["rtol"], abs_tol=FLOAT32["atol"]), p
    assert any(e[str(t)]["rank"] > 3 for e, t in zip(got[1:], want.prompt_token_ids[1:]))  # ranked past the 2 asked
    both = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, echo=True, logprobs=1,
                                     extra_body={"prompt_logprobs": 3}).choices[0]
    ids = want.prompt_token_ids
    for p in range(1, len(ids)):
        assert len(both.logprobs.top_logprobs[p]) <= 2 and 3 <= len(both.prompt_logprobs[p]) <= 4
        assert both.logprobs.token_logprobs[p] == both.prompt_logprobs[p][str(ids[p])]["logprob"], p
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, temperature=0,
                                          extra_body={"prompt_logprobs": 1})
    rendered = httpx.post(server.url + "/tokenize", json={"messages": messages}, headers=AUTH, timeout=60).json()
    same = client.completions.create(model=MODEL, prompt=rendered["tokens"], max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": 1})
    assert chat.prompt_logprobs == same.choices[0].prompt_logprobs and len(chat.prompt_logprobs) == rendered["count"]
    for path, body in (("/v1/completions", {"prompt": PROMPT}), ("/v1/chat/completions", {"messages": messages})):
        r = httpx.post(server.url + path, json={"model": MODEL, **body, "stream": True, "prompt_logprobs": 1},
                       headers=AUTH, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs", r.text
    too_many = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": MODEL, "prompt": [[5] * 1000] * 2, "max_tokens": 1, "n": 7, "prompt_logprobs": 20})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt_logprobs", too_many.text


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
