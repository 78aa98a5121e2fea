"""vLLM's extension fields and shapes, through the live server (``tests/serve/conftest.py``: the demo model).

Each honoured field is checked for what it does (the text, the ids, the counts it changes), each
refused one for its 400 naming the field, each ignored one for its 200 and its line in the server
log; the logprobs carry the sampled token as vLLM's do; the tokenizer routes agree with the
tokenizer the server generates with. Equalities are exact (token ids, texts, counts).
"""

from __future__ import annotations

import json

import httpx
import pytest

from paged.serve.chat_template import ChatRenderer
from paged.serve.extensions import IGNORED, REFUSED, REFUSED_VALUES
from tests.serve.conftest import API_KEY

MODEL = "test-model"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "def add(a, b):"


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def events(server, path: str, body: dict) -> list[dict]:
    """The JSON events of a streamed answer (``[DONE]`` checked and dropped)."""
    r = post(server, path, {**body, "stream": True})
    assert r.status_code == 200, r.text
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


# -- continuous_usage_stats ------------------------------------------------------------------
@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
], ids=["completions", "chat"])
def test_continuous_usage_stats_puts_usage_in_every_chunk(server, path, body):
    """guidellm's stream options: every chunk carries usage, its completion count the tokens sent so far,
    ending at the final usage chunk's count (exact counts)."""
    chunks = events(server, path, {**body, "max_tokens": 10, "ignore_eos": True, "temperature": 0,
                                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    assert all(c["usage"] is not None for c in chunks)
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counts == sorted(counts) and counts[-1] == 10
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 10
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {final["usage"]["prompt_tokens"]}


def test_without_continuous_usage_only_the_last_chunk_has_usage(server):
    chunks = events(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True,
                                                 "stream_options": {"include_usage": True}})
    assert [c["usage"] is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]


# -- fields that change the output -------------------------------------------------------------
def greedy(server, **more) -> dict:
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                         "ignore_eos": True, **more})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_include_stop_str_in_output_keeps_the_stop_string(server, stream):
    """The text ends with the stop string that ended it, and is otherwise the text without the field."""
    full = greedy(server)["choices"][0]["text"]
    stop = full[5:7]
    assert stop and len(full) > 7
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    if stream:
        texts = ["".join(c["choices"][0]["text"] for c in events(server, "/v1/completions", {**body, **extra}))
                 for extra in ({}, {"include_stop_str_in_output": True})]
    else:
        texts = [post(server, "/v1/completions", {**body, **extra}).json()["choices"][0]["text"]
                 for extra in ({}, {"include_stop_str_in_output": True})]
    cut = full[:full.index(stop)]
    assert texts == [cut, cut + stop]


def test_return_tokens_as_token_ids_spells_ids(server):
    plain = greedy(server, max_tokens=6, logprobs=2)["choices"][0]["logprobs"]
    ids = greedy(server, max_tokens=6, logprobs=2, return_tokens_as_token_ids=True)["choices"][0]["logprobs"]
    assert all(t.startswith("token_id:") for t in ids["tokens"])
    decoded = post(server, "/detokenize", {"tokens": [int(t.split(":")[1]) for t in ids["tokens"]]}).json()
    assert decoded["prompt"] == "".join(plain["tokens"])
    assert ids["token_logprobs"] == plain["token_logprobs"]


