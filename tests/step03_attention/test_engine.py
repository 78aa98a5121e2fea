"""The step03 engine end to end, on tiny random checkpoints built in the test.

* Greedy output is token-identical to ``transformers`` ``generate`` (float64:
  the two compute the same function with different operation orders, and in
  float64 no argmax flips), for a batch of prompts of different lengths, on a
  LLaMA-family and an OPT config, for every attention backend.
* A request's output is the same alone or batched with others (greedy, and
  seeded sampling: each request draws from its own generator).
* Every block is free after every request ends, including when the KV cache
  runs out and the newest request is ended with ``kv_cache_exhausted``.
"""

import pytest
import torch

from paged.models import load_model
from paged.step03_attention import LLM, Engine, RequestError, SamplingParams
from tests.engine_loop import drain
from tests.hf_models import build_hf_model, float64_rmsnorm, save_checkpoint
from tests.tolerances import FLOAT64

PROMPTS = [[5, 9, 14, 3, 7, 22, 8], [40], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27], [3, 3]]
NEW_TOKENS = 20


@pytest.fixture(scope="module", params=["llama", "opt"])
def checkpoint(request, tmp_path_factory):
    kind = request.param
    model = build_hf_model(kind)
    path = save_checkpoint(model, tmp_path_factory.mktemp(kind))
    return kind, model, path


def _hf_greedy(model, prompt):
    with float64_rmsnorm():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             min_new_tokens=NEW_TOKENS)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_engine_greedy_token_identical_to_transformers_float64(checkpoint, backend):
    kind, hf, path = checkpoint
    llm = LLM(str(path), dtype="float64", block_size=4, num_blocks=64, attention_backend=backend)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == _hf_greedy(hf, prompt), (kind, prompt)
        assert out.outputs[0].finish_reason == "length"
    assert llm.engine.scheduler.kv.allocator.num_free == 64


def _engine(path, **kw):
    kw.setdefault("block_size", 4)
    kw.setdefault("num_blocks", 64)
    return Engine(load_model(path, dtype=torch.float64), free_order=list(range(kw["num_blocks"]))[::-1], **kw)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=0.9, top_p=0.9, top_k=20, seed=1234, max_tokens=12, ignore_eos=True),
], ids=["greedy", "seeded"])
def test_engine_request_output_same_alone_or_batched(checkpoint, params):
    _, _, path = checkpoint
    alone = drain(_engine(path), [("a", PROMPTS[0], params)])["a"]
    others = [(f"o{i}", p, SamplingParams(temperature=1.0, seed=i, max_tokens=5 + i, ignore_eos=True))
              for i, p in enumerate(PROMPTS[1:])]
    batched = drain(_engine(path), others + [("a", PROMPTS[0], params)])["a"]
    assert batched.outputs[0].token_ids == alone.outputs[0].token_ids


def test_engine_kv_exhaustion_ends_newest_request_and_frees_every_block(checkpoint):
    _, _, path = checkpoint
    engine = _engine(path, num_blocks=6)  # 24 token slots for three growing requests
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    done = drain(engine, [("first", [1, 2, 3], params), ("second", [4, 5, 6], params), ("third", [7, 8], params)])
    reasons = {rid: out.outputs[0].finish_reason for rid, out in done.items()}
    assert reasons["third"] == "kv_cache_exhausted"
    assert reasons["second"] == "kv_cache_exhausted"
    assert reasons["first"] == "kv_cache_exhausted"  # alone, it still outgrows 24 slots
    assert len(done["third"].outputs[0].token_ids) < len(done["first"].outputs[0].token_ids)
    assert engine.scheduler.kv.allocator.num_free == 6 and not engine.scheduler.running and not engine.scheduler.waiting


def test_engine_abort_frees_blocks_and_stops_output(checkpoint):
    _, _, path = checkpoint
    engine = _engine(path)
    engine.add_request("x", PROMPTS[2], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.scheduler.kv.allocator.num_free < 64
    assert engine.abort("x") and not engine.abort("x")
    assert engine.scheduler.kv.allocator.num_free == 64 and not engine.has_unfinished()


@pytest.mark.parametrize("prompt, params, match, param", [
    ([], SamplingParams(), "empty", "prompt"),
    ([1, 2, 10_000], SamplingParams(), r"token ids must be in \[0, ", "prompt"),
    (list(range(1, 129)), SamplingParams(), "at most", "prompt"),
    ([1, 2], SamplingParams(n=2), "step04", "n"),
], ids=["empty", "out-of-vocab", "too-long", "n>1"])
def test_engine_rejects_bad_requests_and_changes_nothing(checkpoint, prompt, params, match, param):
    """The refusal is a ``RequestError`` naming the field at fault; the engine's state is unchanged."""
    _, _, path = checkpoint
    engine = _engine(path)
    with pytest.raises(RequestError, match=match) as info:
        engine.add_request("bad", prompt, params)
    assert info.value.param == param
    assert not engine.has_unfinished() and engine.scheduler.kv.allocator.num_free == 64 and not engine.requests


def test_llm_generate_bad_prompt_raises_request_error_naming_the_prompt(checkpoint):
    """``LLM.generate`` validates every prompt before queueing any: a bad one raises the promised
    ``RequestError`` (its message led by the prompt's index, its field kept), and nothing runs."""
    _, _, path = checkpoint
    llm = LLM(str(path), dtype="float64", block_size=4, num_blocks=64, attention_backend="reference")
    with pytest.raises(RequestError, match=r"^prompt 1: the prompt is empty") as info:
        llm.generate([[1, 2, 3], []], SamplingParams(max_tokens=2), use_tqdm=False)
    assert info.value.param == "prompt"
    assert not llm.engine.has_unfinished() and not llm.engine.requests
    assert llm.engine.scheduler.kv.allocator.num_free == 64


def test_engine_prompt_larger_than_cache_is_rejected(checkpoint):
    _, _, path = checkpoint
    engine = _engine(path, num_blocks=2)
    with pytest.raises(ValueError, match="needs 3 KV blocks but the cache has only 2"):
        engine.add_request("big", list(range(1, 10)), SamplingParams())


def test_engine_stop_token_ids_and_max_tokens(checkpoint):
    _, hf, path = checkpoint
    expected = _hf_greedy(hf, PROMPTS[0])
    stop_at = expected[5]
    first = expected.index(stop_at)
    done = drain(_engine(path), [("s", PROMPTS[0], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_at], ignore_eos=True))])
    out = done["s"].outputs[0]
    assert out.token_ids == expected[: first + 1] and out.finish_reason == "stop" and out.stop_reason == stop_at


def test_engine_logprobs_are_the_model_distribution(checkpoint):
    _, hf, path = checkpoint
    done = drain(_engine(path), [("l", PROMPTS[0], SamplingParams(temperature=0, max_tokens=3, logprobs=3, ignore_eos=True))])
    out = done["l"].outputs[0]
    with float64_rmsnorm(), torch.no_grad():
        logits = hf(torch.tensor([PROMPTS[0]])).logits[0, -1]
    ref = logits.log_softmax(-1)
    first = out.logprobs[0]
    assert len(first) == 3 and out.token_ids[0] in first
    for tok, lp in first.items():
        assert lp == pytest.approx(ref[tok].item(), rel=FLOAT64["rtol"], abs=FLOAT64["atol"])
    assert out.cumulative_logprob == pytest.approx(sum(out.logprobs[i][t] for i, t in enumerate(out.token_ids)), rel=FLOAT64["rtol"], abs=FLOAT64["atol"])
