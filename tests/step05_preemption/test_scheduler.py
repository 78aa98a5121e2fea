"""Scheduling rules of step05: FCFS across preemption, no starvation, no hang, clear refusals."""

import tempfile

import pytest
import torch

from paged.models import load_model
from paged.step05_preemption import PreemptingEngine, SamplingParams
from paged.step05_preemption.engine import DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
from tests.hf_models import build_hf_model, save_checkpoint

GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp()), dtype=torch.float64)


def _engine(model, **kw):
    return PreemptingEngine(model, block_size=4, **kw)


def test_preempted_request_resumes_before_later_arrivals(model):
    engine = _engine(model, num_blocks=10, preemption_mode="recompute")
    for i in range(3):
        engine.add_request(f"early{i}", [1 + i, 2, 3, 4, 5], SamplingParams(max_tokens=20, **GREEDY))
    preempted = None
    for _ in range(200):
        engine.step()
        if engine.scheduler.waiting and not preempted:
            preempted = engine.scheduler.waiting[0].request_id
            engine.add_request("late", [9, 9], SamplingParams(max_tokens=3, **GREEDY))
        if preempted and preempted not in {r.request_id for r in engine.scheduler.waiting}:
            break
    assert preempted is not None, "the pool was not small enough to preempt"
    running = {r.request_id for r in engine.scheduler.running}
    waiting = [r.request_id for r in engine.scheduler.waiting]
    assert preempted in running and "late" in waiting  # resumed first; the later arrival still waits
    while engine.has_unfinished():
        engine.step()
    assert engine.scheduler.kv.allocator.num_used == 0


def test_no_request_starves_under_a_stream_of_arrivals(model):
    """The first request finishes within a bounded number of steps while new ones keep arriving."""
    engine = _engine(model, num_blocks=12, preemption_mode="auto")
    engine.add_request("first", list(range(1, 10)), SamplingParams(max_tokens=25, **GREEDY))
    finished_at = None
    for step in range(400):
        if step % 2 == 0 and step < 300:
            engine.add_request(f"new{step}", [7, 8, step % 50 + 1], SamplingParams(max_tokens=4, **GREEDY))
        for out in engine.step():
            if out.request_id == "first" and out.finished:
                finished_at = step
        if finished_at is not None:
            break
    assert finished_at is not None and finished_at < 150, finished_at
    for rid in list(engine.requests):
        engine.abort(rid)
    assert not engine.has_unfinished() and engine.scheduler.kv.allocator.num_used == 0


def test_prompt_larger_than_the_pool_is_refused_at_admission(model):
    engine = _engine(model, num_blocks=3)
    with pytest.raises(ValueError, match="needs 4 KV blocks but the cache has only 3"):
        engine.add_request("big", list(range(1, 15)), SamplingParams())
    assert not engine.has_unfinished()


def test_sequence_outgrowing_the_whole_pool_ends_instead_of_hanging(model):
    engine = _engine(model, num_blocks=3)  # 12 slots
    engine.add_request("grow", [1, 2, 3], SamplingParams(max_tokens=40, **GREEDY))
    outs = []
    for _ in range(100):
        outs += engine.step()
        if not engine.has_unfinished():
            break
    assert not engine.has_unfinished()
    final = [o for o in outs if o.finished][0].outputs[0]
    assert final.finish_reason == "length" and len(final.token_ids) == 12 - 3 + 1
    assert engine.scheduler.kv.allocator.num_used == 0


def test_swapped_group_wider_than_the_token_budget_comes_back_when_the_device_is_empty(model):
    """A found hang: three samples swapped out, a token budget of 2; the group may exceed the
    budget only in an empty plan, and swap-in refused it even then. Every request must end."""
    from paged.step02_block_table import KVCache

    cfg = model.config
    per_block = KVCache.bytes_per_block(cfg.num_layers, 2, cfg.num_kv_heads, cfg.head_dim, torch.float64)
    engine = PreemptingEngine(model, block_size=2, num_blocks=2, preemption_mode="swap", swap_space=2 * per_block,
                              max_num_batched_tokens=2, attention_backend="reference")
    engine.add_request("greedy", [3], SamplingParams(max_tokens=6, **GREEDY))
    engine.add_request("samples", [3], SamplingParams(n=3, temperature=1.0, seed=0, max_tokens=6, ignore_eos=True))
    swapped_out, steps = False, 0
    while engine.has_unfinished():
        engine.step()
        swapped_out |= bool(engine.scheduler.swapped)
        steps += 1
        assert steps <= 100, "the swapped group never came back"
    assert swapped_out, "the case no longer swaps: it tests nothing"
    assert engine.scheduler.kv.allocator.num_used == 0 and engine.scheduler.kv.host.num_used == 0


