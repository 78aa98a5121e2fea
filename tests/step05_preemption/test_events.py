"""``engine.events``: the records of each iteration agree with the plan and the block tables.

A mixed batch (parallel samples, beams, prefix hits, a long prompt) runs in a
starved pool under swap, so every kind of decision happens. An observer checks
after each iteration (exact integer equalities, no tolerance):

* the ``cow`` / ``swapped_out`` / ``swapped_in`` records are exactly the plan's
  ``blocks_to_copy`` / ``blocks_to_swap_out`` / ``blocks_to_swap_in``, in order;
* ``allocated`` blocks are distinct within the iteration, and each still sits
  in its sequence's table after it (unless that sequence finished in it);
* every sequence is reported ``finished`` exactly once, and an abort between
  iterations opens the next iteration's records.
"""

import tempfile
from collections import Counter

import pytest
import torch

from paged.models import load_model
from paged.step05_preemption import EVENT_KINDS, PreemptingEngine, SamplingParams
from tests.hf_models import build_hf_model, save_checkpoint
from tests.step05_preemption.test_transparency import _requests


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp()), dtype=torch.float64)


def _check_iteration(engine, plan, seen, finished):
    events = engine.events
    assert {e.kind for e in events} <= set(EVENT_KINDS)
    of = lambda kind: [e for e in events if e.kind == kind]  # noqa: E731
    assert [(e.detail["src"], e.detail["dst"]) for e in of("cow")] == plan.blocks_to_copy
    assert [m for e in of("swapped_out") for m in e.detail["blocks"]] == plan.blocks_to_swap_out
    assert [m for e in of("swapped_in") for m in e.detail["blocks"]] == plan.blocks_to_swap_in
    ended = {e.seq_id for e in of("finished")}
    fresh = [b for e in of("allocated") for b in e.detail["blocks"]]
    assert len(fresh) == len(set(fresh)), "a block was handed out twice in one iteration"
    tables = {s.seq_id: s.block_table.blocks for r in engine.scheduler.running for s in r.seqs}
    for e in of("allocated"):
        if e.seq_id not in ended:
            assert set(e.detail["blocks"] + e.detail["cached"]) <= set(tables[e.seq_id]), e
    finished.update(Counter(e.seq_id for e in of("finished")))
    seen.update(e.kind for e in events)


def test_events_agree_with_plans_and_tables_under_swap(model):
    engine = PreemptingEngine(model, block_size=4, num_blocks=14, preemption_mode="swap")
    seen, finished = set(), Counter()
    engine.add_observer(lambda eng, plan, results: _check_iteration(eng, plan, seen, finished))
    seq_ids = set()
    for rid, prompt, params in _requests():
        engine.add_request(rid, prompt, params)
    engine.add_request("doomed", [3, 1, 4], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    for step in range(2000):
        if not engine.has_unfinished():
            break
        seq_ids |= {s.seq_id for r in engine.requests.values() for s in r.seqs}
        if step == 3:
            assert engine.abort("doomed")
            engine.step()
            assert engine.events[0].kind == "aborted" and engine.events[0].request_id == "doomed"
            continue
        engine.step()
    assert not engine.has_unfinished() and engine.scheduler.kv.allocator.num_used == 0
    assert seen >= {"admitted", "allocated", "cow", "preempted", "swapped_out", "swapped_in", "finished",
                    "aborted"}, seen
    assert set(finished) >= seq_ids and set(finished.values()) == {1}
