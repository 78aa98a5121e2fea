"""Preemption is invisible in the outputs (paper §4.5), and nothing is lost or leaked.

A mixed batch — greedy and seeded single sequences, parallel sampling,
beam search, requests that hit the prefix cache — runs once with ample memory
and again with a KV pool so small that groups are preempted many times, for
each of ``swap``, ``recompute`` and ``auto``, with and without chunked
prefill. Outputs must be token-identical (float64 model: recomputation and
the original pass compute the same values, so no argmax or sample flips), and
every device and host block must be free at the end.
"""

import tempfile

import pytest
import torch

from paged.models import load_model
from paged.step02_block_table import KVCache
from paged.step05_preemption import PreemptingEngine, SamplingParams
from tests.hf_models import build_hf_model, save_checkpoint

SYSTEM = [30, 31, 32, 33, 34, 35, 36, 37, 38]  # a shared prefix: prefix-cache hits


def _requests():
    greedy = dict(temperature=0, ignore_eos=True)
    return [
        ("greedy-a", [5, 9, 14, 3, 7, 22, 8], SamplingParams(max_tokens=18, **greedy)),
        ("greedy-b", [40], SamplingParams(max_tokens=14, **greedy)),
        ("seeded", [1, 2, 3], SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=15, ignore_eos=True)),
        ("parallel", [4, 4, 4, 4, 4], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, ignore_eos=True)),
        ("beam", [6, 7], SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0, max_tokens=10)),
        ("prefix-1", SYSTEM + [50, 51], SamplingParams(max_tokens=10, **greedy)),
        ("prefix-2", SYSTEM + [52], SamplingParams(max_tokens=10, **greedy)),
        ("long-prompt", list(range(60, 90)), SamplingParams(max_tokens=6, **greedy)),
    ]


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp()), dtype=torch.float64)


def run(model, **kw):
    engine = PreemptingEngine(model, block_size=4, free_order=None, **kw)
    for rid, prompt, params in _requests():
        engine.add_request(rid, prompt, params)
    done = {}
    steps = 0
    while engine.has_unfinished():
        steps += 1
        assert steps < 2000, "the engine did not finish (a hang)"
        for out in engine.step():
            if out.finished:
                done[out.request_id] = [o.token_ids for o in out.outputs]
    assert engine.scheduler.kv.allocator.num_used == 0, "device blocks leaked"
    assert engine.scheduler.kv.host.num_used == 0, "host blocks leaked"
    return done, engine


@pytest.fixture(scope="module")
def ample(model):
    return run(model, num_blocks=256)[0]


@pytest.mark.parametrize("mode", ["swap", "recompute", "auto"])
@pytest.mark.parametrize("num_blocks, budget", [(14, 2048), (20, 8)], ids=["starved", "starved-chunked"])
def test_outputs_identical_under_forced_preemption(model, ample, mode, num_blocks, budget):
    got, engine = run(model, num_blocks=num_blocks, preemption_mode=mode, max_num_batched_tokens=budget)
    assert got == ample
    preemptions = engine.stats()["preemptions"]
    assert sum(preemptions.values()) >= 3, preemptions  # the pool really was too small
    if mode != "auto":
        assert preemptions[{"swap": "recompute", "recompute": "swap"}[mode]] == 0


def test_swap_pool_full_falls_back_to_recompute(model, ample):
    cfg = model.config
    one_block = KVCache.bytes_per_block(cfg.num_layers, 4, cfg.num_kv_heads, cfg.head_dim, torch.float64)
    got, engine = run(model, num_blocks=14, preemption_mode="swap", swap_space=one_block)
    assert got == ample
    assert engine.stats()["preemptions"]["recompute"] > 0


@pytest.mark.parametrize("budget", [1, 3, 7])
def test_chunked_prefill_outputs_identical_to_unlimited_budget(model, ample, budget):
    got, engine = run(model, num_blocks=256, max_num_batched_tokens=budget)
    assert got == ample


# The CUDA path end to end: every kernel of csrc/cuda (v1 / v2 decode, the fused
# KV write, the fused block copy of copy-on-write) inside the engine, on a GPU
# or through the device emulation on the CPU. The kernels take float32 and head
# dims from 32, so the model is float32 with 2 heads of 32 dims, B = 8; the
# comparison is with the reference backend on the same float32 model with ample
# memory. Token-identical: the kernels reorder float32 sums (differences ~1e-7
# relative), far below the gaps between this model's top logits and between
# a seeded draw and the cumulative probabilities around it.
KERNEL_BACKENDS = [
    pytest.param("emulated-cuda", "cpu", marks=pytest.mark.emulated, id="emulated-cuda"),
    pytest.param("cuda", "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                 reason="needs a CUDA GPU")], id="cuda"),
]  # fmt: skip


@pytest.fixture(scope="module")
def model_f32():
    hf = build_hf_model("llama", num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    return save_checkpoint(hf, tempfile.mkdtemp())


def _run_observed(model, **kw):
    """``run`` with block size 8, also returning the kinds of events seen."""
    engine = PreemptingEngine(model, block_size=8, free_order=None, **kw)
    for rid, prompt, params in _requests():
        engine.add_request(rid, prompt, params)
    done, kinds, steps = {}, set(), 0
    while engine.has_unfinished():
        steps += 1
        assert steps < 2000, "the engine did not finish (a hang)"
        for out in engine.step():
            if out.finished:
                done[out.request_id] = [o.token_ids for o in out.outputs]
        kinds.update(e.kind for e in engine.events)
    assert engine.scheduler.kv.allocator.num_used == 0, "device blocks leaked"
    assert engine.scheduler.kv.host.num_used == 0, "host blocks leaked"
    return done, kinds


@pytest.mark.parametrize("mode", ["swap", "recompute"])
@pytest.mark.parametrize("backend, device", KERNEL_BACKENDS)
def test_cuda_kernels_outputs_identical_to_reference_under_cow_and_preemption(model_f32, backend, device, mode):
    """Token-identical outputs (see above) with copy-on-write and forced preemption."""
    model = load_model(model_f32, dtype=torch.float32)
    want, _ = _run_observed(model, num_blocks=256, attention_backend="reference")
    model.model.to(device)
    got, kinds = _run_observed(model, num_blocks=9, preemption_mode=mode, attention_backend=backend)
    assert got == want
    assert {"cow", "preempted"} <= kinds, kinds  # both really happened
