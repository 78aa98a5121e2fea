"""Step05's snapshot: the host swap pool and the swapped queue equal the engine's state (exact integers).

A starved pool under ``swap`` preempts a group of two sequences that share
their prompt blocks. After every iteration the device pool is checked as in
step04, the host pool against the swap allocator and the swapped requests'
tables (which point into it), and each listed table against the sequence's.
"""

import tempfile

import pytest
import torch

from paged.models import load_model
from paged.step05_preemption import KVCache, PreemptingEngine, SamplingParams
from tests.hf_models import build_hf_model, save_checkpoint
from tests.step04_sharing.test_snapshot import assert_pool_matches, assert_tables_match, check_device

pytestmark = pytest.mark.step05


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp()), dtype=torch.float64)


def test_snapshot_equals_host_pool_and_swapped_tables_under_swap(model):
    """Exact: device and host cells, queues and tables equal the engine's after every iteration."""
    c = model.config
    host = 16 * KVCache.bytes_per_block(c.num_layers, 4, c.num_kv_heads, c.head_dim, torch.float64)
    engine = PreemptingEngine(model, block_size=4, num_blocks=10, preemption_mode="swap", swap_space=host)
    seen = {"host_shared": 0, "swapped_listed": 0}

    def observe(eng, plan, results):
        snap = eng.kv_snapshot()
        check_device(eng, snap)
        swapped = {r.request_id: [s.block_table for s in r.seqs] for r in eng.scheduler.swapped}
        assert_pool_matches(snap["pools"]["host"], eng.scheduler.kv.host, snap, swapped)
        assert_tables_match(snap, {"waiting": eng.scheduler.waiting, "running": eng.scheduler.running, "swapped": eng.scheduler.swapped})
        for i in snap["queues"]["swapped"]:
            assert {s["pool"] for s in snap["requests"][i]["seqs"] if s["table"]} == {"host"}
        assert sum(snap["pools"]["host"]["used"]) == snap["stats"]["swap_blocks_used"]
        seen["host_shared"] += sum(snap["pools"]["host"]["shared"])
        seen["swapped_listed"] += len(snap["queues"]["swapped"])

    engine.add_observer(observe)
    engine.add_request("old", [1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    engine.add_request("pair", [6, 7, 8, 9, 10, 11], SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=14,
                                                                    ignore_eos=True))
    for _ in range(500):
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished()
    assert engine.scheduler.preemptions["swap"] > 0 and seen["swapped_listed"] > 0, (engine.scheduler.preemptions, seen)
    assert seen["host_shared"] > 0  # the pair's shared prompt block stayed shared in host memory
