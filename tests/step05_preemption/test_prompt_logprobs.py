"""Prompt logprobs under chunked prefill, prefix caching and preemption (step05 engine, demo model, float64).

Each case compares with ``log_softmax`` of one contiguous forward pass over the
prompt (toleranced ``FLOAT64``: paged and contiguous attention sum in other
orders, and a chunk boundary changes which keys one call sees):

* chunked prefill: a 40-token prompt computed 8 tokens per iteration;
* prefix caching: a prompt whose blocks are all cached is computed again
  (``num_cached_tokens == 0``) when it asks for prompt logprobs — a cached
  block has no logits — while the same prompt without them still hits the cache;
* preemption: requests preempted while decoding (swap and recompute) keep the
  prompt logprobs of their first pass, and a recomputed request does not compute
  them again.
"""

import pytest
import torch

from paged.demo import DEFAULT_MODEL_PATH
from paged.models import load_model
from paged.step05_preemption import PreemptingEngine, SamplingParams
from tests.engine_loop import drain
from tests.sampling.test_sampling_engine import assert_prompt_logprobs_match

TEXT = ("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n\n\n"
        "def sub(a, b):\n    return a - b\n")
K = 2


@pytest.fixture(scope="module")
def model():
    return load_model(str(DEFAULT_MODEL_PATH), dtype=torch.float64)


@pytest.fixture(scope="module")
def prompt(model):
    ids = model.tokenizer.encode(TEXT).ids
    assert len(ids) >= 33, "the prompt must span several 8-token chunks and blocks"
    return ids


def test_chunked_prefill(model, prompt):
    engine = PreemptingEngine(model, block_size=8, num_blocks=64, max_num_batched_tokens=8)
    out = drain(engine, [("r", prompt, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=K))])["r"]
    assert_prompt_logprobs_match(model, prompt, out.prompt_logprobs, K)


def test_cached_prefix_is_recomputed_for_prompt_logprobs(model, prompt):
    engine = PreemptingEngine(model, block_size=8, num_blocks=64)
    greedy = dict(temperature=0, max_tokens=2)
    drain(engine, [("fill", prompt, SamplingParams(**greedy))])
    wants = drain(engine, [("wants", prompt, SamplingParams(prompt_logprobs=K, **greedy))])["wants"]
    plain = drain(engine, [("plain", prompt, SamplingParams(**greedy))])["plain"]
    assert wants.num_cached_tokens == 0 and plain.num_cached_tokens > 0
    assert_prompt_logprobs_match(model, prompt, wants.prompt_logprobs, K)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_keeps_prompt_logprobs(model, prompt, mode):
    reqs = [(f"r{i}", prompt[i:], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, prompt_logprobs=K))
            for i in range(4)]
    engine = PreemptingEngine(model, block_size=8, num_blocks=14, preemption_mode=mode)
    outs = drain(engine, reqs)
    assert engine.scheduler.preemptions[mode] > 0, "the pool was not small enough to preempt"
    for rid, ids, _ in reqs:
        assert_prompt_logprobs_match(model, ids, outs[rid].prompt_logprobs, K)
