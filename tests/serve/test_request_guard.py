"""The guard in front of the app, without a model: the Host check (DNS rebinding) and body parsing bounds."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from paged.serve.body import MAX_JSON_DEPTH, json_depth
from paged.serve.guard import Guard, host_allowed

pytestmark = pytest.mark.step05


@pytest.mark.parametrize("bind, host, allowed", [
    ("127.0.0.1", "127.0.0.1:8000", True), ("127.0.0.1", "localhost:8000", True), ("127.0.0.1", "[::1]:8000", True),
    ("127.0.0.1", "evil.example:8000", False), ("127.0.0.1", "localhost.evil.example", False),
    ("127.0.0.1", "", False), ("0.0.0.0", "10.1.2.3:8000", True), ("0.0.0.0", "rebound.example", False),
    ("0.0.0.0", "localhost", True), ("10.1.2.3", "10.1.2.3:8000", True), ("10.1.2.3", "127.0.0.1", False),
    ("::1", "[::1]:80", True), ("::", "[fe80::1]:80", True), ("myhost", "MyHost:80", True),
])
def test_host_allowed_names_only_the_bind_address(bind, host, allowed):
    assert host_allowed(host, bind) is allowed


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _post(guard, headers):
    async def go():
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            return await c.post("/v1/completions", content=b"{}", headers=headers)
    return asyncio.run(go())


def test_guard_without_api_key_refuses_a_rebound_host_with_421():
    guard = Guard(_ok, api_key=None, max_body_bytes=1024, bind_host="127.0.0.1")
    assert _post(guard, {"Host": "evil.example:8000", "Content-Type": "application/json"}).status_code == 421
    assert _post(guard, {"Host": "127.0.0.1:8000", "Content-Type": "application/json"}).status_code == 200
    keyed = Guard(_ok, api_key="k", max_body_bytes=1024, bind_host="127.0.0.1")  # the key is the protection then
    r = _post(keyed, {"Host": "evil.example", "Authorization": "Bearer k", "Content-Type": "application/json"})
    assert r.status_code == 200


@pytest.mark.parametrize("content_type, status", [("application/json", 200), ("application/json; charset=utf-8", 200),
                                                  ("application/vnd.api+json", 200), ("text/plain", 415),
                                                  ("application/x-www-form-urlencoded", 415), (None, 415)])
def test_guard_refuses_a_body_that_is_not_json_by_content_type(content_type, status):
    """A POST without a Content-Type is refused too: a web page can send one to any address without a preflight."""
    guard = Guard(_ok, api_key=None, max_body_bytes=1024, bind_host=None)
    r = _post(guard, {"Content-Type": content_type} if content_type else {})
    assert r.status_code == status
    if status == 415:
        assert r.json()["error"]["code"] == "unsupported_media_type" and "Content-Type" in r.json()["error"]["message"]


def test_guard_answers_503_with_retry_after_once_stopping():
    """A request gets the stopping server's 503 and its Retry-After before any other check (here: the key)."""
    from types import SimpleNamespace

    from paged.serve.errors import RETRY_AFTER_S

    guard = Guard(_ok, api_key="k", max_body_bytes=1024, bind_host=None,
                  admission=SimpleNamespace(stopping="the server is stopping"))
    r = _post(guard, {})
    assert r.status_code == 503 and r.headers["retry-after"] == str(RETRY_AFTER_S)
    assert r.json()["error"]["code"] == "server_shutting_down"


def test_json_depth_counts_nesting_without_recursion():
    deep = []
    for _ in range(100_000):  # deeper than Python's recursion limit
        deep = [deep]
    assert json_depth({"a": 1}) == 1 and json_depth({"a": [[{"b": []}]]}) == 5
    assert json_depth(deep) > MAX_JSON_DEPTH


def _lists(schema, where: str = ""):
    """Every list schema in a pydantic core schema (its definitions included), with where it stands."""
    if isinstance(schema, dict):
        if schema.get("type") == "list":
            yield where, schema
        for key, value in schema.items():
            yield from _lists(value, f"{where}.{key}" if isinstance(key, str) and key != "type" else where)
    elif isinstance(schema, list):
        for item in schema:
            yield from _lists(item, where)


def test_every_list_a_request_holds_stops_at_its_first_bad_item():
    """A list without ``fail_fast`` reports every bad item: a 4 MiB body of bad token ids cost 55 s of the
    event loop. Each request model's lists are ``Items[...]`` (checked on the compiled schema, exactly)."""
    from paged.serve.chat_protocol import ChatCompletionRequest
    from paged.serve.protocol import CompletionRequest
    from paged.serve.responses_protocol import ResponsesRequest
    from paged.serve.tokenize import REQUEST_MODELS

    models = [CompletionRequest, ChatCompletionRequest, ResponsesRequest, *REQUEST_MODELS]
    found = {m.__name__: [(w, s.get("fail_fast", False)) for w, s in _lists(m.__pydantic_core_schema__)]
             for m in models}
    assert sum(len(lists) for lists in found.values()) >= 20, found  # the walk sees them all
    plain = {name: [w for w, fast in lists if not fast] for name, lists in found.items()}
    assert not any(plain.values()), plain
