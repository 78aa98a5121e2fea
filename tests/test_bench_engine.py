"""``python -m paged.bench engine``: the shared throughput workload and its one JSON line.

The workload is a pure function of its seed (checked: the default draws total
6 594 prompt and 6 294 output tokens over a 32 000-token vocabulary, the
numbers every engine in docs/benchmarks.md was run on). The smoke run uses the
bundled demo model on a few short requests: every request makes exactly its
output length (greedy, ignore_eos), and the JSON line reports what it says.
"""

import json
import statistics

import pytest

from paged.bench.__main__ import main as bench_main
from paged.bench.engine import BOS_ID, make_workload
from paged.demo import DEFAULT_MODEL_PATH
from paged.kernels import cpu
from paged.models import unrolled


def test_bench_engine_workload_is_the_seeded_draws():
    requests = make_workload(64, 100, 50, 64, 128, 32000, seed=0)
    assert sum(len(p) for p, _ in requests) == 6594 and sum(n for _, n in requests) == 6294
    assert all(p[0] == BOS_ID and 50 <= len(p) <= 150 and 64 <= n <= 128 for p, n in requests)
    assert make_workload(64, 100, 50, 64, 128, 32000, seed=1) != requests


def test_bench_engine_prints_one_json_line(capsys):
    argv = ["engine", "--model", str(DEFAULT_MODEL_PATH), "--dtype", "float32", "--num-requests", "3",
            "--prompt-mean", "12", "--prompt-spread", "4", "--min-output", "3", "--max-output", "6",
            "--repeats", "1", "--kv-cache-gib", "0.01"]
    assert bench_main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    requests = make_workload(3, 12, 4, 3, 6, result["vocab_size"], seed=0)
    assert result["output_tokens"] == sum(n for _, n in requests)
    assert result["prompt_tokens"] == sum(len(p) for p, _ in requests)
    assert result["output_tok_per_s"] > 0 and result["total_tok_per_s"] > result["output_tok_per_s"]
    assert result["peak_rss_gib"] > 0 and result["load_s"] > 0 and len(result["cores_used"]) == 1
    assert 0 < result["rss_gib"] <= result["peak_rss_gib"]  # resident now: never above the peak
    # the default model (LLaMA-family) served with the compiled kernels runs the unrolled pass
    assert result["unrolled"] is (cpu.load() is not None and unrolled.UNROLLED and cpu.FUSED_OPS)


def test_bench_engine_compares_the_unrolled_pass_with_the_modules_in_one_process(capsys):
    if not (cpu.load() is not None and unrolled.UNROLLED and cpu.FUSED_OPS):
        pytest.skip("the unrolled pass needs the compiled CPU kernels")
    argv = ["engine", "--model", str(DEFAULT_MODEL_PATH), "--dtype", "float32", "--num-requests", "2",
            "--prompt-mean", "8", "--prompt-spread", "2", "--min-output", "3", "--max-output", "4",
            "--repeats", "2", "--kv-cache-gib", "0.01", "--compare-unrolled"]
    assert bench_main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["unrolled"] is True and len(result["modules_wall_s_all"]) == len(result["wall_s_all"]) == 2
    assert result["modules_output_tok_per_s"] > 0
    # the ratio of the two medians, within what rounding allows: the times are printed to 0.5 ms, the ratio
    # to 0.0005, and it is computed from the unrounded times
    plain, loop, half = statistics.median(result["modules_wall_s_all"]), statistics.median(result["wall_s_all"]), 5e-4
    assert (plain - half) / (loop + half) - half <= result["unrolled_speedup"] <= (plain + half) / (loop - half) + half