@pytest.mark.parametrize("path, body", [
    # each stop string begins as the demo model's reply goes on ("Return a string...", "Author of the number..."),
    # so its first words are held back, tokens before their text, until the reply leaves it
    ("/v1/completions", {"prompt": PROMPT, "n": 2, "stop": ["Return a number"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "stop": ["Author of the name"]}),
], ids=["completions", "chat"])
def test_return_token_ids_gives_the_prompts_and_each_choices_ids(server, path, body):
    """vLLM's ``return_token_ids``: the prompt's ids (on each completions choice; at the top of a chat response)
    are ``/tokenize``'s for the same input, and a choice's ``token_ids`` are as many as its completion tokens;
    streamed, the prompt's come once, in the first chunk, and the chunks' ``token_ids`` concatenate to the whole
    answer's — also where a held stop string sends tokens before their text (exact, greedy)."""
    body = {**body, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    whole = post(server, path, body).json()
    prompt = post(server, "/tokenize", {k: v for k, v in body.items() if k in ("prompt", "messages")}).json()["tokens"]
    chat = path.endswith("chat/completions")
    assert (whole["prompt_token_ids"] if chat else whole["choices"][0]["prompt_token_ids"]) == prompt
    assert sum(len(c["token_ids"]) for c in whole["choices"]) == whole["usage"]["completion_tokens"]
    chunks = events(server, path, body)
    firsts = [c.get("prompt_token_ids") for c in chunks] if chat else \
        [c["choices"][0].get("prompt_token_ids") for c in chunks if c["choices"][0]["index"] == 0]
    assert firsts[0] == prompt and not any(firsts[1:])
    for choice in whole["choices"]:
        sent = [t for c in chunks for x in c["choices"] if x["index"] == choice["index"] for t in x.get("token_ids") or []]
        assert sent == choice["token_ids"]
    plain = post(server, path, {**body, "return_token_ids": False}).json()
    assert "prompt_token_ids" not in json.dumps(plain) and "token_ids" not in json.dumps(plain)


def test_request_id_names_the_response(server):
    a = greedy(server, max_tokens=2, request_id="my-run-7")
    b = greedy(server, max_tokens=2, request_id="my-run-7")  # the same id twice: both served
    assert a["id"] == b["id"] == "cmpl-my-run-7"


def test_truncate_prompt_tokens_keeps_the_last_tokens(server):
    ids = post(server, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    assert len(ids) > 4
    cut = greedy(server, truncate_prompt_tokens=4)
    same = greedy(server, prompt=ids[-4:])
    assert cut["usage"]["prompt_tokens"] == 4
    assert cut["choices"][0]["text"] == same["choices"][0]["text"]


def test_chat_continue_final_message_and_echo(server):
    """The prompt ends inside the last (assistant) message; echo puts that message before the reply."""
    messages = [{"role": "user", "content": "add two numbers"}, {"role": "assistant", "content": "def add"}]
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "continue_final_message": True, "add_generation_prompt": False}
    tokens = post(server, "/tokenize", {k: v for k, v in body.items() if k not in ("max_tokens", "temperature",
                                                                                    "ignore_eos")}).json()
    text = post(server, "/detokenize", {"tokens": tokens["tokens"]}).json()["prompt"]
    bos = httpx.get(server.url + "/tokenizer_info", headers=AUTH).json()["bos_token"] or ""
    assert text == bos + "user: add two numbers\nassistant: def add"  # the demo template, cut after the content
    plain = post(server, "/v1/chat/completions", body).json()
    echoed = post(server, "/v1/chat/completions", {**body, "echo": True}).json()
    assert plain["usage"]["prompt_tokens"] == tokens["count"]
    reply = plain["choices"][0]["message"]["content"]
    assert echoed["choices"][0]["message"]["content"] == "def add" + reply
    same = post(server, "/v1/completions", {"prompt": tokens["tokens"], "max_tokens": 6, "temperature": 0,
                                            "ignore_eos": True}).json()
    assert same["choices"][0]["text"] == reply


def test_continue_final_message_with_add_generation_prompt_is_refused(server):
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                              "continue_final_message": True, "add_generation_prompt": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_chat_template_kwargs_reach_the_template(tokenizer_of_demo):
    renderer = ChatRenderer(tokenizer_of_demo, "{% for m in messages %}{{ m['content'] }}{% endfor %}|{{ flavour }}")
    assert renderer.render([{"role": "user", "content": "x"}], variables={"flavour": "terse"}) == "x|terse"
    # the call's own variables win over a request's
    assert renderer.render([{"role": "user", "content": "y"}], variables={"messages": []}).startswith("y|")


@pytest.fixture(scope="module")
def tokenizer_of_demo(model_path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(f"{model_path}/tokenizer.json")


# -- refused and ignored -----------------------------------------------------------------------------
@pytest.mark.parametrize("field", sorted(REFUSED))
def test_refused_fields_get_a_400_naming_them(server, field):
    path = "/v1/chat/completions" if field == "chat_template" else "/v1/completions"
    body = {"messages": [{"role": "user", "content": "hi"}]} if field == "chat_template" else {"prompt": PROMPT}
    r = post(server, path, {**body, "max_tokens": 2, field: "x"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["code"] == "unsupported_parameter" and REFUSED[field] in err["message"]


@pytest.mark.parametrize("field", sorted(REFUSED_VALUES))
def test_fields_are_accepted_at_their_default_and_refused_otherwise(server, field):
    default, why = REFUSED_VALUES[field]
    other = (not default) if isinstance(default, bool) else 1
    assert post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, field: default}).status_code == 200
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, field: other})
    assert r.status_code == 400 and r.json()["error"]["param"] == field and why in r.json()["error"]["message"]


@pytest.mark.parametrize("field", sorted(IGNORED))
def test_ignored_fields_are_accepted_and_logged(server, field):
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                              field: "auto"})
    assert r.status_code == 200, r.text
    assert f"{field} ({IGNORED[field]})" in server.output(tail=None)


