"""``python -m paged.bench sharing`` and ``prefix``: the JSON contracts and what must hold.

* The parallel-sampling replay (``replay_parallel``, block accounting only)
  gives exactly the sums the real ``SharingEngine`` gives for the same
  lengths: the bench's parallel numbers are the engine's.
* Sharing never costs blocks (savings in [0, 1)); parallel savings do not
  fall as ``n`` grows (the shared prompt is divided among more samples).
* The committed Figures 8-10 are what `diagram.py` draws from real tables today.
* Prefix caching computes fewer prompt tokens and the greedy outputs are
  identical with and without it (the bench says so; the engine tests prove
  it in float64).
"""

import json

import pytest

from paged.bench.__main__ import main
from paged.bench.sharing import measure_engine, replay_parallel
from paged.models.random_llama import load_random_llama
from paged.bench.traces import synthetic_trace
from paged.step01_allocator.waste import TraceRequest
from paged.step04_sharing import SamplingParams, SharingEngine


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr().out
    return rc, out, json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model():
    return load_random_llama(max_position_embeddings=128)


@pytest.mark.parametrize("n", [2, 3])
def test_replay_parallel_equals_the_engine_blocks_used_and_needed(model, n):
    trace = [TraceRequest(7, 6), TraceRequest(16, 3), TraceRequest(1, 9), TraceRequest(33, 1)]
    replay = replay_parallel(trace, n, block_size=4)
    engine = SharingEngine(model, block_size=4, num_blocks=200, enable_prefix_caching=False,
                           attention_backend="reference")
    for i, r in enumerate(trace):
        engine.add_request(f"r{i}", [5 + i] * r.prompt_len, SamplingParams(
            n=n, temperature=1.0, seed=i, max_tokens=r.output_len, ignore_eos=True))
    real = measure_engine(engine)
    assert engine.scheduler.kv.allocator.num_used == 0
    assert (replay.used, replay.needed) == (real.used, real.needed)
    assert real.used < real.needed  # the 7-, 16- and 33-token prompts share full blocks


def test_bench_sharing_json_shape_and_savings(capsys):
    rc, out, report = _run(capsys, "sharing", "--trace", "sharegpt", "--requests", "30", "--beam-requests", "1",
                           "--attention-backend", "reference", "--json")
    assert rc == 0
    assert set(report) == {"parallel", "beam", "trace"} and report["trace"] == "sharegpt"
    for kind in ("parallel", "beam"):
        assert list(report[kind]) == ["2", "4", "6"]
        assert all(0.0 <= f < 1.0 for f in report[kind].values())
    p = report["parallel"]
    assert 0.0 < p["2"] <= p["4"] <= p["6"]
    assert report["beam"]["2"] > 0.0  # two beams share at least their prompt
    assert "beam search" in out and "16.2–30.5%" in out  # the table, beside the paper's range


def test_parallel_savings_grow_with_n_on_alpaca():
    trace = synthetic_trace("alpaca", 200, seed=3)
    saved = [replay_parallel(trace, n, 16).saved for n in (1, 2, 4, 6)]
    assert saved[0] == 0.0
    assert saved[1] < saved[2] < saved[3] < 1.0


def test_bench_prefix_json_shape_and_caching_truths(capsys):
    rc, out, report = _run(capsys, "prefix", "--requests", "3", "--repeats", "1", "--max-tokens", "2",
                           "--attention-backend", "reference", "--json")
    assert rc == 0
    assert set(report) == {"cases"}
    assert [c["prefix_tokens"] for c in report["cases"]] == [80, 341]
    for case in report["cases"]:
        assert set(case) == {"prefix_tokens", "speedup", "prefill_tokens_ratio"}
        assert case["speedup"] > 0.0
        assert 0.0 < case["prefill_tokens_ratio"] < 1.0
    assert out.count("identical with and without caching: 3 of 3 requests") == 2


@pytest.mark.parametrize("bench", ["sharing", "prefix"])
def test_bench_refuses_bad_counts(bench, capsys):
    assert main([bench, "--block-size", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_committed_figures_8_9_10_are_what_the_diagram_draws_today():
    """The committed text figures equal, exactly, what the diagram draws from new runs (Figure 9: beam search
    on the demo model, its tokens decoded); the copies Figure 9 lists are all drawn, freed ones included."""
    from pathlib import Path

    from paged.step04_sharing.diagram import explain_figure9, figure8, figure9_demo, figure10, render_text

    root = Path(__file__).resolve().parents[2] / "docs" / "figures"
    nine = figure9_demo()
    for snap in nine:
        drawn = set(snap.ref_counts) | set(snap.unmapped)
        assert {b for pair in snap.copies for b in pair} <= drawn, (snap.title, snap.copies, drawn)
        assert not any(w.startswith("t") and w[1:].isdigit() for _, _, _, words in snap.tables for w in words)
    for name, snaps in [("figure8", figure8()), ("figure9", nine), ("figure10", figure10())]:
        assert (root / f"step04_{name}.txt").read_text() == "\n".join(render_text(s) for s in snaps), name
        if name == "figure9":  # the page's paragraph under Figure 9 tells this run, not another
            assert (root / "step04_figure9_text.md").read_text() == explain_figure9(*snaps)
    before, after = figure8()
    assert before.ref_counts == {7: 2, 1: 2} and after.copies == [(1, 3)]
    assert after.ref_counts == {7: 2, 1: 1, 3: 1}  # the paper's Figure 8
