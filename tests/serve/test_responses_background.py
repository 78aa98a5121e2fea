"""Background responses (``background: true``; ``paged/serve/background.py``, ``response_store.py``), in-process
on the demo model.

The official ``openai`` client drives them (``responses.create(background=True)``, ``retrieve``, ``retrieve(...,
stream=True, starting_after=N)``, ``cancel``) and its types parse every answer and event. The engine thread is
held before each step by a gate the test opens a step at a time, so a response is queued, or in progress, for
as long as a test needs it to be. Equalities are exact: a background response (greedy) is the same response,
text and usage, as the same request answered at once; a stream resumed after its event N is the events after
N of the whole stream, the same texts; after a cancel the engine holds no request and every block is free.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from paged import LLM
from paged.demo import DEFAULT_MODEL_PATH
from paged.serve.app import build_app
from paged.serve.options import ServeOptions
from paged.serve.background import Background
from paged.serve.response_store import ResponseStore
from paged.serve.response_builder import ResponseBuilder
from paged.serve.responses_protocol import ResponsesRequest

EVENT = TypeAdapter(ResponseStreamEvent)
STORE = 8  # responses kept; one client may run a quarter of them (2) in the background at once
WAIT_S = 60  # the most a test waits for a response to get somewhere (it takes milliseconds)


class Gate:
    """While closed, the engine's step does nothing (the engine thread still takes requests and aborts between
    steps); ``allow(n)`` lets n steps through."""

    def __init__(self, engine) -> None:
        self.cond = threading.Condition()
        self.permits: int | None = None  # None: open
        real = engine.step

        def step():
            with self.cond:
                if self.permits == 0:
                    self.cond.wait(0.005)
                    return []
                if self.permits is not None:
                    self.permits -= 1
            return real()

        engine.step = step

    def close(self) -> None:
        with self.cond:
            self.permits = 0

    def allow(self, n: int) -> None:
        with self.cond:
            self.permits = (self.permits or 0) + n
            self.cond.notify_all()

    def open(self) -> None:
        with self.cond:
            self.permits = None
            self.cond.notify_all()


@pytest.fixture(scope="module")
def served():
    llm = LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=160, seed=0)
    gate = Gate(llm.engine)
    app = build_app(llm, "m", options=ServeOptions(response_store=STORE))
    with TestClient(app) as c:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=c, max_retries=0)
        yield c, client, gate, llm.engine
        gate.open()


@pytest.fixture
def s(served):
    c, client, gate, engine = served
    gate.open()
    yield served
    gate.open()
    settle(engine)


def settle(engine) -> None:
    """Wait until the engine holds no request (an abort is taken between steps)."""
    deadline = time.monotonic() + WAIT_S
    while engine.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.requests
    assert engine.scheduler.kv.num_free == engine.scheduler.kv.num_blocks  # every block back


def until(client, response_id: str, done) -> Response:
    """Poll ``GET /v1/responses/{id}`` until ``done(response)``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        r = client.responses.retrieve(response_id)
        if done(r) or time.monotonic() > deadline:
            assert done(r), r.status
            return r
        time.sleep(0.01)


def strict(r: Response) -> Response:
    """``r`` checked by the official type itself (the client builds its answers without checking them)."""
    return Response.model_validate(r.model_dump(mode="json"))


def finished(r: Response) -> bool:
    return r.status not in ("queued", "in_progress")


BODY = dict(model="m", input="def f(x):", max_output_tokens=24, temperature=0)


