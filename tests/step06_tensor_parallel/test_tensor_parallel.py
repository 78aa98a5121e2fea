"""Tensor parallelism is invisible in the outputs (paper §4.6), and a failed worker stops everything.

The mixed batch of step05 — greedy and seeded requests, parallel sampling
(n > 1), beam search, prefix-cache hits, a long prompt — runs on a step05
engine (W = 1) and on a ``TensorParallelEngine`` with W = 2 or 4 worker
processes over gloo, with a KV pool small enough to force preemption by swap
and by recompute. Both engines are driven by the same plans (asserted), so:

* outputs are token-identical: the model is float64, and the only arithmetic
  that differs is the order of the row-parallel sums (W partial products
  all-reduced instead of one GEMM over the full width), an error of a few
  ulps (~1e-16 relative) — far too small to flip an argmax or a sampled token;
* each rank's KV cache (and host swap pool) equals the matching KV-head slice
  of the W = 1 cache, toleranced (``FLOAT64``) for that same reordering: the
  keys and values of every layer after the first are computed from a residual
  stream that went through the reordered sums.

Worker processes are slow to start, so each engine is started once per module
and reused; the tests that break an engine run last on it.
"""

import os
import pickle
import signal
import tempfile
import time

import pytest
import torch

from paged import LLM as TopLLM
from paged.models import load_model
from paged.step02_block_table import KVCache
from paged.step05_preemption import LLM as Step05LLM
from paged.step05_preemption import PreemptingEngine, StepPlan
from paged.step06_tensor_parallel import LLM, SamplingParams, TensorParallelEngine, WorkerError, load_sharded
from tests.hf_models import build_hf_model, save_checkpoint
from tests.tolerances import FLOAT64

SYSTEM = [30, 31, 32, 33, 34, 35, 36, 37, 38]  # a shared prefix: prefix-cache hits
ENGINE = dict(block_size=4, num_blocks=14, attention_backend="reference")  # 14 blocks: forced preemption
FAULT_BOUND_S = 30.0  # a failure must surface well within this (gloo reports a dead peer in milliseconds)


def _requests(tag):
    greedy = dict(temperature=0, ignore_eos=True)
    return [
        (f"{tag}-greedy-a", [5, 9, 14, 3, 7, 22, 8], SamplingParams(max_tokens=18, **greedy)),
        (f"{tag}-greedy-b", [40], SamplingParams(max_tokens=14, **greedy)),
        (f"{tag}-seeded", [1, 2, 3], SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=15,
                                                   ignore_eos=True)),
        (f"{tag}-parallel", [4, 4, 4, 4, 4], SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12,
                                                           ignore_eos=True)),
        (f"{tag}-beam", [6, 7], SamplingParams(n=2, best_of=3, use_beam_search=True, temperature=0, max_tokens=10)),
        (f"{tag}-prefix-1", SYSTEM + [50, 51], SamplingParams(max_tokens=10, **greedy)),
        (f"{tag}-prefix-2", SYSTEM + [52], SamplingParams(max_tokens=10, **greedy)),
        (f"{tag}-long-prompt", list(range(60, 90)), SamplingParams(max_tokens=6, **greedy)),
    ]


