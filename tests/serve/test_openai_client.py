"""The server through the official ``openai`` client: every endpoint and sampling feature, and
outputs equal to offline ``LLM.generate`` (token-identical, greedy, same model and dtype)."""

from __future__ import annotations

import json

import httpx
import pytest

from paged import LLM, SamplingParams
from tests.serve.conftest import API_KEY, BLOCK_SIZE, NUM_BLOCKS

MODEL = "test-model"
PROMPTS = ["def add(a, b):", "for i in range(10):", "print('héllo €')"]


@pytest.fixture(scope="module")
def offline(model_path):
    return LLM(model_path, dtype="float32", device="cpu", block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS)


def test_models_lists_the_served_name(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_models_show_the_served_name_and_no_path_on_the_server(server, client, model_path):
    """``root`` is the served name: a client learns nothing of the server's disk."""
    for card in (client.models.list().data[0], client.models.retrieve(MODEL)):
        assert card.root == MODEL
    listing = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {client.api_key}"}).text
    assert model_path not in listing and "/" not in listing.replace("\\/", "")


def test_health_and_root(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_completions_equal_offline_generate_greedy(client, offline):
    """Bitwise-equal tokens: the same engine code, model, dtype and batch (all prompts in one request)."""
    r = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=12, temperature=0)
    want = offline.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [o.outputs[0].text for o in want]
    assert [c.finish_reason for c in r.choices] == [o.outputs[0].finish_reason for o in want]
    assert r.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in want)
    assert r.usage.completion_tokens == sum(len(o.outputs[0].token_ids) for o in want)


def test_chat_equals_offline_generate_on_the_rendered_prompt(client, offline):
    msgs = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "add two numbers"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=10, temperature=0)
    prompt = offline.encode("system: be terse\nuser: add two numbers\nassistant:")  # the demo's chat_template.jinja
    want = offline.generate([prompt], SamplingParams(temperature=0, max_tokens=10), use_tqdm=False)[0]
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.outputs[0].text
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)


def test_token_id_prompt_equals_text_prompt(client, offline):
    ids = offline.encode(PROMPTS[0])
    a = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    b = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_stream_concatenates_to_the_non_streamed_text(client, kind):
    """Seeded sampling at temperature 1: the random model emits partial UTF-8 characters, so the stream must
    hold them back; the concatenation equals the non-streamed text and no chunk but the last ends in U+FFFD."""
    kw = dict(model=MODEL, max_tokens=24, temperature=1.0, seed=7, extra_body={"ignore_eos": True})
    if kind == "completion":
        full = client.completions.create(prompt=PROMPTS[2], **kw).choices[0].text
        chunks = list(client.completions.create(prompt=PROMPTS[2], stream=True, **kw))
        pieces = [c.choices[0].text for c in chunks]
        finishes = [c.choices[0].finish_reason for c in chunks]
    else:
        msgs = [{"role": "user", "content": PROMPTS[2]}]
        full = client.chat.completions.create(messages=msgs, **kw).choices[0].message.content
        chunks = list(client.chat.completions.create(messages=msgs, stream=True, **kw))
        assert chunks[0].choices[0].delta.role == "assistant"
        pieces = [c.choices[0].delta.content or "" for c in chunks]
        finishes = [c.choices[0].finish_reason for c in chunks]
    assert "".join(pieces) == full
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    # a chunk never ends inside a character (once sent, a U+FFFD could not be taken back, and the
    # concatenation above would differ); U+FFFD inside the text is the model's own invalid bytes
    assert all(not p.endswith("\ufffd") for p in pieces[:-1])


def test_stream_usage_with_include_usage(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])


def test_n3_gives_three_distinct_seeded_samples(client):
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, n=3, seed=3,
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 3
    assert r.usage.completion_tokens == 24
    again = client.completions.create(**kw)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    streamed = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(3)] == [c.text for c in r.choices]


def test_beam_search_equals_offline_beam_search(client, offline):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=6, temperature=0, n=2,
                                  extra_body={"use_beam_search": True, "best_of": 3})
    want = offline.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=6, n=2, best_of=3,
                                                         use_beam_search=True), use_tqdm=False)[0]
    assert [c.text for c in r.choices] == [o.text for o in want.outputs]
    assert len(r.choices) == 2


def test_beam_search_returns_the_logprobs_it_was_asked_for(client, offline):
    """Each beam's logprobs through the server equal the offline engine's (bitwise: same engine,
    same floats through JSON's round-trip of a double), at most 2 alternatives per token plus the chosen one."""
    r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=6, temperature=0, n=2, logprobs=2,
                                  extra_body={"use_beam_search": True, "best_of": 3})
    want = offline.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=6, n=2, best_of=3, logprobs=2,
                                                         use_beam_search=True), use_tqdm=False)[0]
    for c, o in zip(r.choices, want.outputs, strict=True):
        assert c.logprobs is not None
        assert c.logprobs.token_logprobs == [e[t] for t, e in zip(o.token_ids, o.logprobs)]
        assert all(1 <= len(top) <= 3 for top in c.logprobs.top_logprobs)


def test_logprobs_completion_and_chat(client):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    for tok_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert tok_lp <= 0 and 1 <= len(top) <= 3
        assert max(top.values()) == pytest.approx(tok_lp)  # greedy: the chosen token is the most likely
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2,
                                       extra_body={"ignore_eos": True})
    content = c.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == pytest.approx(t.logprob) for t in content)
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace").startswith(
        c.choices[0].message.content[:1])


def test_stop_strings_are_honoured_and_not_returned(client, offline):
    base = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) >= 6
    stop = base[3:6]  # a string inside the greedy continuation; it may span tokens
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0, stop=[stop],
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    assert r.choices[0].text == base[:base.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    assert streamed == r.choices[0].text
    want = offline.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20, stop=[stop],
                                                         ignore_eos=True), use_tqdm=False)[0]
    assert r.choices[0].text == want.outputs[0].text


def test_seed_makes_sampling_deterministic(client):
    kw = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=1.0, extra_body={"ignore_eos": True})
    a = client.completions.create(seed=11, **kw).choices[0].text
    b = client.completions.create(seed=11, **kw).choices[0].text
    c = client.completions.create(seed=12, **kw).choices[0].text
    assert a == b
    assert a != c


def test_echo_prepends_the_prompt(client):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    assert r.choices[0].text == PROMPTS[0] + plain.choices[0].text


LINE_BREAKS_BEYOND_SSE = "a\u2028b\u2029c\x85d"  # str.splitlines() breaks at each; SSE only at \r, \n


def test_stream_events_are_one_line_each_for_clients_that_split_like_splitlines(server):
    """Each streamed event is ONE line for a reader that splits as ``str.splitlines`` does.

    httpx's ``aiter_lines`` (guidellm reads streams with it) breaks lines at U+2028, U+2029 and
    U+0085 as well as at ``\\n``; the JSON of an event must carry those characters escaped
    (``\\u2028``), which decodes to the same text. The echoed prompt puts them in the stream.
    Exact equality: the text that comes back is the prompt as sent."""
    body = {"model": MODEL, "prompt": "x " + LINE_BREAKS_BEYOND_SSE, "max_tokens": 2, "temperature": 0,
            "echo": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines), lines
    events = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text.startswith("x " + LINE_BREAKS_BEYOND_SSE)
