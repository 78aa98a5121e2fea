"""``/v1/responses`` (OpenAI's Responses API) and ``/version``, in-process on the demo model.

Every answer and every stream event is parsed by the official ``openai``
package's own types (``Response``, ``ResponseStreamEvent``), and the official
client itself drives the API (``responses.create``, ``responses.stream``) over
the app. Equalities are exact: a stream's deltas concatenate to its ``done``
texts and to the same request unstreamed (greedy); ``previous_response_id``
gives the prompt the whole conversation would give; forced calls validate
against their tool's schema.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.responses import InputTokenCountResponse, Response, ResponseStreamEvent
from pydantic import TypeAdapter

from paged import LLM
from paged.demo import DEFAULT_MODEL_PATH
from paged.serve import extensions
from paged.serve.app import build_app
from paged.serve.body import parse
from paged.serve.chat_protocol import ChatCompletionRequest
from paged.serve.options import ServeOptions
from paged.serve.response_builder import ResponseBuilder
from paged.serve.responses import as_chat
from paged.serve.responses_protocol import ResponsesRequest

EVENT = TypeAdapter(ResponseStreamEvent)
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "weather", "parameters": CITY},
         {"type": "web_search"}]  # another tool type: dropped, logged


@pytest.fixture(scope="module")
def c():
    llm = LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=160, seed=0)
    app = build_app(llm, "m", options=ServeOptions(enable_auto_tool_choice=True, tool_call_parser="hermes",
                                                   response_store=4))
    with TestClient(app) as client:
        yield client


def create(c, **body) -> dict:
    r = c.post("/v1/responses", json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    Response.model_validate(r.json())
    return r.json()


def stream(c, **body) -> list[dict]:
    r = c.post("/v1/responses", json={"temperature": 0, "stream": True, **body})
    assert r.status_code == 200, r.text
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    for event in events:
        EVENT.validate_python(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def text_of(response: dict) -> str:
    return "".join(p["text"] for item in response["output"] if item["type"] == "message" for p in item["content"])


def test_text_input_instructions_and_max_output_tokens(c):
    out = create(c, input="def add(a, b):", instructions="Write Python.", max_output_tokens=6)
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert out["usage"]["output_tokens"] == 6 and out["instructions"] == "Write Python."
    assert text_of(out)
    assert c.get(f"/v1/responses/{out['id']}").json() == out


def test_a_stream_spells_the_same_response(c):
    """Exact: output_text deltas = the done text = the completed response's text = the unstreamed text."""
    body = dict(input=[{"role": "user", "content": [{"type": "input_text", "text": "def f(x):"}]}],
                max_output_tokens=12)
    events = stream(c, **body)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.incomplete"
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    [done] = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    final = events[-1]["response"]
    assert deltas == done == text_of(final) == text_of(create(c, **body))
    assert final["usage"]["output_tokens"] == 12


def test_previous_response_id_continues_the_conversation(c):
    """Exact: the follow-up's prompt is the one the whole conversation, sent as items, gives."""
    first = create(c, input="Say hi.", max_output_tokens=4, instructions="Be brief.")
    follow = create(c, input="Again.", previous_response_id=first["id"], max_output_tokens=2)
    whole = create(c, input=[{"role": "user", "content": "Say hi."},
                             {"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": text_of(first)}]},
                             {"role": "user", "content": "Again."}], max_output_tokens=2)
    assert follow["usage"]["input_tokens"] == whole["usage"]["input_tokens"]  # instructions not carried over
    assert follow["previous_response_id"] == first["id"]


