"""The replay bench: its engine schedules exactly as a real one, and its clock does the stated arithmetic.

* Plans: a real step05 engine serving a tiny random LLaMA and the replay engine (stand-in model) serve
  the same requests with the same pool and budgets; their ``StepPlan``s' scheduling fields are equal
  (exact: they are integers), iteration by iteration, with preemption happening. Token values differ
  (the stand-in does not compute them), which changes nothing under ``ignore_eos`` and fixed lengths.
* Cost model: a decode and a prefill iteration of OPT-13B on an A100-40GB against the formula written out
  by hand with the data-sheet numbers; equal up to float rounding (relative 1e-12), as both sides sum
  the same terms in different orders. The KV budget is integer arithmetic, compared exactly.
"""

import json

import pytest

from paged.bench import replay_cost, throughput
from paged.bench.__main__ import main as bench_main
from paged.bench._threads import torch_threads
from paged.bench.replay_cost import CostModel, attention_pairs
from paged.bench.replay_engine import ReplayEngine, ReplayRunner, stand_in_model
from paged.models.random_llama import load_random_llama
from paged.step02_block_table import KVCache
from paged.step03_attention import SamplingParams

B, CONTEXT = 4, 64
SCHEDULING_FIELDS = ("seq_ids", "positions", "slot_mapping", "query_lens", "context_lens", "block_tables",
                     "sample", "seeds", "blocks_to_copy", "blocks_to_swap_out", "blocks_to_swap_in",
                     "finished_seq_ids", "fanout")


@pytest.fixture(scope="module")
def model():
    return load_random_llama(max_position_embeddings=CONTEXT)


def _requests():
    """Prompts of 6-10 tokens, 9-16 tokens each; one parallel-sampling request (forks, copy-on-write)."""
    out = []
    for i in range(8):
        prompt = [3 + (7 * i + j) % 200 for j in range(6 + i % 5)]
        n = 2 if i == 3 else 1
        params = SamplingParams(n=n, temperature=1.0 if n > 1 else 0.0, seed=100 + i, max_tokens=9 + i,
                                ignore_eos=True)
        out.append((str(i), prompt, params))
    return out


def _swap_bytes(m, blocks):
    """``swap_space`` (bytes) that gives a real engine of ``m`` exactly ``blocks`` host blocks."""
    c = m.config
    return blocks * KVCache.bytes_per_block(c.num_layers, B, c.num_kv_heads, c.head_dim,
                                            next(m.model.parameters()).dtype)


def _plans(engine):
    plans = []
    engine.add_observer(lambda eng, plan, results: plans.append(
        {f: getattr(plan, f) for f in SCHEDULING_FIELDS} | {"sampled": sorted(results)}))
    for rid, prompt, params in _requests():
        engine.add_request(rid, prompt, params)
    with torch_threads(1):  # a tiny model: threads only contend on a shared machine
        while engine.has_unfinished():
            engine.step()
    return plans


@pytest.mark.parametrize("memory, mode, num_blocks", [
    ("paged", "recompute", 14), ("paged", "swap", 14), ("paged", "swap", 64), ("orca-oracle", "auto", 24)])
def test_replay_plans_equal_a_real_runs_plans(model, memory, mode, num_blocks):
    kw = dict(memory=memory, block_size=B, num_blocks=num_blocks, max_model_len=CONTEXT,
              max_num_batched_tokens=16, preemption_mode=mode, seed=0, attention_backend="reference")
    real = throughput.ReservingEngine(model, swap_space=_swap_bytes(model, 8), **kw)
    fake = ReplayEngine(stand_in_model(CONTEXT), swap_blocks=8, **kw)
    assert real.scheduler.kv.host.num_blocks == fake.scheduler.kv.host.num_blocks == 8
    expected, got = _plans(real), _plans(fake)
    assert got == expected
    assert fake.scheduler.preemptions == real.scheduler.preemptions
    if num_blocks == 14:  # the small pool does preempt, by the mode asked for
        assert real.scheduler.preemptions[mode] > 0
    assert any(p["blocks_to_copy"] for p in expected) and any(p["fanout"] for p in expected)
    assert fake.runner.iterations == len(expected)


def test_beam_search_replays_with_distinct_ranked_proposals():
    """Beam proposals: 2 x width distinct tokens, log-probabilities decreasing, the same on a rerun."""
    params = SamplingParams(best_of=3, use_beam_search=True, temperature=0.0, max_tokens=12, ignore_eos=True)
    runs = []
    for _ in range(2):
        eng = ReplayEngine(stand_in_model(CONTEXT), block_size=B, num_blocks=64, max_model_len=CONTEXT)
        seen = []
        eng.add_observer(lambda e, plan, results, seen=seen: seen.append(results))
        eng.add_request("beam", list(range(3, 10)), params)
        while eng.has_unfinished():
            outs = eng.step()
        runs.append((seen, [o.token_ids for o in outs[0].outputs]))
    for results in runs[0][0]:
        for r in results.values():
            lps = list(r.top_logprobs.values())
            assert len(r.top_logprobs) == 6 and lps == sorted(lps, reverse=True) and lps[0] < 0
    assert runs[0] == runs[1]
    assert len(runs[0][1]) == 1 and len(runs[0][1][0]) == 12