def test_a_background_response_is_queued_then_the_same_response(s):
    """Exact: polled to its end, a background response's text and usage are those of the request answered at
    once; it is queued until the engine gives its first token, then in progress."""
    c, client, gate, engine = s
    gate.close()
    r = client.responses.create(**BODY, background=True)
    assert (strict(r).status, r.background, r.output, r.usage) == ("queued", True, [], None)
    assert client.responses.retrieve(r.id).status == "queued"  # the engine has taken no step
    gate.allow(1)  # the prompt's step: its first token
    assert until(client, r.id, lambda x: x.status != "queued").status == "in_progress"
    gate.open()
    done = strict(until(client, r.id, finished))
    at_once = client.responses.create(**BODY)
    assert (done.status, done.output_text, done.usage.output_tokens) == \
        (at_once.status, at_once.output_text, at_once.usage.output_tokens)
    assert done.output_text and done.background and not at_once.background
    assert done.usage.input_tokens == at_once.usage.input_tokens


def test_a_dropped_stream_resumes_after_its_last_event(s):
    """Exact: the events after N, streamed again (while it runs and after it ended), are the whole stream's
    events after N; the generation went on without a reader."""
    c, client, gate, engine = s
    whole_body = {**BODY, "background": True, "stream": True}
    gate.close()
    seen = first_events(c, whole_body, 2)  # created, queued: then the reader goes away
    assert [e["type"] for e in seen] == ["response.created", "response.queued"]
    rid = seen[0]["response"]["id"]
    gate.open()
    done = until(client, rid, finished)
    rest = [e.model_dump() for e in client.responses.retrieve(rid, stream=True, starting_after=1)]
    events = seen + rest
    for e in events:
        EVENT.validate_python(e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[2]["type"] == "response.in_progress" and events[-1]["type"] == f"response.{done.status}"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == done.output_text == events[-1]["response"]["output"][0]["content"][0]["text"]
    again = [e.model_dump() for e in client.responses.retrieve(rid, stream=True, starting_after=10)]
    assert again == events[11:]
    # a stream resumed while the response runs follows it to its end
    gate.close()
    second = first_events(c, whole_body, 1)[0]["response"]["id"]
    follower = client.responses.retrieve(second, stream=True, starting_after=0)
    gate.open()
    followed = [(e.sequence_number, e.type) for e in follower]
    assert followed[:2] == [(1, "response.queued"), (2, "response.in_progress")]
    assert followed[-1][1] == f"response.{until(client, second, finished).status}"
    # one polled only keeps no events: streaming it again is a 400 naming stream
    polled = client.responses.create(**BODY, background=True)
    with pytest.raises(openai.BadRequestError, match="background: true and stream: true"):
        list(client.responses.retrieve(polled.id, stream=True))


def first_events(c, body: dict, n: int) -> list[dict]:
    """The first ``n`` events of a stream, then the connection closed."""
    seen = []
    with c.stream("POST", "/v1/responses", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
                if len(seen) == n:
                    return seen
    return seen


def test_cancel_aborts_the_engine_request_and_keeps_what_was_said(s):
    """Exact: a cancelled response is ``cancelled`` with the text it had (its message ``incomplete``); the
    engine then holds no request and every block is free (``settle``); a second cancel answers the same."""
    c, client, gate, engine = s
    gate.close()
    r = client.responses.create(**{**BODY, "max_output_tokens": 500}, background=True)
    gate.allow(4)
    until(client, r.id, lambda x: x.status == "in_progress")
    time.sleep(0.1)  # the permitted steps taken
    stopped = strict(client.responses.cancel(r.id))
    assert stopped.status == "cancelled" and stopped.id == r.id
    assert c.app.fastapi.state.engine.num_streams == 0  # its engine request aborted, with the engine held
    assert stopped.output[0].status == "incomplete" and stopped.output[0].content[0].text
    assert client.responses.cancel(r.id) == stopped == client.responses.retrieve(r.id)
    gate.open()
    settle(engine)
    with pytest.raises(openai.BadRequestError, match="cancelled"):
        client.responses.create(**BODY, previous_response_id=r.id)
    at_once = client.responses.create(**BODY)
    with pytest.raises(openai.BadRequestError, match="not made in the background"):
        client.responses.cancel(at_once.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nope")
    with pytest.raises(openai.BadRequestError, match="has no events kept"):
        list(client.responses.retrieve(at_once.id, stream=True))


def test_a_running_response_is_listed_refused_as_previous_and_deleted(s):
    """A running response's input items are listed; continuing it is a 400 (it is still running); deleting
    it cancels it first (then it is a 404, and the engine holds nothing)."""
    c, client, gate, engine = s
    gate.close()
    r = client.responses.create(**BODY, background=True)
    assert [i.content[0].text for i in client.responses.input_items.list(r.id).data] == ["def f(x):"]
    with pytest.raises(openai.BadRequestError, match="still queued"):
        client.responses.create(**BODY, previous_response_id=r.id)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    gate.open()
    settle(engine)


def test_background_bounds_refuse_before_the_engine(s):
    """``store: false`` is a 400 naming ``background``; a client's third running response (a quarter of the
    store's 8) a 429 with ``Retry-After``; neither reaches the engine."""
    c, client, gate, engine = s
    gate.close()
    r = c.post("/v1/responses", json={**BODY, "background": True, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background", r.text
    running = [client.responses.create(**BODY, background=True) for _ in range(STORE // 4)]
    r = c.post("/v1/responses", json={**BODY, "background": True})
    assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
    assert r.json()["error"]["param"] == "background" and "at most 2" in r.json()["error"]["message"]
    state = c.app.fastapi.state
    assert len(state.response_store.running) == state.engine.num_streams == STORE // 4  # none added
    for one in running:
        assert client.responses.cancel(one.id).status == "cancelled"
    assert client.responses.create(**BODY, background=True).status == "queued"  # room again
    gate.open()


def test_running_events_count_in_the_stores_size(s, monkeypatch):
    """A streamed background response's events count in the store's size as they are written: the oldest kept
    responses go first to make room for them; once the running events alone pass the size, the response with
    the most is ended ``failed`` (its events dropped, its text so far kept; the engine then holds nothing), and
    the store's counts are back to what it keeps (exact)."""
    c, client, gate, engine = s
    store = c.app.fastapi.state.response_store
    monkeypatch.setattr(store, "max_chars", 16_000)  # a 24-token stream's events: about 10 000
    kept = client.responses.create(**BODY)
    short = list(client.responses.create(**BODY, background=True, stream=True))[0].response.id
    assert {kept.id, short} <= store.entries.keys()
    long = first_events(c, {**BODY, "max_output_tokens": 200, "background": True, "stream": True}, 1)
    rid = long[0]["response"]["id"]
    stopped = strict(until(client, rid, finished))
    assert stopped.status == "failed" and "passed, with the others', the 16000" in stopped.error.message
    assert stopped.output[0].content[0].text  # what it said before it was stopped
    with pytest.raises(openai.BadRequestError, match="has no events kept"):
        list(client.responses.retrieve(rid, stream=True))
    for gone in (kept.id, short):  # the oldest went first, to make room
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(gone)
    settle(engine)
    assert store.running_chars == 0 and store.chars == sum(k.size for k in store.entries.values())
    again = [e.sequence_number for e in client.responses.create(**BODY, background=True, stream=True)]
    assert again == list(range(len(again))) and again[-1] > 20  # a response that fits still streams whole


def test_the_store_weighs_conversations_by_their_texts():
    """What the store counts of a kept response (exact): each message and item, its texts (content, reasoning,
    a call's name and arguments, an output) plus ``ITEM_CHARS`` — weighed, not written out as JSON, so a
    follow-up holding its whole conversation again costs the event loop little."""
    from paged.serve.response_store import ITEM_CHARS, item_chars, message_chars
    from paged.serve.responses_schemas import (FunctionCallOut, FunctionCallOutputOut, InputMessage, InputText,
                                               ReasoningOut, ReasoningText)

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    assert message_chars({"role": "user", "content": "hello"}) == ITEM_CHARS + 5
    assert message_chars({"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "hm"}) \
        == ITEM_CHARS + 2 + ITEM_CHARS + 1 + 8
    assert item_chars(InputMessage(id="m", role="user", content=[InputText(text="abc"), InputText(text="de")])) \
        == ITEM_CHARS + 5
    assert item_chars(FunctionCallOut(id="fc", call_id="c1", name="f", arguments='{"a": 1}', status="completed")) \
        == ITEM_CHARS + 1 + 8
    assert item_chars(FunctionCallOutputOut(id="o", call_id="c1", output="sunny")) == ITEM_CHARS + 5
    assert item_chars(ReasoningOut(id="r", status="completed", summary=[{"type": "summary_text", "text": "s"}],
                                   content=[ReasoningText(text="think")])) == ITEM_CHARS + 1 + 5
    store = ResponseStore(4)
    builder = ResponseBuilder(ResponsesRequest(input="x"), "m")
    builder.feed(None, "Hi", [])
    store.put(builder.finish("stop", None)[1], [{"role": "user", "content": "x"}],
              [InputMessage(id="m", role="user", content=[InputText(text="x")])])
    assert store.chars == (ITEM_CHARS + 1) * 2


def test_a_stopping_server_ends_a_background_response_failed(s):
    """A graceful stop's last step (``AsyncEngine.end_all``) ends a running background response as it ends a
    stream: ``failed``, with the stop's reason; nothing is left running."""
    c, client, gate, engine = s
    gate.close()
    r = client.responses.create(**BODY, background=True)
    c.portal.call(c.app.fastapi.state.engine.end_all, "the server is stopping")
    stopped = strict(until(client, r.id, finished))
    assert stopped.status == "failed" and "the server is stopping" in stopped.error.message
    assert not c.app.fastapi.state.response_store.running


def test_an_engine_failure_fails_the_response_with_its_error():
    """A background response whose engine fails is ``failed``, with the engine's error; its stream ends with
    the error event, then ``response.failed``."""
    llm = LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=64, seed=0)

    def broken():
        raise RuntimeError("a broken step")

    llm.engine.step = broken
    app = build_app(llm, "m", options=ServeOptions(response_store=4))
    with TestClient(app) as c:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=c, max_retries=0)
        rid = first_events(c, {**BODY, "background": True, "stream": True}, 1)[0]["response"]["id"]
        failed = strict(until(client, rid, finished))
        assert failed.status == "failed" and failed.error.code == "server_error"
        assert "a broken step" in failed.error.message
        kinds = [e.type for e in client.responses.retrieve(rid, stream=True)]
        assert kinds == ["response.created", "response.queued", "error", "response.failed"]


def test_a_job_cancelled_before_its_task_began_aborts_its_engine_request():
    """The one path the server's own stream does not abort: a cancel that lands before the task's first step."""
    aborted = []

    async def events():
        yield  # never reached
        raise AssertionError("the task ran")

    async def main():
        store = ResponseStore(4)
        builder = ResponseBuilder(ResponsesRequest(input="x", background=True), "m")
        job = Background(builder, "c", [], [], abort=lambda: aborted.append(builder.id))
        store.start(job, events())
        return store, await store.cancel(builder.id), builder.id

    store, response, rid = asyncio.run(main())
    assert aborted == [rid] and response.status == "cancelled" and not store.running
    assert store.get(rid).conversation is None


def test_the_server_stops_with_a_background_response_running():
    """Leaving the app (its lifespan's end) cancels what runs in the background: nothing hangs, and its engine
    request is aborted."""
    llm = LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=64, seed=0)
    Gate(llm.engine).close()  # it stays queued
    app = build_app(llm, "m", options=ServeOptions(response_store=4))
    with TestClient(app) as c:
        r = c.post("/v1/responses", json={**BODY, "max_output_tokens": 900, "background": True})
        assert r.status_code == 200 and r.json()["status"] == "queued"
        rid = r.json()["id"]
    assert app.fastapi.state.response_store.get(rid).response.status == "cancelled"
    assert not app.fastapi.state.response_store.running
    assert app.fastapi.state.engine.num_streams == 0  # its engine request aborted (the stopped engine's business)