def test_group_wider_than_an_iteration_is_refused(model):
    engine = _engine(model, num_blocks=16, max_num_seqs=2)
    with pytest.raises(ValueError, match=r"^n must be <= 2 \(max_num_seqs.*got 3$"):
        engine.add_request("wide", [1, 2], SamplingParams(n=3, temperature=1.0))
    with pytest.raises(ValueError, match=r"^best_of must be <= 2 \(max_num_seqs.*got 3$"):
        engine.add_request("wide", [1, 2], SamplingParams(n=2, best_of=3, temperature=1.0))
    assert not engine.has_unfinished()


def test_abort_of_swapped_request_frees_host_blocks(model):
    engine = _engine(model, num_blocks=8, preemption_mode="swap")
    for i in range(3):
        engine.add_request(f"r{i}", [1 + i, 2, 3, 4, 5, 6], SamplingParams(max_tokens=30, **GREEDY))
    for _ in range(100):
        engine.step()
        if engine.scheduler.swapped:
            break
    assert engine.scheduler.swapped, "nothing was swapped out"
    victim = engine.scheduler.swapped[0].request_id
    assert engine.scheduler.kv.host.num_used > 0
    engine.abort(victim)
    assert not engine.scheduler.swapped or victim not in {r.request_id for r in engine.scheduler.swapped}
    for rid in list(engine.requests):
        engine.abort(rid)
    assert engine.scheduler.kv.host.num_used == 0 and engine.scheduler.kv.allocator.num_used == 0


@pytest.mark.parametrize("kw, match", [
    (dict(preemption_mode="evict"), "preemption_mode"),
    (dict(swap_space=-1), "swap_space"),
], ids=["bad-mode", "negative-swap"])
def test_bad_engine_settings_are_refused(model, kw, match):
    with pytest.raises(ValueError, match=match):
        _engine(model, num_blocks=8, **kw)


def test_long_prefill_token_threshold_caps_each_chunk_of_a_prompt(model):
    """``long_prefill_token_threshold=8``: a 30-token prompt is computed 8 tokens an iteration (8, 8, 8, 6)
    while a short request started beside it decodes; the outputs equal an uncapped engine's (float64)."""
    capped = _engine(model, num_blocks=32, long_prefill_token_threshold=8)
    assert capped.scheduler.chunking.long_prefill_token_threshold == 8
    capped.add_request("short", [5, 6], SamplingParams(max_tokens=6, **GREEDY))
    capped.add_request("long", list(range(3, 33)), SamplingParams(max_tokens=3, **GREEDY))
    long_seq = capped.requests["long"].seqs[0].seq_id
    seen, answers = [], {}
    capped.add_observer(lambda e, plan, _: seen.append(
        [q for s, q in zip(plan.seq_ids, plan.query_lens) if q > 1 and s == long_seq]))
    while capped.has_unfinished():
        for out in capped.step():
            answers[out.request_id] = out.outputs[0].token_ids
    assert [c for c in seen if c] == [[8], [8], [8], [6]]
    plain = _engine(model, num_blocks=32)
    plain.add_request("short", [5, 6], SamplingParams(max_tokens=6, **GREEDY))
    plain.add_request("long", list(range(3, 33)), SamplingParams(max_tokens=3, **GREEDY))
    expected = {}
    while plain.has_unfinished():
        for out in plain.step():
            expected[out.request_id] = out.outputs[0].token_ids
    assert answers == expected


def test_at_the_defaults_a_newcomer_starts_beside_a_long_prompt():
    """Exact (a scheduling rule): the engine's default chunk cap (256) leaves room in the token budget (2 048): a 2-token request
    added after a 1 000-token prompt's first chunk is admitted in the very next iteration and finishes
    there, while the long prompt is still mid-prefill (with no cap the prompt's chunks would take the
    whole budget and the newcomer would wait until the prompt is done)."""
    long_model = load_model(save_checkpoint(build_hf_model("llama", max_position_embeddings=1024), tempfile.mkdtemp()),
                            dtype=torch.float64)
    engine = _engine(long_model, num_blocks=300)
    assert engine.scheduler.chunking.long_prefill_token_threshold == DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD > 0
    engine.add_request("long", [3 + i % 50 for i in range(1000)], SamplingParams(max_tokens=1, **GREEDY))
    engine.step()
    engine.add_request("new", [5, 6], SamplingParams(max_tokens=1, **GREEDY))
    finished = {out.request_id for out in engine.step() if out.finished}
    assert finished == {"new"} and engine.requests["long"].seqs[0].num_pending == 1000 - 2 * 256
