"""Tool calling and reasoning through ``/v1/chat/completions``, in-process, on the demo model.

The demo model has never seen a tool, so what it chooses is poor; what is
tested is the protocol. ``required`` and a named function force the
arguments with the tool's JSON schema, so they always parse and validate
(``jsonschema``); ``auto`` and the reasoning parser read what the model wrote,
so those tests make the model write a Hermes call or a ``<think>`` block with
``guided_regex``. A streamed reply's pieces concatenate exactly to the same
reply unstreamed (same seed, greedy). The conversation that follows a call
(the assistant's ``tool_calls``, then the ``tool`` message) is accepted and
reaches the prompt.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from paged import LLM
from paged.demo import DEFAULT_MODEL_PATH
from paged.serve.app import build_app
from paged.serve.options import ServeOptions

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "description": "the time"}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES = r'Sure\. <tool_call>\{"name": "get_weather", "arguments": \{"city": "P[a-z]{2,4}", "days": [1-7]\}\}</tool_call>'


@pytest.fixture(scope="module")
def llm():
    return LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=160, seed=0)


def client(llm, **options) -> TestClient:
    return TestClient(build_app(llm, "m", options=ServeOptions(**options)))


@pytest.fixture(scope="module")
def plain(llm):
    with client(llm) as c:
        yield c


@pytest.fixture(scope="module")
def auto(llm):
    with client(llm, enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3") as c:
        yield c


def chat(c: TestClient, **body) -> dict:
    r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 64, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def streamed(c: TestClient, **body) -> tuple[dict, str]:
    """The stream of ``body`` gathered: the message it spells and the last finish reason."""
    r = c.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 64, "temperature": 0, "stream": True,
                                             **body})
    assert r.status_code == 200, r.text
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    content, reasoning, calls, reason = "", "", {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"id": piece.get("id"), "name": None, "arguments": ""})
                assert "id" not in piece or call["id"] == piece["id"], "a call's id is sent once"
                call["name"] = call["name"] or piece["function"].get("name")
                call["arguments"] += piece["function"]["arguments"]
            reason = choice["finish_reason"] or reason
    return {"content": content, "reasoning": reasoning,
            "calls": [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)]}, reason


def calls_of(message: dict) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


@pytest.mark.parametrize("parallel", [True, False])
def test_required_forces_valid_calls(plain, parallel):
    """``required`` on any server: at least one call, each naming a tool, its arguments valid JSON for that
    tool's schema; one call only without ``parallel_tool_calls``; streamed equal to unstreamed (exact)."""
    body = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel, seed=1)
    out = chat(plain, **body)["choices"][0]
    calls = calls_of(out["message"])
    assert calls and out["finish_reason"] == "tool_calls" and out["message"]["content"] is None
    assert len(calls) == 1 or parallel
    schemas = {"get_weather": WEATHER, "now": {"type": "object", "properties": {}, "additionalProperties": False}}
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), schemas[name])
    message, reason = streamed(plain, **body)
    assert message["calls"] == calls and reason == "tool_calls"


def test_a_named_function_is_called_with_valid_arguments(plain):
    body = dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    out = chat(plain, **body)["choices"][0]
    [(name, arguments)] = calls_of(out["message"])
    assert name == "get_weather" and out["finish_reason"] == "stop"  # OpenAI's reason for a forced call
    jsonschema.validate(json.loads(arguments), WEATHER)
    message, reason = streamed(plain, **body)
    assert message["calls"] == [(name, arguments)] and reason == "stop"


