"""A request's own failure while it runs ends that request only (docs/serving.md, Limits).

A logits processor that raises is injected into one request of a running
batch. The others must finish *token-identical* (``==`` on the token id lists:
the same arithmetic runs for their rows, and the failing row's processor runs
before any generator draws, so nothing of theirs can differ) to a run without
it; the failed request ends with ``finish_reason="error"`` and its exception;
every block is free afterwards.
"""

from __future__ import annotations

import pytest

from paged import LLM, SamplingParams
from paged.demo import DEFAULT_MODEL_PATH
from paged.step03_attention import LLM as Step03LLM
from paged.errors import RequestError
from paged.sampling.structured import GuidedDecodingParams

pytestmark = pytest.mark.step03

PROMPTS = ["def f(x):", "import os", "class A:"]


class Boom(RuntimeError):
    pass


def raise_at(n: int):
    """A logits processor that passes rows through until the output has ``n`` tokens, then raises."""
    def processor(output_token_ids, logits):
        if len(output_token_ids) >= n:
            raise Boom(f"injected failure at output token {n}")
        return logits
    return processor


def others() -> list[SamplingParams]:
    """Greedy, seeded sampling with penalties, and a grammar: the rows the failure must not touch."""
    return [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
            SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=8, ignore_eos=True, presence_penalty=0.5),
            SamplingParams(temperature=0.8, seed=11, max_tokens=8, guided_decoding=GuidedDecodingParams(regex="[a-z ]+"))]


def run(engine, extra: SamplingParams | None):
    for i, (prompt, params) in enumerate(zip(PROMPTS, others())):
        engine.add_request(f"r{i}", engine.model.tokenizer.encode(prompt).ids, params)
    if extra is not None:
        engine.add_request("bad", engine.model.tokenizer.encode("x = 1").ids, extra)
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


@pytest.fixture(scope="module", params=["step03", "final"])
def make_engine(request):
    cls = Step03LLM if request.param == "step03" else LLM
    llm = cls(model=str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=8, num_blocks=64, seed=0)
    return llm.engine


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy-victim", "sampled-victim"])
def test_raising_logits_processor_ends_only_its_request_token_identical(make_engine, sampled):
    engine = make_engine
    baseline = run(engine, None)
    assert engine.scheduler.kv.allocator.num_used == 0
    bad = SamplingParams(temperature=1.0 if sampled else 0.0, seed=5, max_tokens=8, ignore_eos=True,
                         logits_processors=[raise_at(3)])
    final = run(engine, bad)
    assert engine.scheduler.kv.allocator.num_used == 0
    assert not engine.requests
    failed = final.pop("bad")
    assert isinstance(failed.error, Boom)
    assert [c.finish_reason for c in failed.outputs] == ["error"]
    assert {rid: [c.token_ids for c in o.outputs] for rid, o in final.items()} == \
        {rid: [c.token_ids for c in o.outputs] for rid, o in baseline.items()}


def test_logits_processor_returning_a_wrong_shape_is_that_requests_error(make_engine):
    engine = make_engine
    final = run(engine, SamplingParams(max_tokens=4, logits_processors=[lambda ids, row: row[:3]]))
    assert isinstance(final["bad"].error, TypeError) and "shape" in str(final["bad"].error)
    assert engine.scheduler.kv.allocator.num_used == 0


def test_grammar_that_fails_at_its_first_step_is_refused_at_admission(make_engine):
    """A schema that refers only to itself fails in llguidance's first mask: refused before queueing."""
    engine = make_engine
    spec = GuidedDecodingParams(json={"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})
    with pytest.raises(RequestError) as e:
        engine.add_request("self-ref", [1, 2, 3], SamplingParams(guided_decoding=spec))
    assert e.value.param == "guided_decoding.json"
    assert not engine.requests and engine.scheduler.kv.allocator.num_used == 0