def test_responses_not_kept_are_404s_naming_the_field(c):
    gone = create(c, input="x", max_output_tokens=1, store=False)
    assert c.get(f"/v1/responses/{gone['id']}").status_code == 404
    r = c.post("/v1/responses", json={"input": "x", "previous_response_id": gone["id"]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    first = create(c, input="x", max_output_tokens=1)
    for _ in range(4):  # the store holds 4: the oldest goes
        create(c, input="y", max_output_tokens=1)
    assert c.get(f"/v1/responses/{first['id']}").status_code == 404


@pytest.mark.parametrize("body, param", [
    (dict(input="x", max_output_tokens=0), "max_output_tokens"),
    (dict(input="x", max_output_tokens=10**6), "max_output_tokens"),
    (dict(input="x " * 2000, max_output_tokens=2), "input"),
    (dict(input="x", text={"format": {"type": "json_schema", "name": "o", "schema": {"type": "nope"}}}),
     "text.format"),
])
def test_errors_name_the_responses_field_not_the_chat_field_it_became(c, body, param):
    """A request is checked as the chat request it becomes; its 400 names the field the client sent
    (``max_output_tokens``, not ``max_completion_tokens``), in ``param`` and at the message's head (exact)."""
    r = c.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param), error


def test_the_engine_runs_a_response_under_its_own_id(c, monkeypatch):
    """The engine's id of a Responses request is its response's id (and ``-0``): what the server logs
    and the KV view lists is the id the client got (set equality over every step it ran)."""
    scheduler = c.app.fastapi.state.engine.engine.scheduler
    seen, process = set(), scheduler.decoding.process

    def record(sched, req, results):
        seen.add(req.request_id)
        return process(sched, req, results)
    monkeypatch.setattr(scheduler.decoding, "process", record)
    response = create(c, input="x", max_output_tokens=3)
    assert seen == {f"{response['id']}-0"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_that_fails_while_it_runs_is_told_in_responses_terms(c, monkeypatch, stream):
    """A request that fails after it started (its own error, as a grammar meeting a limit would raise,
    here made by the decoding step) gets that error naming the Responses field: the answer's 400, or the
    stream's last event (param and message head: exact)."""
    from paged import RequestError
    scheduler = c.app.fastapi.state.engine.engine.scheduler
    def fail(*args):
        raise RequestError("max_tokens: made to fail while it ran", param="max_tokens")
    monkeypatch.setattr(scheduler.decoding, "process", fail)
    r = c.post("/v1/responses", json={"input": "x", "max_output_tokens": 4, "stream": stream})
    if stream:
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        error = events[-1]
        assert error["type"] == "error", error
    else:
        assert r.status_code == 400, r.text
        error = r.json()["error"]
    assert error["param"] == "max_output_tokens" and error["message"].startswith("max_output_tokens: "), error


@pytest.mark.parametrize("item, message", [
    ({"type": "function_call_output", "call_id": "a"}, "input.0.output: Field required"),
    ({"role": "bogus", "content": "x"},
     "input.0.role: Input should be 'user', 'assistant', 'system' or 'developer' (got 'bogus')"),
    ({"type": "message", "role": "user", "content": [{"type": "input_text"}]}, "input.0.content.0.text: Field required"),
    ({"type": "nope"},
     "input.0.type: Input should be 'message' or 'function_call' or 'function_call_output' or 'reasoning' or 'item_reference' (got 'nope')"),
    # a value of neither type a field takes: what the field takes, in the Responses API's shapes
    ({"role": "user", "content": 5},
     'input.0.content: expected a string or a list of {"type": "input_text", "text": ...} parts (got 5)'),
    ({"type": "function_call_output", "call_id": "a", "output": 5},
     'input.0.output: expected a string or a list of {"type": "input_text", "text": ...} parts (got 5)'),
])
def test_a_bad_input_item_is_told_what_is_wrong_with_it(c, item, message):
    """An item of ``input`` is checked as the kind its ``type`` names (a message without one): the 400 says
    that kind's problem, not that the list is not a string (message and param: exact)."""
    r = c.post("/v1/responses", json={"input": [item]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message
    assert r.json()["error"]["param"] == message.split(":")[0]


@pytest.mark.parametrize("body, message", [
    ({"tools": [{"type": "function", "name": "get weather"}]},
     "tools.0.name: String should match pattern '^[a-zA-Z0-9_.:-]{1,64}$' (got 'get weather')"),
    ({"tools": [{"name": "get_weather"}]}, "tools.0.type: Field required"),
    ({"tool_choice": {"type": "function", "name": 5}}, "tool_choice.name: Input should be a valid string (got 5)"),
    ({"tool_choice": {"name": "get_weather"}}, "tool_choice.type: Field required"),  # no type: a hosted tool's?
    ({"tool_choice": 5}, 'tool_choice: Input should be "none", "auto", "required", {"type": "function", "name": '
                         '...} or {"type": "allowed_tools", "mode", "tools"} (got 5)'),
    ({"tool_choice": "sometimes"}, "tool_choice: Input should be 'none', 'auto' or 'required' (got 'sometimes')"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "any", "tools": [{"type": "function", "name": "f"}]}},
     "tool_choice.mode: Input should be 'auto' or 'required' (got 'any')"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
     "tool_choice.tools: List should have at least 1 item after validation, not 0 (got [])"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "g"}]}},
     "tool_choice: allowed_tools names 'g', which is not among tools (['f'])"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "mcp", "server_label": "x"}]}},
     "tool_choice.tools: allowed_tools in required mode allows no function, and only function tools are served "
     "here"),
    ({"top_logprobs": 21}, "top_logprobs: must be in [0, 20] (got 21)"),
    ({"metadata": {str(i): "x" for i in range(17)}}, "metadata: at most 16 pairs, got 17"),
    ({"metadata": {"k": "v" * 513}}, "metadata: key 'k' (at most 64 characters) or its value (at most 512) is too "
                                     "long"),
    ({"input": 5}, 'input: expected a string or a list of items (each {"type": "message", "role", "content"}, '
                   '"function_call", "function_call_output", "reasoning" or "item_reference") (got 5)'),
])
def test_a_function_tool_is_checked_as_one_and_never_dropped_as_another_type(c, body, message):
    """A tool or tool choice of ``"type": "function"`` is checked as a function's: a name outside the
    published pattern is a 400 naming it, not a tool of another type, dropped with a log line; a field
    of several types says what it takes in this API's shapes (message and param: exact)."""
    r = c.post("/v1/responses", json={"input": "x", "max_output_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message
    assert r.json()["error"]["param"] == message.split(":")[0]


def test_tools_and_choices_of_other_types_are_dropped(c, caplog, monkeypatch):
    """A tool of another type (``web_search``) or a choice of one (``file_search``) is not served: the
    request runs as if it were absent, and the log names it (the echoed tools and choice: exact)."""
    monkeypatch.setattr("paged.serve.extensions._noted", set())  # each is logged once a process: from here
    response = create(c, input="x", max_output_tokens=2, tools=[{"type": "web_search"}],
                      tool_choice={"type": "file_search"})
    assert response["tools"] == [] and response["tool_choice"] == {"type": "file_search"}
    allowing = create(c, input="x", max_output_tokens=2, tools=TOOLS, tool_choice={
        "type": "allowed_tools", "mode": "auto", "tools": [{"type": "web_search"}]})  # no function: "none"
    assert [i["type"] for i in allowing["output"]] == ["message"]
    assert {"tools[type=web_search]", "tool_choice[type=file_search]", "tool_choice.tools[type=web_search]"} <= \
        {r.getMessage().split(": ", 1)[1].split(" (")[0] for r in caplog.records if "ignored" in r.getMessage()}


def test_allowed_tools_narrow_what_may_be_called(c):
    """``allowed_tools`` as the Responses API spells it (flat): in ``required`` mode every call names an allowed
    function (the other one, unrestricted, is what this seed calls first); the choice is echoed as sent."""
    tools = [{"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}}] + TOOLS
    body = dict(input="Weather in Paris?", tools=tools, max_output_tokens=40, seed=2)
    free = create(c, **body, tool_choice="required")
    assert [i["name"] for i in free["output"] if i["type"] == "function_call"][0] == "now"
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}
    narrowed = create(c, **body, tool_choice=choice)
    calls = [i for i in narrowed["output"] if i["type"] == "function_call"]
    assert calls and {i["name"] for i in calls} == {"get_weather"} and narrowed["tool_choice"] == choice
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), CITY)


def test_forced_function_calls_stream_as_function_call_items(c):
    body = dict(input="Weather in Paris?", tools=TOOLS, tool_choice="required", max_output_tokens=40, seed=2)
    whole = create(c, **body)
    calls = [i for i in whole["output"] if i["type"] == "function_call"]
    assert calls and whole["status"] == "completed" and whole["tools"] == [{**TOOLS[0], "strict": None}]
    for call in calls:
        assert call["name"] == "get_weather" and call["call_id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), CITY)
    events = stream(c, **body)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert deltas == "".join(done) == "".join(call["arguments"] for call in calls)
    named = create(c, **{**body, "tool_choice": {"type": "function", "name": "get_weather"}})
    assert [i["name"] for i in named["output"]] == ["get_weather"]


def test_a_tool_loop_sends_the_calls_output_back(c):
    """The function_call and its function_call_output go back as input; the model answers."""
    call = create(c, input="Weather in Paris?", tools=TOOLS, tool_choice="required", max_output_tokens=40)
    fc = next(i for i in call["output"] if i["type"] == "function_call")
    out = create(c, previous_response_id=call["id"], tools=TOOLS, tool_choice="none", max_output_tokens=4,
                 input=[{"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}])
    assert out["status"] in ("completed", "incomplete") and out["output"][0]["type"] == "message"


def test_an_item_reference_stands_for_the_item_it_names(c):
    """``item_reference`` input items: the server puts the kept item in its place, so a request made of
    references answers as the same request with the items written out (text and input tokens: exact,
    greedy), and its ``input_items`` list the items under their own ids. An item is found while any kept
    response holds it (a follow-up holds its conversation's); once none does, a 404 naming the item's place."""
    first = create(c, input=[{"role": "user", "content": "Say hi.", "id": "msg_mine"}], max_output_tokens=6)
    reply = first["output"][0]
    again = {"role": "user", "content": "Again."}
    by_ref = create(c, max_output_tokens=6, input=[{"type": "item_reference", "id": "msg_mine"},
                                                   {"type": "item_reference", "id": reply["id"]}, again])
    written = create(c, max_output_tokens=6, input=[{"role": "user", "content": "Say hi."},
                                                    {"role": "assistant", "content": text_of(first)}, again])
    assert (text_of(by_ref), by_ref["usage"]["input_tokens"]) == \
        (text_of(written), written["usage"]["input_tokens"])
    ids = [i["id"] for i in c.get(f"/v1/responses/{by_ref['id']}/input_items?order=asc").json()["data"]]
    assert ids[:2] == ["msg_mine", reply["id"]]
    c.delete(f"/v1/responses/{first['id']}")  # by_ref still holds both
    assert create(c, max_output_tokens=1, store=False, input=[{"type": "item_reference", "id": "msg_mine"}])
    c.delete(f"/v1/responses/{by_ref['id']}")
    r = c.post("/v1/responses", json={"max_output_tokens": 1, "input": [again, {"type": "item_reference",
                                                                                "id": "msg_mine"}]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "input.1.id", r.text
    twice = create(c, max_output_tokens=1, input=[{"role": "user", "content": "a", "id": "msg_twice"},
                                                   {"role": "user", "content": "b", "id": "msg_twice"}])
    assert c.delete(f"/v1/responses/{twice['id']}").status_code == 200  # an id held twice is let go once
    assert "msg_twice" not in c.app.fastapi.state.response_store.items


def test_a_referenced_call_goes_back_with_its_output(c):
    """A ``function_call`` the model made, sent back by reference with its output, answers as the call written
    out (exact, greedy): an output item is a valid input item."""
    call = create(c, input="Weather in Paris?", tools=TOOLS, tool_choice="required", max_output_tokens=40)
    fc = next(i for i in call["output"] if i["type"] == "function_call")
    answer = {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}
    body = dict(tools=TOOLS, tool_choice="none", max_output_tokens=6)
    by_ref = create(c, input=[{"type": "item_reference", "id": fc["id"]}, answer], **body)
    written = create(c, input=[{k: fc[k] for k in ("type", "call_id", "name", "arguments")}, answer], **body)
    assert (text_of(by_ref), by_ref["usage"]["input_tokens"]) == (text_of(written), written["usage"]["input_tokens"])


def test_logprobs_come_with_the_message_text(c):
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs``: the message's ``output_text`` holds
    each token's logprob and alternatives, exactly the chat answer's ``logprobs.content`` for the same request
    (greedy: the same run); streamed, the deltas carry them in order and the done event and final response hold
    them all (exact). Without ``include``, none; ``top_logprobs`` and ``metadata`` are echoed."""
    body = dict(input="def f(x):", max_output_tokens=6, top_logprobs=2, metadata={"run": "7"})
    chat = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "def f(x):"}],
                                                "max_completion_tokens": 6, "temperature": 0, "logprobs": True,
                                                "top_logprobs": 2}).json()["choices"][0]
    whole = create(c, **body, include=["message.output_text.logprobs"])
    part = whole["output"][0]["content"][0]
    assert part["text"] == chat["message"]["content"] and part["logprobs"] == chat["logprobs"]["content"]
    assert len(part["logprobs"]) == 6 and all(len(t["top_logprobs"]) >= 2 for t in part["logprobs"])
    assert (whole["top_logprobs"], whole["metadata"]) == (2, {"run": "7"})
    events = stream(c, **body, include=["message.output_text.logprobs"])
    sent = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert sent == done["logprobs"] == part["logprobs"] == events[-1]["response"]["output"][0]["content"][0]["logprobs"]
    plain = create(c, **body)
    assert plain["output"][0]["content"][0]["logprobs"] == [] and text_of(plain) == part["text"]


def test_text_format_json_schema(c):
    fmt = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}
    out = create(c, input="A city as JSON.", text={"format": fmt}, max_output_tokens=40)
    jsonschema.validate(json.loads(text_of(out)), CITY)
    assert out["text"]["format"]["name"] == "city"


def test_the_official_client(c):
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=c, max_retries=0)
    response = client.responses.create(model="m", input="def g():", max_output_tokens=5, temperature=0)
    assert response.output_text == text_of(response.model_dump())
    events = list(client.responses.create(model="m", input="def g():", max_output_tokens=5, temperature=0,
                                          stream=True))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text
    assert events[-1].type == "response.incomplete"
    # the stream helper waits for response.completed: a reply that ends on its own (its JSON closes)
    fmt = {"type": "json_schema", "name": "city", "schema": CITY}
    with client.responses.stream(model="m", input="A city.", text={"format": fmt}, max_output_tokens=40) as s:
        texts = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.status == "completed" and "".join(texts) == final.output_text
    jsonschema.validate(json.loads(final.output_text), CITY)


def test_a_deleted_response_is_forgotten(c):
    """The official client's ``responses.delete``: the response then is a 404 to retrieve, to continue
    and to delete again, and the store no longer counts its conversation (exact)."""
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=c, max_retries=0)
    store = c.app.fastapi.state.response_store
    kept = client.responses.create(model="m", input="def g():", max_output_tokens=2, temperature=0)
    chars, size = store.chars, store.entries[kept.id].size
    r = c.delete(f"/v1/responses/{kept.id}")
    assert r.status_code == 200 and r.json() == {"id": kept.id, "object": "response.deleted", "deleted": True}
    assert size > 0 and store.chars == chars - size and kept.id not in store.entries
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)
    again = c.post("/v1/responses", json={"input": "x", "previous_response_id": kept.id})
    assert again.status_code == 404 and again.json()["error"]["param"] == "previous_response_id"
    other = client.responses.create(model="m", input="def h():", max_output_tokens=2, temperature=0)
    assert client.responses.delete(other.id) is None and other.id not in store.entries  # the client's own call


def test_input_items_lists_what_made_the_response_a_page_at_a_time(c):
    """The official client's ``responses.input_items.list``: the items the response was made from, in order
    (exact) — a follow-up's begin with the earlier response's items and its output (not its instructions),
    then every item of its own ``input`` — the client's ids kept, a call's output as its text; pages of
    ``limit`` chained by ``after``, newest first by default; a cursor the response lacks, or a limit past
    100, is a 400 naming the parameter; a response not kept, a 404."""
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=c, max_retries=0)
    first = create(c, input="Say hi.", max_output_tokens=1, instructions="Not listed.")
    text = client.responses.input_items.list(first["id"]).data
    assert [(i.type, i.role, i.content[0].text) for i in text] == [("message", "user", "Say hi.")]
    given = [{"role": "system", "content": "Be brief."},
             {"type": "message", "role": "assistant", "id": "msg_mine", "content": [{"type": "output_text",
                                                                                     "text": "Earlier."}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "sun"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "And "}, {"type": "input_text",
                                                                                  "text": "now?"}]}]
    kept = create(c, input=given, previous_response_id=first["id"], instructions="Be kind.", max_output_tokens=1)
    every = list(client.responses.input_items.list(kept["id"], order="asc", limit=2))  # pages, followed
    earlier, own = every[:-5], every[-5:]
    assert [i.model_dump(mode="json", exclude_none=True) for i in earlier] == \
        [text[0].model_dump(mode="json", exclude_none=True)] + first["output"]  # the first's input, its output
    assert [(i.type, getattr(i, "role", None)) for i in own] == [
        ("message", "system"), ("message", "assistant"), ("function_call", None), ("function_call_output", None),
        ("message", "user")]
    assert own[0].content[0].text == "Be brief." and own[0].content[0].type == "input_text"
    assert own[1].id == "msg_mine" and own[1].content[0].type == "output_text"
    assert (own[2].call_id, own[2].name, own[2].arguments) == ("call_1", "get_weather", '{"city": "Oslo"}')
    assert own[3].output == "sun" and own[4].content[0].text == "And now?"
    assert len({i.id for i in every}) == len(every)
    newest = c.get(f"/v1/responses/{kept['id']}/input_items", params={"limit": 2}).json()
    assert [i["id"] for i in newest["data"]] == [own[4].id, own[3].id] and newest["has_more"] is True
    assert (newest["first_id"], newest["last_id"], newest["object"]) == (own[4].id, own[3].id, "list")
    rest = c.get(f"/v1/responses/{kept['id']}/input_items", params={"after": own[3].id}).json()
    assert [i["id"] for i in rest["data"]] == [i.id for i in every[-3::-1]] and rest["has_more"] is False
    before = c.get(f"/v1/responses/{kept['id']}/input_items", params={"order": "asc", "before": own[1].id}).json()
    assert [i["id"] for i in before["data"]] == [i.id for i in earlier + own[:1]] and before["has_more"] is False
    third = create(c, input="Thanks.", previous_response_id=kept["id"], max_output_tokens=1)
    chained = [i.id for i in client.responses.input_items.list(third["id"], order="asc", limit=100).data]
    assert chained == [i.id for i in every] + [item["id"] for item in kept["output"]] + chained[-1:]
    for params, param in [({"after": "msg_nope"}, "after"), ({"limit": 101}, "limit"), ({"limit": 0}, "limit"),
                          ({"order": "up"}, "order")]:
        r = c.get(f"/v1/responses/{kept['id']}/input_items", params=params)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")
    unkept = create(c, input="x", max_output_tokens=1, store=False)
    assert c.get(f"/v1/responses/{unkept['id']}/input_items").status_code == 404


def test_reasoning_then_text_then_a_call_as_events():
    """The builder alone: a reasoning item, a message and a call, each opened, filled and closed in order,
    each event one the official types accept."""
    builder = ResponseBuilder(ResponsesRequest(input="x"), "m")
    events = builder.start() + builder.feed("hm", None, []) + builder.feed("more", "Hi", []) + \
        builder.feed(None, None, [(0, "call_1", "f", '{"a"')]) + builder.feed(None, None, [(0, None, None, ": 1}")])
    closing, final = builder.finish("tool_calls", None)
    kinds = [e.type for e in events + closing]
    for e in events + closing:
        EVENT.validate_python(e.model_dump())
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "hmmore" and final.output[2].arguments == '{"a": 1}'
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    assert kinds[-1] == "response.completed"


def test_every_tokens_logprob_is_in_the_message_streamed_or_not():
    """The builder alone, with logprobs: fed step by step (reasoning, text, then a call), the message's
    ``output_text`` holds every token's logprob in order — the reasoning's before its text, the call's after it
    closed — as when fed the whole reply at once (exact); the deltas carry the ones up to the text's end."""
    lp = [{"token": t, "logprob": -1.0, "bytes": [], "top_logprobs": []} for t in "abcde"]
    stepped = ResponseBuilder(ResponsesRequest(input="x"), "m")
    events = stepped.feed("hm", None, [], lp[:1]) + stepped.feed(None, "Hi", [], lp[1:3]) + \
        stepped.feed(None, None, [(0, "call_1", "f", "{")], lp[3:4]) + stepped.feed(None, None, [(0, None, None, "}")],
                                                                                      lp[4:])
    final = stepped.finish("tool_calls", None)[1]
    whole = ResponseBuilder(ResponsesRequest(input="x"), "m")
    whole.feed("hm", "Hi", [(0, "call_1", "f", "{}")], lp)
    assert final.output[1].content[0].logprobs == whole.finish("tool_calls", None)[1].output[1].content[0].logprobs == lp
    assert [x for e in events if e.type == "response.output_text.delta" for x in e.logprobs] == lp[:3]


def test_version(c):
    from paged.serve.app import __version__

    assert c.get("/version").json() == {"version": __version__}


def test_the_chat_body_a_responses_request_becomes_is_not_walked_for_unknown_fields(monkeypatch):
    """Exact (the models walked): the client's Responses body is searched for fields to log, and so is a
    chat body a client sends; the chat body the server writes from a checked Responses request is not (it
    has none to log, and the walk over 40 000 messages cost 0.6 s)."""
    walked, real = [], extensions.unknown_fields

    def counting(model, prefix=""):
        if not prefix:
            walked.append(type(model).__name__)
        return real(model, prefix)

    monkeypatch.setattr(extensions, "unknown_fields", counting)
    items = [{"type": "message", "role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    req = parse(json.dumps({"model": "m", "input": items, "max_output_tokens": 2}).encode(), ResponsesRequest)
    body, chat = as_chat(req, [])
    assert walked == ["ResponsesRequest"] and len(chat.messages) == 2
    ChatCompletionRequest.model_validate(body)
    assert walked == ["ResponsesRequest", "ChatCompletionRequest"]


def test_truncation_auto_drops_the_oldest_turns_until_the_prompt_fits(c):
    """Past the context (the demo model's 1 024 tokens), ``truncation: "auto"`` answers as the same request
    with its oldest whole turns dropped, the fewest that fit (exact: the same greedy text and input tokens as
    that shorter request sent as it is, and one turn more does not fit); ``"disabled"`` (the default) is the
    400 it was; a last turn that alone does not fit stays a 400."""
    turns = []
    for i in range(6):  # six turns of about 230 tokens each: about 1 400 in all
        turns += [{"role": "user", "content": f"Question {i}: " + "tell me more " * 70},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"Answer {i}."}]}]
    turns.append({"role": "user", "content": "And now?"})
    body = dict(input=turns, instructions="Be brief.", max_output_tokens=8)
    r = c.post("/v1/responses", json={**body, "temperature": 0})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    cut = create(c, **body, truncation="auto")
    assert cut["truncation"] == "auto" and cut["usage"]["input_tokens"] + 8 <= 1024
    kept = next(k for k in range(0, len(turns), 2)
                if c.post("/v1/responses", json={**body, "input": turns[k:], "temperature": 0}).status_code == 200)
    assert kept > 0
    same = create(c, **{**body, "input": turns[kept:]})
    assert (text_of(cut), cut["usage"]["input_tokens"]) == (text_of(same), same["usage"]["input_tokens"])
    assert same["truncation"] == "disabled"
    exact = 1024 - same["usage"]["input_tokens"]  # the prompt and the answer fill the context to its last token
    edge = create(c, **{**body, "max_output_tokens": exact}, truncation="auto")
    assert edge["usage"]["input_tokens"] == same["usage"]["input_tokens"]
    alone = c.post("/v1/responses", json={"input": "word " * 1100, "truncation": "auto", "max_output_tokens": 2})
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "input", alone.text
    assert count(c, **body, truncation="auto") == cut["usage"]["input_tokens"]  # counted after the same cut
    assert count(c, **body) > 1024  # disabled: the whole conversation, counted as it is


def count(c, **body) -> int:
    r = c.post("/v1/responses/input_tokens", json=body)
    assert r.status_code == 200, r.text
    assert InputTokenCountResponse.model_validate(r.json()).object == "response.input_tokens"
    return r.json()["input_tokens"]


def test_input_tokens_counts_what_the_response_would_be_given(c):
    """``POST /v1/responses/input_tokens`` (the official client's ``responses.input_tokens.count``) counts the
    prompt the same request would make — instructions, a previous response's conversation, references, tools
    — exactly its ``usage.input_tokens``; without any conversation, a 400 naming ``input``."""
    first = create(c, input="def f(x):", instructions="Python.", max_output_tokens=3)
    assert count(c, input="def f(x):", instructions="Python.") == first["usage"]["input_tokens"]
    bodies = [dict(previous_response_id=first["id"], input="More."),
              dict(input=[{"type": "item_reference", "id": first["output"][0]["id"]}, {"role": "user", "content": "Hm"}]),
              dict(input="Weather?", tools=TOOLS, tool_choice="required"),
              dict(instructions="Only instructions.")]
    for body in bodies[:3]:
        assert count(c, **body) == create(c, **body, max_output_tokens=2)["usage"]["input_tokens"], body
    assert count(c, **bodies[3]) < first["usage"]["input_tokens"]
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=c, max_retries=0)
    assert client.responses.input_tokens.count(model="m", input="def f(x):", instructions="Python.").input_tokens \
        == first["usage"]["input_tokens"]
    for bad, param in (({}, "input"), ({"input": "x", "top_p": 2}, "top_p"),
                       ({"input": "x", "max_output_tokens": 0}, "max_output_tokens")):  # as create refuses them
        r = c.post("/v1/responses/input_tokens", json=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_cache_salt_reaches_the_prefix_cache(c):
    """Exact counts: the same input under one salt finds its blocks again (``cached_tokens``: as many as it
    finds sent twice without a salt), under another none; the text is the same."""
    body = dict(input="def salted(x):\n    " + "x = x * 2\n    " * 10, max_output_tokens=3)
    outs = [create(c, **body, **({"cache_salt": salt} if salt else {})) for salt in ("r-a", "r-a", "r-b", None, None)]
    found = [r["usage"]["input_tokens_details"]["cached_tokens"] for r in outs]
    assert found == [0, found[4], 0, 0, found[4]] and found[4] > 0
    assert len({text_of(r) for r in outs}) == 1
