"""Gemma 2, Gemma 3 and Phi-3 through the paged engine past their sliding windows, equal to transformers.

The tiny random checkpoints of test_families (``tests/hf_models.py``: Gemma's
window of 16 on alternate layers and Gemma 2's soft-capped scores, Phi-3's
window of 48 on every layer) load in float32 and run on the step 05 engine
(chunked prefill, prefix cache, preemption), blocks of 8 so that a window
starts inside a block, with prompts longer than the window. Token-identical:
greedy tokens equal transformers' ``generate(do_sample=False)`` for

* every attention backend (``reference``, ``blockwise``, ``cpu``) in both
  modes (batch-invariant or not), each prompt prefilled in chunks of 16 tokens
  (a chunk over a windowed prefix);
* a prompt whose first blocks the prefix cache holds (only its tail is
  computed) and requests preempted for want of blocks (recomputed, or swapped
  out and back).

The model's context is no longer capped at the window (``max_model_len``).
"""

from __future__ import annotations

import pytest
import torch

from paged.models import load_model
from paged.step05_preemption import PreemptingEngine, SamplingParams
from tests.engine_loop import drain
from tests.hf_models import build_hf_model, save_checkpoint

KINDS = ("gemma2", "gemma3", "phi3")
# Prompt lengths past each window (16; 48) and one inside it; Phi-3 stays within its original
# context of 64 (its LongRoPE short factors), prompt + output.
PROMPT_LENS = {"gemma2": (40, 25, 7), "gemma3": (40, 25, 7), "phi3": (52, 30, 7)}
NEW_TOKENS = {"gemma2": 20, "gemma3": 20, "phi3": 12}


@pytest.fixture(scope="module", params=KINDS)
def family(request, tmp_path_factory):
    """(kind, our float32 model, prompts, transformers' greedy tokens for each)."""
    kind = request.param
    hf = build_hf_model(kind).float()
    model = load_model(save_checkpoint(hf, tmp_path_factory.mktemp(kind)), dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS[kind]]
    with torch.no_grad():
        want = [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS[kind], do_sample=False)[0, len(p):].tolist()
                for p in prompts]
    return kind, model, prompts, want


def _greedy(kind):
    return SamplingParams(temperature=0, max_tokens=NEW_TOKENS[kind], ignore_eos=True)


def test_sliding_window_models_run_past_their_window(family):
    """The context is the model's own (128; Phi-3: 64, its LongRoPE original context), not the window."""
    kind, model, _, _ = family
    assert model.config.sliding_window < model.config.max_model_len
    assert model.config.max_model_len == (64 if kind == "phi3" else 128)


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["fastest", "batch-invariant"])
@pytest.mark.parametrize("backend", ["reference", "blockwise", "cpu"])
def test_engine_greedy_tokens_identical_to_transformers_past_the_window(family, backend, batch_invariant):
    """Token-identical, prompts prefilled in chunks of 16 tokens, the three decoded as one batch."""
    kind, model, prompts, want = family
    engine = PreemptingEngine(model, block_size=8, num_blocks=64, max_num_batched_tokens=16,
                              attention_backend=backend, batch_invariant=batch_invariant,
                              free_order=list(range(64))[::-1])
    done = drain(engine, [(str(i), p, _greedy(kind)) for i, p in enumerate(prompts)])
    assert [done[str(i)].outputs[0].token_ids for i in range(len(prompts))] == want


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_engine_cache_hit_and_preemption_past_the_window_identical_to_transformers(family, preemption_mode):
    """Token-identical on the cpu backend: a request whose prompt's first 24 tokens another wrote to
    the prefix cache, in a pool of 14 blocks of 8 too small for the three at once (preemptions)."""
    kind, model, prompts, want = family
    engine = PreemptingEngine(model, block_size=8, num_blocks=14, attention_backend="cpu",
                              preemption_mode=preemption_mode, enable_prefix_caching=True)
    drain(engine, [("warm", prompts[0][:24] + [5, 6, 7], SamplingParams(temperature=0, max_tokens=2))])
    preempted = []
    engine.add_observer(lambda e, plan, results: preempted.extend(
        ev.detail["mode"] for ev in e.events if ev.kind == "preempted"))
    done = drain(engine, [(str(i), p, _greedy(kind)) for i, p in enumerate(prompts)])
    assert engine.scheduler.kv.host.num_used == 0
    assert done["0"].num_cached_tokens == 24 and preemption_mode in preempted
    assert [done[str(i)].outputs[0].token_ids for i in range(len(prompts))] == want
