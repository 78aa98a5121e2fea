"""The KV snapshot under tensor parallelism: the driver's block manager is the whole picture (exact).

The same requests, with a pool small enough to preempt by swap, run on a
step05 engine (W = 1) and a ``TensorParallelEngine`` with W = 2 worker
processes. The one scheduler on the driver sees the same history, so after
every iteration ``kv_snapshot()`` of both engines is equal, key for key
(``swap_space`` is given per rank, so both have the same host blocks).
"""

import tempfile

import pytest
import torch

from paged.models import load_model
from paged.step05_preemption import PreemptingEngine
from paged.step06_tensor_parallel import SamplingParams, TensorParallelEngine, load_sharded
from tests.hf_models import build_hf_model, save_checkpoint
from tests.step06_tensor_parallel.test_tensor_parallel import swap_space

pytestmark = pytest.mark.step06
ENGINE = dict(block_size=4, num_blocks=10, attention_backend="reference", preemption_mode="swap")


def _snapshots(engine) -> list[dict]:
    snaps = []
    engine.add_observer(lambda eng, plan, results: snaps.append(eng.kv_snapshot()))
    engine.add_request("old", [1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    engine.add_request("pair", [6, 7, 8, 9, 10, 11], SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=10,
                                                                    ignore_eos=True))
    for _ in range(300):
        if not engine.has_unfinished():
            break
        engine.step()
    return snaps


def test_tp2_snapshots_equal_tp1_snapshots_every_iteration():
    """Exact: W = 2's snapshot equals W = 1's after every iteration, preemption by swap included."""
    path = save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp())
    model = load_model(path, dtype=torch.float64)
    want = _snapshots(PreemptingEngine(model, swap_space=swap_space(model, 1, blocks=16), **ENGINE))
    tp = TensorParallelEngine(load_sharded(path, torch.float64, "cpu", 2), tensor_parallel_size=2,
                              swap_space=swap_space(model, 2, blocks=16), **ENGINE)
    try:
        got = _snapshots(tp)
    finally:
        tp.close()
    assert got == want
    assert any(s["queues"]["swapped"] for s in want)  # the run really swapped a group out