@pytest.mark.parametrize("field", ["metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
                                   "modalities", "verbosity", "an_unknown_field_9"])
def test_openai_fields_and_unknown_ones_are_accepted_and_logged_once(server, field):
    """vLLM's rule: a field the server does not use is accepted, and its name is logged the first time only."""
    value = {"metadata": {"k": "v"}, "store": False, "modalities": ["text"]}.get(field, "x")
    for _ in range(2):
        r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                  field: value})
        assert r.status_code == 200, r.text
    assert server.output(tail=None).count(f"request field ignored by this server: {field} (") == 1


def test_a_nested_unknown_field_is_logged_with_its_path(server):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stream": True,
                                         "stream_options": {"include_usage": True, "weird_7": 1}})
    assert r.status_code == 200
    assert "request field ignored by this server: stream_options.weird_7 (" in server.output(tail=None)


# -- logprobs: the sampled token among the top ones ---------------------------------------------------
def check_sampled_inside(positions: list[tuple[int, float, dict[int, float]]], k: int) -> None:
    """Each position's alternatives: the top k, and the sampled token, once, with its own logprob."""
    grew = 0
    for token, logprob, top in positions:
        assert top[token] == logprob
        ranked = sorted(top.values(), reverse=True)
        in_top_k = logprob >= ranked[min(k, len(ranked)) - 1] if k else False
        assert len(top) == (k if in_top_k else k + 1), (token, top)
        grew += not in_top_k
    assert grew, "every sampled token was among the top k: the case under test never happened"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completion_top_logprobs_hold_the_sampled_token(server, stream):
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 1.5, "seed": 3, "ignore_eos": True, "logprobs": 1,
            "return_tokens_as_token_ids": True}  # ids as keys: two tokens never share a spelling
    if stream:
        lps = [c["choices"][0]["logprobs"] for c in events(server, "/v1/completions", body)]
        lp = {k: [v for x in lps if x for v in x[k]] for k in ("tokens", "token_logprobs", "top_logprobs")}
    else:
        lp = post(server, "/v1/completions", body).json()["choices"][0]["logprobs"]
    check_sampled_inside([(int(t.split(":")[1]), p, {int(s.split(":")[1]): v for s, v in top.items()})
                          for t, p, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])], 1)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_top_logprobs_hold_the_sampled_token(server, stream):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 1.5, "seed": 3,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 1, "return_tokens_as_token_ids": True}
    if stream:
        content = [e for c in events(server, "/v1/chat/completions", body)
                   if c["choices"] and c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    else:
        content = post(server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]
    def tid(spelt: str) -> int:
        return int(spelt.split(":")[1])

    check_sampled_inside([(tid(e["token"]), e["logprob"], {tid(t["token"]): t["logprob"] for t in e["top_logprobs"]})
                          for e in content], 1)


# -- tokenizer routes ------------------------------------------------------------------------------------
def test_tokenize_equals_the_engine_prompt(server):
    """Same defaults as /v1/completions (the tokenizer's BOS first); without special tokens, the text alone."""
    t = post(server, "/tokenize", {"prompt": PROMPT}).json()
    r = greedy(server, max_tokens=1)
    assert t["count"] == len(t["tokens"]) == r["usage"]["prompt_tokens"]
    assert t["max_model_len"] == httpx.get(server.url + "/v1/models", headers=AUTH).json()["data"][0]["max_model_len"]
    bare = post(server, "/tokenize", {"prompt": PROMPT, "add_special_tokens": False, "return_token_strs": True}).json()
    assert "".join(bare["token_strs"]) == PROMPT
    assert post(server, "/detokenize", {"tokens": bare["tokens"]}).json() == {"prompt": PROMPT}
    bos = httpx.get(server.url + "/tokenizer_info", headers=AUTH).json()["bos_token"] or ""
    assert post(server, "/detokenize", {"tokens": t["tokens"]}).json() == {"prompt": bos + PROMPT}


def test_tokenize_chat_counts_the_chat_prompt(server):
    messages = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "add two numbers"}]
    t = post(server, "/tokenize", {"messages": messages}).json()
    r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()
    assert t["count"] == r["usage"]["prompt_tokens"]


