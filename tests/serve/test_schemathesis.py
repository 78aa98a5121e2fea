"""Property-based fuzzing of the HTTP API with Schemathesis, in-process through the ASGI transport.

For every operation of the published document (``GET /openapi.json``),
Schemathesis draws requests that fit the schema (positive) and, for the two
operations with a body, requests that break it (negative), and sends them to
the live app (the demo model over a
small engine: 64 blocks of 8 tokens, a 48-token context, so no request runs
long). Each answer must pass Schemathesis' checks:

* ``not_a_server_error`` — no 5xx;
* ``status_code_conformance``, ``content_type_conformance``,
  ``response_schema_conformance`` (each event of a stream too),
  ``response_headers_conformance`` — the answer is one the document describes;
* ``negative_data_rejection`` — a request outside the schema (a bound, a type,
  an unknown field) is refused with a 4xx: what the schema says is enforced.

``positive_data_acceptance`` is not asked for: the document cannot express
every rule (a prompt plus ``max_tokens`` must fit the context; beam search
needs ``temperature: 0``), and those requests get a 400 that names the rule.

After each operation's examples the engine must be idle with every KV block
free, and a good request must still succeed. Each example body the document
shows is sent too, and must get a 200 that passes every check; and each bound
a generation request's fields publish is sent just past it, every run, and must
be refused naming the field (the fuzzing draws those only now and then), and so
is each bound below them (a list's items, a message's role, a tool's name, a
part's type: ranges, lengths, counts, enums, consts, patterns). Hypothesis is
derandomized (the same examples every run). ``PAGED_FUZZ_EXAMPLES`` sets the
examples per operation and mode (``make fuzz`` runs a larger number).

Schemathesis' pytest plugin ends the app's lifespan after each test, so the
engine thread is stopped and started again between tests (its state stays).
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter

import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.testclient import TestClient

from paged import LLM
from paged.serve.app import build_app

API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MAX_EXAMPLES = int(os.environ.get("PAGED_FUZZ_EXAMPLES", "12"))
IDLE_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def app():
    llm = LLM(dtype="float32", device="cpu", block_size=8, num_blocks=64, max_model_len=48, seed=0)
    return build_app(llm, "test-model", api_key=API_KEY)


@pytest.fixture(scope="module")
def schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def statuses():
    """Status codes seen per operation, printed at the end (the figures of the fuzzing run)."""
    seen: dict[str, Counter] = {}
    yield seen
    total = sum(sum(c.values()) for c in seen.values())
    print(f"\nschemathesis: {len(seen)} operation x mode runs, {total} requests")
    for label, counts in sorted(seen.items()):
        print(f"  {label}: {dict(sorted(counts.items()))}")


def engine_of(app):
    return app.fastapi.state.engine


def wait_idle(app) -> dict:
    """The engine's latest stats once nothing runs, waits or is swapped out (bounded wait)."""
    engine, deadline = engine_of(app), time.monotonic() + IDLE_TIMEOUT_S
    while True:
        stats = engine.stats  # the engine thread's snapshot, refreshed whenever it goes idle
        if stats["running"] + stats["waiting"] + stats["swapped"] == 0 and engine.num_streams == 0:
            return stats
        assert time.monotonic() < deadline, f"engine still busy after {IDLE_TIMEOUT_S}s: {stats}"
        time.sleep(0.02)


OPERATIONS = ["GET /health", "GET /version", "GET /v1/models", "GET /v1/models/{model}", "POST /v1/completions",
              "POST /v1/chat/completions", "POST /v1/responses", "GET /v1/responses/{response_id}",
              "DELETE /v1/responses/{response_id}", "GET /v1/responses/{response_id}/input_items",
              "POST /v1/responses/{response_id}/cancel", "POST /v1/responses/input_tokens", "POST /tokenize",
              "POST /detokenize", "GET /tokenizer_info", "GET /metrics", "GET /"]
# the operations with something to break (a body): the others have no request the schema refuses
WITH_BODY = ["POST /v1/completions", "POST /v1/chat/completions", "POST /v1/responses",
             "POST /v1/responses/input_tokens", "POST /tokenize", "POST /detokenize"]
# and those whose query parameters have bounds to break
WITH_QUERY = ["GET /v1/responses/{response_id}/input_items", "GET /v1/responses/{response_id}"]
RUNS = [(label, GenerationMode.POSITIVE) for label in OPERATIONS] + \
       [(label, GenerationMode.NEGATIVE) for label in WITH_BODY + WITH_QUERY]


def test_the_fuzzed_operations_are_every_operation_published(schema):
    """The operations the fuzzing test is parametrized with equal the document's (set equality)."""
    assert sorted(op.ok().label for op in schema.get_all_operations()) == sorted(OPERATIONS)