def test_a_tool_and_a_named_choice_without_a_type_are_functions(plain):
    """vLLM's default: a tool or a named choice that omits ``"type"`` is a function's; the forced call
    is the same as with ``"type": "function"`` written out (greedy: names, arguments and reason, exact)."""
    untyped = [{"function": tool["function"]} for tool in TOOLS]
    out = chat(plain, tools=untyped, tool_choice={"function": {"name": "get_weather"}})["choices"][0]
    typed = chat(plain, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (calls_of(out["message"]), out["finish_reason"]) == \
        (calls_of(typed["choices"][0]["message"]), typed["choices"][0]["finish_reason"])
    assert [name for name, _ in calls_of(out["message"])] == ["get_weather"]


def test_auto_finds_hermes_calls_in_what_the_model_wrote(auto):
    """The reply forced to a Hermes block: one call, the text before it as content; streamed equal."""
    body = dict(tools=TOOLS, guided_regex=HERMES)
    out = chat(auto, **body)["choices"][0]
    [(name, arguments)] = calls_of(out["message"])
    assert name == "get_weather" and json.loads(arguments)["city"].startswith("P")
    assert out["message"]["content"] == "Sure." and out["finish_reason"] == "tool_calls"
    message, reason = streamed(auto, **body)
    assert (message["content"], message["calls"], reason) == ("Sure.", [(name, arguments)], "tool_calls")


def allowed(mode: str, *names: str) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {
        "mode": mode, "tools": [{"type": "function", "function": {"name": n}} for n in names]}}


@pytest.mark.parametrize("name", ["get_weather", "now"])
def test_allowed_tools_required_calls_only_the_allowed_ones(plain, name):
    """``allowed_tools`` in ``required`` mode: every call names the allowed tool, its arguments valid for its
    schema; streamed equal to unstreamed (exact, seeded). Unrestricted, the same seed calls both tools, so
    neither allowed set is what the model would have chosen alone."""
    free = calls_of(chat(plain, tools=TOOLS, tool_choice="required", seed=1)["choices"][0]["message"])
    assert {n for n, _ in free} == {"get_weather", "now"}
    body = dict(tools=TOOLS, tool_choice=allowed("required", name), seed=1)
    out = chat(plain, **body)["choices"][0]
    calls = calls_of(out["message"])
    assert calls and {n for n, _ in calls} == {name} and out["finish_reason"] == "tool_calls"
    for _, arguments in calls:
        jsonschema.validate(json.loads(arguments), WEATHER if name == "get_weather" else {"maxProperties": 0})
    assert streamed(plain, **body) == ({"content": "", "reasoning": "", "calls": calls}, "tool_calls")


def test_allowing_every_tool_is_required(plain):
    """Every tool allowed: the same grammar as ``"required"``, so the same reply (bitwise: same seed)."""
    def reply(choice):
        out = chat(plain, tools=TOOLS, tool_choice=choice, seed=3)["choices"][0]
        return calls_of(out["message"]), out["message"]["content"], out["finish_reason"]  # call ids are random
    assert reply(allowed("required", "now", "get_weather")) == reply("required")


def test_every_tool_reaches_the_template_whatever_is_allowed():
    """The template is told of every tool (the prompt, and its cached blocks, stay the same); what may be
    called is the plan's ``allowed``."""
    from paged.serve.chat_protocol import ChatCompletionRequest
    from paged.serve.tools import plan_tools

    req = ChatCompletionRequest.model_validate({"messages": ASK, "tools": TOOLS, "tool_choice": allowed("auto", "now")})
    plan, functions = plan_tools(req, "hermes")
    assert (plan.mode, plan.allowed, plan.tools) == ("auto", {"now"}, TOOLS)
    assert plan_tools(req.model_copy(update={"tool_choice": "auto"}), "hermes")[0].tools == TOOLS
    assert plan.schema(functions) is None


def test_auto_keeps_a_call_to_a_tool_not_allowed_as_text(auto):
    """``allowed_tools`` in ``auto`` mode: the parser takes only allowed calls; a Hermes block calling another
    tool stays in the content as written (streamed equal), and with the tool allowed it is the call that
    ``"auto"`` finds (exact)."""
    body = dict(tools=TOOLS, guided_regex=HERMES)
    out = chat(auto, tool_choice=allowed("auto", "now"), **body)["choices"][0]
    assert "tool_calls" not in out["message"] or not out["message"]["tool_calls"]
    assert out["message"]["content"].startswith('Sure. <tool_call>{"name": "get_weather"')
    assert out["message"]["content"].endswith("</tool_call>") and out["finish_reason"] == "stop"
    assert streamed(auto, tool_choice=allowed("auto", "now"), **body) == \
        ({"content": out["message"]["content"], "reasoning": "", "calls": []}, "stop")
    free = chat(auto, **body)["choices"][0]["message"]
    both = chat(auto, tool_choice=allowed("auto", "get_weather", "now"), **body)["choices"][0]["message"]
    assert (calls_of(both), both["content"]) == (calls_of(free), free["content"]) and calls_of(free)


