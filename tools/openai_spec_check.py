"""Check this server's answers against OpenAI's published OpenAPI document (not shipped: pass its path).

    python tools/openai_spec_check.py --spec openapi.json

OpenAI publishes its API as one OpenAPI 3.1 document (the ``openai-openapi``
repository). This script runs the server in-process on the demo model, sends
one request of each kind the new endpoints answer — chat with forced tool
calls (whole and streamed, every chunk; and narrowed by ``allowed_tools``),
``/v1/responses`` with text, with a JSON schema, with tool calls (required and
``allowed_tools``), and made of an ``item_reference`` with logprobs and
metadata (whole and streamed, every event), a
background response (queued, polled, its stream again, one cancelled), the
model list — and validates each answer against the document's own schema for it
(``CreateChatCompletionResponse``, ``CreateChatCompletionStreamResponse``,
``Response``, ``ResponseStreamEvent``, ``ListModelsResponse``) with
``jsonschema`` (JSON Schema 2020-12, which OpenAPI 3.1 schemas are). It prints
one line per kind and exits 1 if any answer breaks its schema. The schema's
``required`` fields and types are checked; keys the document does not name
(vLLM's ``stop_reason``, ``reasoning_content``) are allowed where the document
allows extra keys, as it does almost everywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's paged, not an installed one


def nullable_to_null(node):
    """The document still marks some optional values ``nullable: true`` (OpenAPI 3.0's spelling, which JSON
    Schema ignores): each becomes an ``anyOf`` with ``null``, as 3.1 would write it."""
    if isinstance(node, list):
        return [nullable_to_null(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: nullable_to_null(v) for k, v in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def validator(spec: dict, component: str):
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    registry = Registry().with_resource("urn:openai", Resource.from_contents(spec, default_specification=DRAFT202012))
    return jsonschema.Draft202012Validator({"$ref": f"urn:openai#/components/schemas/{component}"},
                                           registry=registry)


def answers():
    """``(component, instance)`` for every answer sent, from an in-process server on the demo model."""
    from fastapi.testclient import TestClient

    from paged import LLM
    from paged.demo import DEFAULT_MODEL_PATH
    from paged.serve.app import build_app
    from paged.serve.options import ServeOptions

    llm = LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=128, seed=0)
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    chat_tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]
    flat_tools = [{"type": "function", "name": "get_weather", "parameters": params}]
    app = build_app(llm, "m", options=ServeOptions(enable_auto_tool_choice=True, tool_call_parser="hermes"))
    with TestClient(app) as c:
        yield "ListModelsResponse", c.get("/v1/models").json()
        chat = {"messages": [{"role": "user", "content": "Weather?"}], "tools": chat_tools, "tool_choice": "required",
                "max_tokens": 40}
        yield "CreateChatCompletionResponse", c.post("/v1/chat/completions", json=chat).json()
        for chunk in events(c, "/v1/chat/completions", {**chat, "stream": True,
                                                        "stream_options": {"include_usage": True}}):
            yield "CreateChatCompletionStreamResponse", chunk
        yield "CreateCompletionResponse", c.post("/v1/completions", json={"prompt": "def", "max_tokens": 3}).json()
        allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "get_weather"}}]}}
        yield "CreateChatCompletionResponse", c.post("/v1/chat/completions", json={**chat,
                                                                                   "tool_choice": allowed}).json()
        first = c.post("/v1/responses", json={"input": "def f():", "max_output_tokens": 4}).json()
        yield "Response", first
        for body in ({"input": "def f():", "instructions": "Python.", "max_output_tokens": 6},
                     {"input": "City?", "max_output_tokens": 40, "text": {"format": {
                         "type": "json_schema", "name": "c", "schema": params}}},
                     {"input": "Weather?", "tools": flat_tools, "tool_choice": "required", "max_output_tokens": 40},
                     {"input": "Weather?", "tools": flat_tools, "max_output_tokens": 40, "tool_choice": {
                         "type": "allowed_tools", "mode": "required", "tools": [{"type": "function",
                                                                                  "name": "get_weather"}]}},
                     {"input": [{"type": "item_reference", "id": first["output"][0]["id"]}], "max_output_tokens": 6,
                      "include": ["message.output_text.logprobs"], "top_logprobs": 2, "metadata": {"k": "v"}}):
            yield "Response", c.post("/v1/responses", json=body).json()
            for event in events(c, "/v1/responses", {**body, "stream": True}):
                yield "ResponseStreamEvent", event
        # a background response: queued, polled to its end, its stream again; and one cancelled
        body = {"input": "def f():", "max_output_tokens": 12, "background": True}
        queued = c.post("/v1/responses", json=body).json()
        yield "Response", queued
        while (polled := c.get(f"/v1/responses/{queued['id']}").json())["status"] in ("queued", "in_progress"):
            yield "Response", polled
        yield "Response", polled
        streamed = events(c, "/v1/responses", {**body, "stream": True})
        for event in streamed + events(c, f"/v1/responses/{streamed[0]['response']['id']}?stream=true&"
                                           "starting_after=3", None):
            yield "ResponseStreamEvent", event
        long = [{"role": "user", "content": f"Turn {i}: " + "more " * 300} for i in range(4)]
        yield "Response", c.post("/v1/responses", json={"input": long, "max_output_tokens": 4,
                                                        "truncation": "auto"}).json()
        running = c.post("/v1/responses", json={**body, "max_output_tokens": 500}).json()
        yield "Response", c.post(f"/v1/responses/{running['id']}/cancel", json={}).json()


def events(c, path: str, body: dict | None) -> list[dict]:
    """A stream's events: ``POST`` with ``body``, else ``GET``."""
    text = (c.post(path, json=body) if body is not None else c.get(path)).text
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="OpenAI's openapi.json (or .yaml)")
    args = ap.parse_args()
    with open(args.spec, encoding="utf-8") as f:
        spec = json.load(f) if args.spec.endswith(".json") else __import__("yaml").safe_load(f)
    spec = nullable_to_null(spec)
    checkers, counts, failed = {}, {}, 0
    for component, instance in answers():
        checker = checkers.setdefault(component, validator(spec, component))
        errors = sorted(checker.iter_errors(instance), key=lambda e: list(e.absolute_path))
        ok, bad = counts.get(component, (0, 0))
        counts[component] = (ok + (not errors), bad + bool(errors))
        for e in errors[:3]:
            failed += 1
            deepest = max(e.context or [e], key=lambda x: len(list(x.absolute_path)))
            print(f"  {component} {instance.get('type', '')} at {'/'.join(map(str, deepest.absolute_path)) or '.'}: "
                  f"{deepest.message[:300]}")
    for component, (ok, bad) in counts.items():
        print(f"{component}: {ok} valid, {bad} invalid")
    print(f"spec: {spec.get('info', {}).get('title')} {spec.get('info', {}).get('version')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