@pytest.mark.parametrize("label", WITH_BODY)
def test_every_documented_example_is_accepted_and_conforms(app, schema, label):
    """Each request body the document shows as an example gets a 200 that passes every check, including
    ``positive_data_acceptance``; a streamed one is validated event by event (each check is pass/fail)."""
    operation = schema.find_operation_by_label(label)
    examples = operation.definition.raw["requestBody"]["content"]["application/json"]["examples"]
    assert len(examples) >= 2
    for name, example in examples.items():
        case = operation.Case(body=example["value"], media_type="application/json")
        response = case.call_and_validate(headers=AUTH)
        assert response.status_code == 200, (name, response.text)
        streamed = "text/event-stream" in str(response.headers.get("content-type"))
        assert streamed == bool(example["value"].get("stream")), name
        if streamed:  # a chat or completion stream ends with [DONE], a Responses stream with its Response
            assert response.text.rstrip().endswith(("data: [DONE]", '"metadata":{}}}')), name
    assert wait_idle(app)["blocks_used"] == 0


def just_outside(prop: dict) -> list:
    """A value just past each bound ``prop`` publishes: a number a step below its minimum or above its
    maximum (an exclusive bound itself), of its type; a string a character past its length bounds; a
    list an item past its count bounds (its items strings or integers); an object a key past its size."""
    branches = [prop, *prop.get("anyOf", [])]
    step, kind = (1, int) if "integer" in {b.get("type") for b in branches} else (0.5, float)
    values = ([kind(prop["minimum"] - step)] if "minimum" in prop else []) + \
             ([kind(prop["maximum"] + step)] if "maximum" in prop else []) + \
             [kind(prop[key]) for key in ("exclusiveMinimum", "exclusiveMaximum") if key in prop]
    if "maxLength" in prop:
        values.append("a" * (prop["maxLength"] + 1))
    if prop.get("minLength", 0) > 0:
        values.append("a" * (prop["minLength"] - 1))
    items = next((b["items"] for b in branches if b.get("type") == "array" and "items" in b), {})
    sample = {"string": "a", "integer": 1}.get(items.get("type"))
    if "maxItems" in prop and sample is not None:
        values.append([sample] * (prop["maxItems"] + 1))
    if prop.get("minItems", 0) == 1:  # one bound an empty list breaks whatever its items are
        values.append([])
    if "maxProperties" in prop:
        values.append({str(i): 0 for i in range(prop["maxProperties"] + 1)})
    return values


@pytest.mark.parametrize("label", ["POST /v1/completions", "POST /v1/chat/completions", "POST /v1/responses"])
def test_every_published_bound_is_refused_just_past_it(app, label):
    """Each bound a generation request's fields publish holds (a number's range, a string's length, a
    list's or an object's size): the operation's first documented example with one field just past one
    bound gets a 400 whose error names that field. The fuzzing test draws such values only now and then;
    this sends each of them, every run (status and param: exact)."""
    document = app.fastapi.openapi()
    path = label.split()[1]
    content = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    schema_name = content["schema"]["$ref"].rsplit("/", 1)[1]
    properties = document["components"]["schemas"][schema_name]["properties"]
    example = next(iter(content["examples"].values()))["value"]
    sent = 0
    with TestClient(app) as client:
        for field, prop in properties.items():
            for value in just_outside(prop):
                response = client.post(path, json={**example, field: value}, headers=AUTH)
                assert response.status_code == 400, (field, value, response.status_code, response.text[:300])
                assert response.json()["error"]["param"] == field, (field, value, response.text[:300])
                sent += 1
    assert sent >= 5  # each operation listed publishes at least 5 bounds (temperature's, top_p's, ...)
    assert wait_idle(app)["blocks_used"] == 0


BOUND_KEYS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "maxLength", "minLength", "maxItems",
              "minItems", "maxProperties", "enum", "const", "pattern"}


def outside(prop: dict) -> list:
    """``just_outside`` and a value outside an ``enum``, a ``const`` or a ``pattern`` (a string)."""
    values = just_outside(prop)
    values += ["not-" + str(prop["enum"][0])] if "enum" in prop else []
    values += ["not-" + prop["const"]] if isinstance(prop.get("const"), str) else []
    values += [s for s in ("", "a b", "a" * 65) if "pattern" in prop and not re.search(prop["pattern"], s)]
    return values