def test_tokenizer_info_and_bad_input(server):
    info = httpx.get(server.url + "/tokenizer_info", headers=AUTH).json()
    assert info["tokenizer_class"] and info["chat_template"] and info["vocab_size"] > 0
    r = post(server, "/detokenize", {"tokens": [info["vocab_size"]]})
    assert r.status_code == 400 and f"[0, {info['vocab_size']})" in r.json()["error"]["message"]
    assert post(server, "/tokenize", {"prompt": 5}).status_code == 400
    assert post(server, "/tokenize", {"prompt": "x", "model": "other"}).status_code == 404
    assert httpx.get(server.url + "/tokenizer_info").status_code == 401  # the API key guards them too


# -- cache_salt ------------------------------------------------------------------------------
def test_cache_salt_shares_the_prefix_cache_only_within_a_salt(server):
    """Exact counts: a prompt of several blocks, sent again, reports its cached tokens only under the salt
    that computed it (``usage.prompt_tokens_details.cached_tokens``: as many as the same prompt sent twice
    without a salt finds; 0 under another salt and without one); the greedy text is the same every time; a
    salt outside 1..256 characters is a 400 naming it."""
    prompt = "def cache_salted(x):\n    " + "x = x + 1\n    " * 12

    def cached(salt) -> tuple[int, str]:
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, **({"cache_salt": salt} if salt else {})}
        r = post(server, "/v1/completions", body)
        assert r.status_code == 200, r.text
        out = r.json()
        return out["usage"]["prompt_tokens_details"]["cached_tokens"], out["choices"][0]["text"]

    first = cached("tenant-a")
    runs = [cached("tenant-a"), cached("tenant-b"), cached(None), cached(None)]
    assert [n for n, _ in [first] + runs] == [0, runs[3][0], 0, 0, runs[3][0]] and runs[3][0] > 0
    assert len({text for _, text in [first] + runs}) == 1
    for salt in ("", "s" * 257):
        r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "cache_salt": salt})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text


# -- allowed_token_ids -----------------------------------------------------------------------
@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
], ids=["completions", "chat"])
def test_allowed_token_ids_are_the_only_tokens_drawn(server, path, body):
    """Exact: every token of a sampled answer is one of the allowed ids (its logprobs name them); an id
    outside the vocabulary, or an empty list, is a 400 naming the field before anything runs."""
    allowed = [32, 33, 34, 35]
    lp = {"logprobs": 1} if path == "/v1/completions" else {"logprobs": True, "top_logprobs": 1}
    r = post(server, path, {**body, "max_tokens": 12, "ignore_eos": True, "temperature": 1.0, "seed": 3,
                            "allowed_token_ids": allowed, "return_tokens_as_token_ids": True, **lp})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    tokens = choice["logprobs"]["tokens"] if path == "/v1/completions" else \
        [t["token"] for t in choice["logprobs"]["content"]]
    assert len(tokens) == 12 and {int(t.removeprefix("token_id:")) for t in tokens} <= set(allowed)
    for bad in ([10**6], []):
        r = post(server, path, {**body, "max_tokens": 2, "allowed_token_ids": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "allowed_token_ids", r.text
