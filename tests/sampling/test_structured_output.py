"""Structured output (JSON schema, JSON object, regex, choice) through the step05 engine.

Model: the bundled demo model in float64 (a code model that has never seen
these schemas: whatever it writes parses only because the grammar masks the
logits). SmolLM2-135M-Instruct too when it has been fetched.

* Every output of every schema (nested objects, enums, arrays with bounds)
  ends with ``finish_reason="stop"`` and validates (``jsonschema``), greedy
  and with parallel sampling (``n=2``, seeded).
* Under preemption — a KV pool too small for the batch, by swap and by
  recompute — the outputs are token-identical to a run with room to spare:
  the grammar state resumes exactly where it stopped.
* Regex outputs match the whole pattern; choice outputs are one of the choices.
"""

import json
import re

import jsonschema
import pytest
import torch

from paged.demo import DEFAULT_MODEL_PATH
from paged.models import load_model
from paged.sampling.structured import GuidedDecodingParams
from paged.step05_preemption import PreemptingEngine, SamplingParams
from tests.engine_loop import drain

pytestmark = pytest.mark.step05  # sampling lies below the ladder; its tests keep the step that first uses them

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {"type": "object", "additionalProperties": False, "required": ["name", "id"],
                     "properties": {"name": {"type": "string", "maxLength": 12},
                                    "id": {"type": "integer", "minimum": 0, "maximum": 1000}}},
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"], "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "size": {"type": "string", "enum": ["S", "M", "L"]},
                       "count": {"type": "integer", "enum": [1, 2, 3]}},
        "required": ["color", "size", "count"], "additionalProperties": False,
    },
    "arrays": {
        "type": "object",
        "properties": {"values": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                                  "minItems": 1, "maxItems": 4},
                       "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
        "required": ["values", "tags"], "additionalProperties": False,
    },
}
PROMPT = "def parse(text):\n    return "
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def model():
    return load_model(str(DEFAULT_MODEL_PATH), dtype=torch.float64)


def _engine(model, **kw):
    kw.setdefault("num_blocks", 256)
    return PreemptingEngine(model, block_size=8, **kw)


@pytest.fixture(scope="module")
def requests(model):
    """Every schema greedy, and every schema with two seeded samples (parallel sampling)."""
    ids = model.tokenizer.encode(PROMPT).ids
    return [(f"{name}-n{n}", ids, SamplingParams(n=n, temperature=0 if n == 1 else 1.0, seed=3,
                                                  max_tokens=MAX_TOKENS,
                                                  guided_decoding=GuidedDecodingParams(json=schema)))
            for name, schema in SCHEMAS.items() for n in (1, 2)]


@pytest.fixture(scope="module")
def roomy(model, requests):
    return drain(_engine(model), requests)


def _check_valid(outs):
    for rid, out in outs.items():
        schema = SCHEMAS[rid.split("-")[0]]
        for c in out.outputs:
            assert c.finish_reason == "stop", (rid, c.text)
            jsonschema.validate(json.loads(c.text), schema)


def test_outputs_validate_against_every_schema(roomy):
    _check_valid(roomy)
    assert any(len({c.text for c in o.outputs}) > 1 for o in roomy.values())  # the samples differ


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_grammar_state_survives_preemption(model, requests, roomy, mode):
    some = requests[:4]  # the nested and enum schemas, greedy and sampled
    tight = _engine(model, num_blocks=8, preemption_mode=mode)
    squeezed = drain(tight, some)
    assert tight.scheduler.preemptions[mode] > 0, "the pool was not small enough to preempt"
    for rid, _, _ in some:
        assert [c.token_ids for c in squeezed[rid].outputs] == [c.token_ids for c in roomy[rid].outputs], rid


def test_json_object_regex_and_choice(model):
    specs = {
        "object": GuidedDecodingParams(json_object=True),
        "regex": GuidedDecodingParams(regex=r"[A-Z][a-z]{2,5}-[0-9]{3}"),
        "choice": GuidedDecodingParams(choice=["alpha", "beta", "gamma delta"]),
    }
    prompt = model.tokenizer.encode('data = {"name": "x", "id": 1}\nother = ').ids
    outs = drain(_engine(model), [(k, prompt, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, guided_decoding=g))
                                  for k, g in specs.items()])
    assert all(o.outputs[0].finish_reason == "stop" for o in outs.values())
    assert isinstance(json.loads(outs["object"].outputs[0].text), dict)
    assert re.fullmatch(r"[A-Z][a-z]{2,5}-[0-9]{3}", outs["regex"].outputs[0].text)
    assert outs["choice"].outputs[0].text in ("alpha", "beta", "gamma delta")


def _smollm2_path() -> str | None:
    """SmolLM2's checkpoint when ``make install`` fetched it (``paged.models.default``), else None."""
    try:
        from paged.models.default import default_model
    except ImportError:
        return None
    path, name = default_model()
    return path if "SmolLM2" in name else None


def test_smollm2_output_validates_against_the_enum_schema():
    path = _smollm2_path()
    if path is None:
        pytest.skip("SmolLM2-135M-Instruct is not fetched here (make install fetches it); "
                    "the demo-model tests above cover the same schemas")
    m = load_model(path, dtype=torch.float32)
    prompt = m.tokenizer.encode("Describe a shirt as JSON.").ids
    spec = GuidedDecodingParams(json=SCHEMAS["enums"])  # the shortest output: a 135M model is slow on 2 cores
    _check_valid(drain(_engine(m), [("enums-n1", prompt, SamplingParams(temperature=0, max_tokens=32,
                                                                       guided_decoding=spec))]))