def swap_space(model, world, blocks=64):
    """Bytes for ``blocks`` host blocks of one rank's heads: the same block count at every W."""
    c = model.config
    return blocks * KVCache.bytes_per_block(c.num_layers, 4, c.num_kv_heads // world, c.head_dim, torch.float64)


def run(engine, tag, mode):
    """The mixed batch to the end under ``mode``; returns (outputs by request, the plans executed)."""
    engine.preemption_mode = mode
    plans = []

    def record(engine, plan, results):
        plans.append(pickle.dumps(plan))

    engine.add_observer(record)
    before = sum(engine.stats()["preemptions"].values())
    try:
        for rid, prompt, params in _requests(tag):
            engine.add_request(rid, prompt, params)
        done, steps = {}, 0
        while engine.has_unfinished():
            steps += 1
            assert steps < 2000, "the engine did not finish (a hang)"
            for out in engine.step():
                if out.finished:
                    done[out.request_id.split("-", 1)[1]] = [o.token_ids for o in out.outputs]
    finally:
        engine.remove_observer(record)
    assert engine.scheduler.kv.allocator.num_used == 0 and engine.scheduler.kv.host.num_used == 0, "blocks leaked"
    assert sum(engine.stats()["preemptions"].values()) - before >= 3, "the pool did not force preemption"
    return done, [pickle.loads(p) for p in plans]


def assert_kv_is_head_slice(ref, tp):
    """Each rank's KV cache and swap pool = its heads of the W = 1 ones (toleranced, see module doc)."""
    ranks = tp.fetch_kv()
    assert len(ranks) == tp.tensor_parallel_size
    h = ref.kv_cache.num_kv_heads // len(ranks)
    for r, (kv, swap) in enumerate(ranks):
        heads = slice(r * h, (r + 1) * h)
        torch.testing.assert_close(kv, ref.kv_cache.data[:, :, :, :, heads], **FLOAT64)
        torch.testing.assert_close(swap, ref.runner.swap_cache.data[:, :, :, :, heads], **FLOAT64)
    assert ranks[0][0].abs().sum() > 0  # the runs really wrote K/V


def _reusable(start):
    """A module fixture's engine, started again if a test stopped it (the fault tests do)."""
    box = {}

    def get():
        if "engine" not in box or box["engine"].workers.stopped:
            box["engine"] = start()
        return box["engine"]

    yield get
    if "engine" in box:
        box["engine"].close()


@pytest.fixture(scope="module")
def llama():
    """GQA: 4 query heads, 2 KV heads -> W = 2 gives each rank 2 and 1."""
    path = save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp())
    return path, load_model(path, dtype=torch.float64)


@pytest.fixture(scope="module")
def llama_pair(llama):
    """A step05 engine and a W = 2 engine over the same 14-block pool, reused by the tests in the same
    order, so the one scheduler sees the same history (prefix cache included) in both."""
    path, model = llama
    box = {}

    def get():
        if "tp" not in box or box["tp"].workers.stopped:
            box["ref"] = PreemptingEngine(model, swap_space=swap_space(model, 1), **ENGINE)
            box["tp"] = TensorParallelEngine(load_sharded(path, torch.float64, "cpu", 2), tensor_parallel_size=2,
                                             swap_space=swap_space(model, 2), **ENGINE)
        return box["ref"], box["tp"]

    yield get
    if "tp" in box:
        box["tp"].close()


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_tp2_equals_tp1_mixed_batch_forced_preemption_and_kv_is_head_slice(llama_pair, mode):
    ref, tp = llama_pair()
    want, ref_plans = run(ref, mode, mode)
    got, plans = run(tp, mode, mode)
    assert got == want
    assert plans == ref_plans  # one block manager's decisions, identical at W = 1 and W = 2
    assert_kv_is_head_slice(ref, tp)


def test_ctrl_c_in_the_driver_stops_every_worker(llama_pair):
    """What Ctrl-C raises (KeyboardInterrupt) arriving inside a step: workers stopped, the interrupt
    propagates; the engine then refuses to step rather than desynchronise."""
    engine = llama_pair()[1]
    engine.add_request("ctrl-c", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4))

    def interrupted(plan):
        raise KeyboardInterrupt

    engine.runner.local.execute = interrupted
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    assert engine.workers.stopped == "interrupted"
    assert not any(w.process.is_alive() for w in engine.workers.workers)
    with pytest.raises(WorkerError, match="stopped"):
        engine.step()


@pytest.fixture(scope="module")
def tied():
    """4 query heads, 4 KV heads, tied embeddings, biases everywhere: W = 4 gives each rank one head."""
    path = save_checkpoint(build_hf_model("llama_tied_bias"), tempfile.mkdtemp())
    return path, load_model(path, dtype=torch.float64)


@pytest.fixture(scope="module")
def tied_tp4(tied):
    path, model = tied
    yield from _reusable(lambda: TensorParallelEngine(
        load_sharded(path, torch.float64, "cpu", 4), tensor_parallel_size=4,
        swap_space=swap_space(model, 4), **ENGINE))


