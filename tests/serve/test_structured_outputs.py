"""vLLM's ``structured_outputs`` field ({json, regex, choice, grammar, json_object}) and ``guided_grammar``.

In-process on the demo model. Each shape's output is checked against what it
asked for: JSON parsed and validated, a regex matched in full, a choice among
the choices, a grammar's language (Lark, and the same grammar in GBNF).
Greedy outputs of ``structured_outputs`` and the older ``guided_*`` spelling
are equal (exact). Two constraints at once, an empty one and a grammar bomb
are 400s naming the field.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from fastapi.testclient import TestClient

from paged import LLM, SamplingParams
from paged.demo import DEFAULT_MODEL_PATH
from paged.errors import RequestError
from paged.sampling.structured import StructuredOutputsParams
from paged.serve.app import build_app

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["n"], "additionalProperties": False}
LARK = 'start: "yes" | "no" | "maybe " NUM\nNUM: /[0-9]{1,2}/'
GBNF = 'root ::= "yes" | "no" | "maybe " [0-9] [0-9]?'


@pytest.fixture(scope="module")
def llm():
    return LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=96, seed=0)


@pytest.fixture(scope="module")
def c(llm):
    with TestClient(build_app(llm, "m")) as client:
        yield client


def complete(c, **body) -> str:
    r = c.post("/v1/completions", json={"prompt": "def f(x):", "max_tokens": 96, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.mark.parametrize("shape, check", [
    ({"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
    ({"regex": "[a-c]{2}-[0-9]"}, lambda t: re.fullmatch("[a-c]{2}-[0-9]", t) or 1 / 0),
    ({"choice": ["red", "green"]}, lambda t: t in ("red", "green") or 1 / 0),
    ({"grammar": LARK}, lambda t: re.fullmatch("yes|no|maybe [0-9]{1,2}", t) or 1 / 0),
    ({"grammar": GBNF}, lambda t: re.fullmatch("yes|no|maybe [0-9]{1,2}", t) or 1 / 0),
], ids=["json", "regex", "choice", "lark", "gbnf"])
def test_each_shape_constrains_the_output(c, shape, check):
    check(complete(c, structured_outputs=shape))


def test_json_object_is_response_formats_json_object(c):
    """Exact: the same greedy text as OpenAI's ``response_format: json_object`` (which is tested for JSON)."""
    assert complete(c, structured_outputs={"json_object": True}) == complete(c, response_format={"type": "json_object"})


@pytest.mark.parametrize("old, shape", [("guided_regex", "regex"), ("guided_choice", "choice"),
                                        ("guided_json", "json"), ("guided_grammar", "grammar")])
def test_the_older_spelling_gives_the_same_output(c, old, shape):
    """Exact: greedy text with ``guided_<x>`` equals the text with ``structured_outputs.<x>``."""
    value = {"regex": "[a-z]{3}", "choice": ["a", "bb"], "json": SCHEMA, "grammar": LARK}[shape]
    assert complete(c, **{old: value}) == complete(c, structured_outputs={shape: value})


@pytest.mark.parametrize("body, param", [
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "guided_regex": "a"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "start: x{1000000}\nx: \"a\""}}, "structured_outputs"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
    ({"structured_outputs": {"grammar": 5}}, "structured_outputs.grammar"),
])
def test_bad_structured_outputs_name_their_field(c, body, param):
    r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_sampling_params_take_structured_outputs_and_the_older_name(llm):
    spec = StructuredOutputsParams(choice=["up", "down"])
    out = llm.generate(["x"], SamplingParams(temperature=0, max_tokens=4, structured_outputs=spec), use_tqdm=False)
    assert out[0].outputs[0].text in ("up", "down")
    assert SamplingParams(guided_decoding=spec).structured_outputs is spec
    with pytest.raises(RequestError, match="not both"):
        SamplingParams(guided_decoding=spec, structured_outputs=StructuredOutputsParams(regex="a"))
