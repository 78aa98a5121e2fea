"""Every answer parses strictly as the official ``openai`` package's own types.

The raw JSON of each answer (not the client's lenient parse) goes through
``model_validate(..., strict=True)`` of the matching ``openai.types`` model:
no coercion, so a number sent as a string or a wrong literal fails. The
openai models allow unknown keys; here every key outside OpenAI's schema must
be one of vLLM's documented extensions (``EXTENSIONS``), so nothing else
leaks into the answers unnoticed.
"""

from __future__ import annotations

import json

import httpx
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel, ValidationError

from tests.serve.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
EXTENSIONS = {
    "stop_reason",  # the stop string or token id that ended a choice (vLLM)
    "root", "max_model_len",  # a model card's checkpoint folder and context (vLLM)
}
PROMPT = "def add(a, b):"
MESSAGES = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "add two numbers"}]
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def extras(obj, path: str = "") -> set[str]:
    """The keys outside the openai schema anywhere in a parsed model, as dotted paths' last names."""
    found = set()
    if isinstance(obj, BaseModel):
        found |= set(obj.model_extra or {})
        for name in type(obj).model_fields:
            found |= extras(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            found |= extras(item, path)
    elif isinstance(obj, dict):
        for value in obj.values():
            found |= extras(value, path)
    return found


def null_where_openai_sends_null(error: dict) -> bool:
    """The two places where OpenAI's own API (and vLLM) send null but the openai package types a value:
    a streamed completion chunk's ``finish_reason`` before the last, and an echoed prompt's first token's
    ``token_logprobs`` / ``top_logprobs`` (no logprob: nothing precedes it)."""
    loc = error["loc"]
    if error["input"] is not None or len(loc) < 3 or loc[0] != "choices":
        return False
    return loc[2:] == ("finish_reason",) or loc[2:] in (("logprobs", "token_logprobs", 0),
                                                          ("logprobs", "top_logprobs", 0))


def strict(model: type[BaseModel], raw: dict) -> None:
    """``raw`` validates as ``model`` with no coercion, but for the nulls above, and holds no unknown key."""
    try:
        parsed = model.model_validate(raw, strict=True)
    except ValidationError as e:
        wrong = [err for err in e.errors() if not (model is Completion and null_where_openai_sends_null(err))]
        assert not wrong, f"{model.__name__}: {wrong}"
        # the only failures were those nulls: parse with them filled in, for the key check below
        parsed = model.model_validate({**raw, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop",
                                                           "logprobs": _filled(c["logprobs"])}
                                                          for c in raw["choices"]]}, strict=True)
    unknown = extras(parsed) - EXTENSIONS
    assert not unknown, f"keys outside OpenAI's {model.__name__} and vLLM's extensions: {unknown}"


def _filled(logprobs: dict | None) -> dict | None:
    """Completion logprobs with an echoed first token's nulls replaced (their place was checked above)."""
    if logprobs is None or not logprobs["token_logprobs"] or logprobs["token_logprobs"][0] is not None:
        return logprobs
    return {**logprobs, "token_logprobs": [0.0, *logprobs["token_logprobs"][1:]],
            "top_logprobs": [{}, *logprobs["top_logprobs"][1:]]}


def answer(server, path: str, body: dict) -> list[dict]:
    """The raw JSON answer, or each JSON event of a streamed one."""
    r = httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        return [r.json()]
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


COMPLETIONS = {
    "greedy": {"prompt": PROMPT, "max_tokens": 6, "temperature": 0},
    "logprobs_n_stop": {"prompt": [PROMPT, "import os"], "max_tokens": 8, "n": 2, "seed": 1, "logprobs": 2,
                        "stop": ["\n"]},
    "echo_logprobs": {"prompt": PROMPT, "max_tokens": 3, "echo": True, "logprobs": 1, "temperature": 0},
    "beam": {"prompt": PROMPT, "max_tokens": 4, "n": 2, "use_beam_search": True, "temperature": 0},
}
CHATS = {
    "greedy": {"messages": MESSAGES, "max_tokens": 6, "temperature": 0},
    "logprobs_n": {"messages": MESSAGES, "max_tokens": 6, "n": 2, "seed": 1, "logprobs": True, "top_logprobs": 2},
    "json": {"messages": MESSAGES, "max_tokens": 24, "response_format": {"type": "json_object"}},
}


@pytest.mark.parametrize("name, stream", [(n, s) for n in sorted(COMPLETIONS) for s in (False, True)
                                          if not (s and n == "beam")])  # beam search is never streamed
def test_completions_parse_strictly_as_openai_types(server, name, stream):
    body = COMPLETIONS[name]
    extra = {"stream": True, "stream_options": STREAM_OPTIONS} if stream else {}
    events = answer(server, "/v1/completions", {**body, **extra})
    for raw in events:
        strict(Completion, raw)
    if stream:
        assert events[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", sorted(CHATS))
def test_chat_parses_strictly_as_openai_types(server, name, stream):
    model = ChatCompletionChunk if stream else ChatCompletion
    extra = {"stream": True, "stream_options": STREAM_OPTIONS} if stream else {}
    for raw in answer(server, "/v1/chat/completions", {**CHATS[name], **extra}):
        strict(model, raw)


def test_models_parse_strictly_as_openai_types(server):
    raw = httpx.get(server.url + "/v1/models", headers=AUTH).json()
    assert raw["object"] == "list"
    for card in raw["data"]:
        strict(Model, card)