def test_tp4_equals_tp1_tied_embeddings_biases_and_kv_is_head_slice(tied, tied_tp4):
    ref = PreemptingEngine(tied[1], swap_space=swap_space(tied[1], 1), **ENGINE)
    want, ref_plans = run(ref, "swap", "swap")
    tp = tied_tp4()
    got, plans = run(tp, "swap", "swap")
    assert got == want
    assert plans == ref_plans
    assert_kv_is_head_slice(ref, tp)


def test_killed_worker_is_named_within_a_bound_and_every_process_exits(tied_tp4):
    """SIGKILL rank 2 of 4 just after a plan went out: rank 0 then waits for it inside the forward
    pass's first all-reduce. Its sockets close and the collective fails on every rank; the error must
    name rank 2 and the signal (which rank wins among several failures: ``test_faults.py``), within a
    bound, and every worker process must be gone."""
    engine = tied_tp4()
    victim = engine.workers.workers[1]
    assert victim.rank == 2
    for rid, prompt, params in _requests("kill"):
        engine.add_request(rid, prompt, params)
    engine.step()
    group, broadcast = engine.workers.group, engine.workers.group.broadcast_object

    def broadcast_then_kill(obj=None, timeout=None):
        out = broadcast(obj, timeout)
        if isinstance(obj, StepPlan):
            os.kill(victim.process.pid, signal.SIGKILL)
        return out

    group.broadcast_object = broadcast_then_kill
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 2 \(pid \d+\) was killed by signal SIGKILL") as err:
        engine.step()
    assert err.value.rank == 2
    assert time.monotonic() - start < FAULT_BOUND_S
    assert not any(w.process.is_alive() for w in engine.workers.workers)
    with pytest.raises(WorkerError, match="stopped .*create a new engine"):
        engine.step()


@pytest.fixture(scope="module")
def opt():
    """OPT 350m-style (post-LN, project_in/out, learned positions) with vocabulary 255: rank 1's last
    vocabulary row is padding, so the masked embedding and the trimmed logits are exercised."""
    path = str(save_checkpoint(build_hf_model("opt_350m", vocab_size=255), tempfile.mkdtemp()))
    return path


@pytest.fixture(scope="module")
def opt_llm(opt):
    box = {}

    def get():
        if "llm" not in box or box["llm"].engine.workers.stopped:
            box["llm"] = LLM(model=opt, dtype="float64", tensor_parallel_size=2, block_size=4, num_blocks=64,
                             swap_space=0, attention_backend="reference")
        return box["llm"]

    yield get
    if "llm" in box:
        box["llm"].close()


def test_llm_tp2_equals_step05_llm_opt_with_vocabulary_padding(opt, opt_llm):
    prompts = [[5, 9, 14, 3], [254, 1, 200], [7]]
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=11, max_tokens=12, ignore_eos=True),
              SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=8, ignore_eos=True)]
    ref = Step05LLM(model=opt, dtype="float64", block_size=4, num_blocks=64, swap_space=0,
                    attention_backend="reference")
    want = [[c.token_ids for c in o.outputs] for o in ref.generate(prompts, params, use_tqdm=False)]
    llm = opt_llm()
    got = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert any(t >= 128 for o in got for c in o for t in c)  # tokens from rank 1's half of the vocabulary


def test_worker_exception_mid_iteration_is_named_with_its_traceback(opt_llm):
    engine = opt_llm().engine
    engine.add_request("fault", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4))
    engine.workers.inject_fault(1, "injected fault")  # rank 1 raises after the driver entered the forward
    start = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 raised RuntimeError: injected fault") as err:
        engine.step()
    assert "--- traceback of rank 1 ---" in str(err.value) and "in serve" in str(err.value)
    assert time.monotonic() - start < FAULT_BOUND_S
    assert not any(w.process.is_alive() for w in engine.workers.workers)


def test_paged_llm_is_step06_and_tp1_starts_no_process(opt):
    assert TopLLM is LLM
    llm = TopLLM(model=opt, dtype="float64", block_size=4, num_blocks=64, swap_space=0)
    assert llm.engine.workers is None and llm.engine.tensor_parallel_size == 1
    assert type(llm.engine.runner).__name__ == "PreemptingModelRunner"
    llm.close()  # nothing to stop
    with pytest.raises(ValueError, match="split in 1"):
        TensorParallelEngine(llm.model, tensor_parallel_size=2)