class Nested:
    """The bounds below a request's fields, and a value of a field that holds one just past it.

    A bound's place is a list of steps from the field: ``("prop", name)``, ``("item",)`` (a list's
    first item), ``("key",)`` (an object's value under key "1") and ``("branch", "anyOf", i)``; each
    object on the way gets its required fields filled with the least value its schema takes."""

    def __init__(self, document: dict) -> None:
        self.schemas = document["components"]["schemas"]

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            schema = self.schemas[schema["$ref"].rsplit("/", 1)[1]]
        return schema

    def bounds(self, schema: dict, steps: tuple = (), seen: frozenset = frozenset()):
        """(steps, leaf schema) for each bound at least one list, key or property below the field."""
        ref = schema.get("$ref")
        if ref in seen:  # a schema holding itself: walked once
            return
        schema, seen = self.resolve(schema), seen | {ref} if ref else seen
        if BOUND_KEYS & schema.keys() and any(step[0] != "branch" for step in steps):
            yield steps, schema
        for key in ("anyOf", "oneOf"):
            for i, branch in enumerate(schema.get(key, [])):
                yield from self.bounds(branch, (*steps, ("branch", key, i)), seen)
        if isinstance(schema.get("items"), dict):
            yield from self.bounds(schema["items"], (*steps, ("item",)), seen)
        if isinstance(schema.get("additionalProperties"), dict):
            yield from self.bounds(schema["additionalProperties"], (*steps, ("key",)), seen)
        for prop, sub in schema.get("properties", {}).items():
            yield from self.bounds(sub, (*steps, ("prop", prop)), seen)

    def least(self, schema: dict):
        """The least value ``schema`` takes: its const, its first enum member or branch, "a", 1, []..."""
        schema = self.resolve(schema)
        if "const" in schema or "enum" in schema:
            return schema.get("const", schema.get("enum", [None])[0])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.least(next(b for b in schema[key] if b.get("type") != "null"))
        kind = schema.get("type")
        if kind == "array":
            return [self.least(schema["items"])] * schema.get("minItems", 0)
        if kind == "object" or "properties" in schema:
            return {p: self.least(schema["properties"][p]) for p in schema.get("required", [])}
        value = {"string": "a" * max(1, schema.get("minLength", 1)), "boolean": False}.get(kind, 1)
        assert "pattern" not in schema or re.search(schema["pattern"], value), (schema, value)
        return value

    def value(self, schema: dict, steps: tuple, leaf):
        """A value of ``schema`` holding ``leaf`` at ``steps``, and the dotted path to it (``0.role``)."""
        schema = self.resolve(schema)
        if not steps:
            return leaf, []
        kind, *arg = steps[0]
        if kind == "branch":
            return self.value(schema[arg[0]][arg[1]], steps[1:], leaf)
        if kind == "item":
            inner, path = self.value(schema["items"], steps[1:], leaf)
            return [inner], ["0", *path]
        if kind == "key":
            inner, path = self.value(schema["additionalProperties"], steps[1:], leaf)
            return {"1": inner}, ["1", *path]
        name = arg[0]
        inner, path = self.value(schema["properties"][name], steps[1:], leaf)
        required = {p: self.least(schema["properties"][p]) for p in schema.get("required", []) if p != name}
        return {**required, name: inner}, [name, *path]


@pytest.mark.parametrize("label", ["POST /v1/completions", "POST /v1/chat/completions", "POST /v1/responses"])
def test_every_nested_bound_is_refused_just_past_it(app, label):
    """Each bound below a generation request's fields (a list's items, an object's fields, a message's
    role, a tool's name, a part's type: a number's range, a length, a count, an enum, a const, a
    pattern) holds: the first documented example with one such value just past its bound, in an
    otherwise least body for that field, gets a 400 whose ``param`` is the value's path or a field
    holding it (``messages.0.role``; ``stop``, whose checker reads the whole list). A value one
    branch of a union refuses but another takes (a tool choice of another ``type``) is not outside
    the document: each body is sent only when the document itself refuses it (jsonschema). Status and
    param: exact."""
    document = app.fastapi.openapi()
    path = label.split()[1]
    content = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    request_schema = {"$ref": content["schema"]["$ref"], "components": document["components"]}
    refuses = jsonschema.Draft202012Validator(request_schema)
    nested = Nested(document)
    example = next(iter(content["examples"].values()))["value"]
    properties = nested.resolve(content["schema"])["properties"]
    sent, taken = [], []
    with TestClient(app) as client:
        for field, prop in properties.items():
            for steps, leaf in nested.bounds(prop):
                for bad in outside(leaf):
                    value, where = nested.value(prop, steps, bad)
                    body, dotted = {**example, field: value}, ".".join([field, *where])
                    if refuses.is_valid(body):
                        taken.append(dotted)
                        continue
                    response = client.post(path, json=body, headers=AUTH)
                    assert response.status_code == 400, (dotted, bad, response.status_code, response.text[:300])
                    param = response.json()["error"]["param"]
                    assert dotted == param or dotted.startswith(param + "."), (dotted, response.text[:300])
                    sent.append(dotted)
    print(f"\n{label}: {len(sent)} values past nested bounds, at {sorted(set(sent))}; taken by another "
          f"branch: {taken}")
    assert len(sent) >= 8  # stop's items, logit_bias' values, response_format's type, structured_outputs' ...
    assert wait_idle(app)["blocks_used"] == 0


@pytest.mark.parametrize("label, mode", RUNS)
def test_fuzz_operation(app, schema, statuses, label, mode):
    """Schemathesis' checks hold for every drawn request (each check is pass/fail); afterwards the engine
    is idle with used blocks == 0, and a good completion returns exactly 2 tokens."""
    operation = schema.find_operation_by_label(label)
    seen = statuses.setdefault(f"{label} [{mode.value}]", Counter())

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case):
        response = case.call_and_validate(headers=AUTH, excluded_checks=[positive_data_acceptance])
        seen[response.status_code] += 1

    fuzz()
    stats = wait_idle(app)
    assert stats["blocks_used"] == 0, stats
    good = schema.find_operation_by_label("POST /v1/completions").Case(
        body={"prompt": "def f(x):", "max_tokens": 2, "ignore_eos": True}, media_type="application/json")
    response = good.call(headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 2
    assert engine_of(app).dead is None