# -- the cost model, by hand -----------------------------------------------------------------
OPT13B_PARAMS = 40 * (4 * 5120**2 + 2 * 5120 * 20480) + 50272 * 5120 + 2048 * 5120  # layers + embeddings
HBM, PEAK = 1555e9, 312e12
KV_PER_TOKEN = 2 * 40 * 5120 * 2  # 800 KiB
OVERHEAD = 2e-3 + 40 * 10 * 5e-6
FIG18A_S_PER_TOKEN_LAYER = 225e-6 / (32 * 256)  # the calibration point: 8,192 tokens of one layer in 225 us


def test_cost_model_parameters_and_kv_budget():
    cost = CostModel.build("opt-13b", block_size=16)
    assert cost.model.params == OPT13B_PARAMS == 12_850_790_400
    assert replay_cost.ATTENTION_EFFICIENCY == pytest.approx(32 * 256 * 2 * 5120 * 2 / (225e-6 * HBM), rel=1e-12)
    # 90 % of 40 GiB - 25.7 GB of weights - activations of 2,560 tokens (4 x 5120 + 2 x 20480 values each)
    kv = int(0.9 * 40 * 2**30) - 2 * OPT13B_PARAMS - 2560 * (4 * 5120 + 2 * 20480) * 2
    assert cost.kv_cache_bytes() == kv == 12_638_552_064
    assert cost.num_blocks() == kv // (16 * KV_PER_TOKEN) == 964
    assert cost.num_swap_blocks() == 4 * 2**30 // (16 * KV_PER_TOKEN) == 327
    with pytest.raises(ValueError, match="does not fit"):
        CostModel.build("opt-175b", "a100-40gb", 1).num_blocks()


def test_cost_model_decode_iteration_by_hand():
    """Batch 8, context 512 each: weights and KV bound; 4,096 context tokens x 40 layers = 20 x the
    Figure 18a point (8,192 tokens of one layer), so attention is 20 x 225 us."""
    cost = CostModel.build("opt-13b", "a100-40gb")
    t = cost.iteration_time([1] * 8, [512] * 8)
    expected = OVERHEAD + 2 * OPT13B_PARAMS / HBM + 4096 * 40 * FIG18A_S_PER_TOKEN_LAYER + 8 * KV_PER_TOKEN / HBM
    assert t == pytest.approx(expected, rel=1e-12)
    assert t == pytest.approx(0.004 + 0.016528 + 0.0045 + 0.0000042, abs=1e-6)  # 25.0 ms
    assert cost.iteration_time([], []) == 0.0


def test_cost_model_prefill_iteration_by_hand():
    """One 2,048-token prompt: the linear layers and attention are both compute bound."""
    cost = CostModel.build("opt-13b")
    pairs = 2048 * 2049 // 2
    assert attention_pairs(2048, 2048) == pairs and attention_pairs(1, 700) == 700
    t = cost.iteration_time([2048], [2048])
    expected = OVERHEAD + 2 * OPT13B_PARAMS * 2048 / PEAK + 4 * 40 * 5120 * pairs / PEAK
    assert t == pytest.approx(expected, rel=1e-12)
    # and a swap of 10 blocks over PCIe 4 (32 GB/s) plus 3 copy-on-write copies (read + write in HBM)
    block = 16 * KV_PER_TOKEN
    assert cost.iteration_time([], [], 10, 3) == pytest.approx(10 * block / 32e9 + 2 * 3 * block / HBM, rel=1e-12)


def test_cost_model_tensor_parallel_splits_bytes_and_adds_all_reduce():
    one = CostModel.build("opt-13b", "a100-80gb", 1)
    four = CostModel.build("opt-13b", "a100-80gb", 4)
    q, c = [1] * 16, [300] * 16
    body = one.iteration_time(q, c) - one.overhead()
    reduce = 2 * 40 * 2 * 3 / 4 * 16 * 5120 * 2 / 300e9
    assert four.iteration_time(q, c) == pytest.approx(four.overhead() + body / 4 + reduce, rel=1e-12)


def test_runner_time_is_the_cost_of_each_plan():
    cost = CostModel.build("opt-13b", block_size=B)
    eng = ReplayEngine(stand_in_model(CONTEXT), cost=cost, block_size=B, num_blocks=64, max_model_len=CONTEXT)
    total = []
    eng.add_observer(lambda e, plan, results: total.append(cost.plan_time(plan)))
    eng.add_request("a", list(range(3, 20)), SamplingParams(max_tokens=5, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert eng.elapsed == sum(total) and len(total) == 5 and isinstance(eng.runner, ReplayRunner)


def test_cli_json_has_systems_and_paper_ratios(capsys):
    assert bench_main(["replay", "--figure", "16", "--num-requests", "40", "--fractions", "0.3,2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(record["systems"]) == {"paged", "orca_oracle"}
    for s in record["systems"].values():
        assert s["max_rate"] > 0 and s["mean_batched_requests"] > 0
    assert record["paper"] == {"rate": {"orca_oracle": 1.67}}
    assert set(record["panels"]) == {"1-shot prefix (80 tokens)", "5-shot prefix (341 tokens)"}


def test_cli_rejects_bad_fractions(capsys):
    assert bench_main(["replay", "--figure", "12", "--fractions", "0.5"]) == 2
    assert "--fractions needs two or more positive numbers" in capsys.readouterr().err