def test_the_reasoning_parser_splits_a_think_block(auto):
    body = dict(guided_regex=r"<think>[a-z ]{3,20}</think>[A-Za-z ]{3,20}")
    message = chat(auto, **body)["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"] and "<think>" not in message["content"]
    gathered, _ = streamed(auto, **body)
    assert (gathered["reasoning"], gathered["content"]) == (message["reasoning_content"], message["content"])
    hidden = chat(auto, include_reasoning=False, **body)["choices"][0]["message"]
    assert "reasoning_content" not in hidden and hidden["content"] == message["content"]


def test_a_forced_call_is_not_taken_for_reasoning(llm):
    """deepseek_r1 reads a reply as reasoning until </think>: under a forced call it must not be used."""
    with client(llm, reasoning_parser="deepseek_r1") as c:
        message = chat(c, tools=TOOLS, tool_choice="required")["choices"][0]["message"]
        assert calls_of(message) and "reasoning_content" not in message
        assert "reasoning_content" in chat(c, max_tokens=4)["choices"][0]["message"]


def test_the_conversation_after_a_call_reaches_the_prompt(plain):
    """The assistant's call and the tool's answer are accepted; the demo template knows no tool_calls, so
    the call is written into the assistant's turn as a Hermes block, and the tool's answer follows."""
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    assert chat(plain, messages=history, tools=TOOLS, tool_choice="none", max_tokens=4)["choices"][0]
    r = plain.post("/tokenize", json={"messages": history, "return_token_strs": True})
    text = "".join(r.json()["token_strs"])
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}</tool_call>' in text
    assert "tool: sunny, 21 C" in text


@pytest.mark.parametrize("body, param", [
    ({"tools": TOOLS}, "tool_choice"),  # auto by default: this server has no --enable-auto-tool-choice
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS + TOOLS[:1], "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}], "tool_choice": "none"}, "tools.0.function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": allowed("required", "nope")}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": allowed("auto", "now")}, "tool_choice"),  # auto: needs the parser
    ({"tools": TOOLS, "tool_choice": allowed("required")}, "tool_choice.allowed_tools.tools"),
    ({"tools": TOOLS, "tool_choice": allowed("none", "now")}, "tool_choice.allowed_tools.mode"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools"}}, "tool_choice.allowed_tools"),
    ({"tools": TOOLS, "tool_choice": 3}, "tool_choice"),
    ({"messages": [{"role": "tool", "content": None}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}], "tool_choice": 3}, "tool_choice"),
])
def test_bad_tool_requests_name_their_field(plain, body, param):
    r = plain.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_the_template_receives_tools(llm, tmp_path):
    """A template that lists ``tools`` (as Qwen's do) gets them as the request sent them."""
    from paged.serve.chat_template import ChatRenderer

    template = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    renderer = ChatRenderer(llm.tokenizer, template)
    assert renderer.render(ASK, tools=TOOLS) == "[get_weather][now]" + ASK[0]["content"]
    assert renderer.render(ASK) == ASK[0]["content"]  # no tools: the template's ``tools`` is undefined


def test_a_tool_loop_through_the_official_client(plain):
    """The official ``openai`` client drives a loop: a forced call, the tool's answer sent back, a text reply;
    each answer and chunk parses with the package's own types under ``strict=True``."""
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=plain, max_retries=0)
    messages = list(ASK)
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="required",
                                           max_tokens=48, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name in ("get_weather", "now")
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    final = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="none",
                                           max_tokens=6, temperature=0)
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content
    raw = plain.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS, "tool_choice": "required",
                                                   "max_tokens": 48}).json()
    ChatCompletion.model_validate(raw, strict=True)
    r = plain.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS, "tool_choice": "required",
                                                 "max_tokens": 48, "stream": True})
    for line in r.text.splitlines():
        if line.startswith("data: {"):
            ChatCompletionChunk.model_validate(json.loads(line[6:]), strict=True)
