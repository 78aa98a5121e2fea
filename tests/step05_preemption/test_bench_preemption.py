"""``python -m paged.bench preemption`` (Figure 19) on tiny sizes: the JSON it promises, and
outputs identical across swap, recompute and auto while each mode really preempted."""

import json
import tempfile

import pytest

from paged.bench.__main__ import main
from paged.step05_preemption import PREEMPTION_MODES
from tests.hf_models import build_hf_model, save_checkpoint


@pytest.fixture(scope="module")
def checkpoint():
    return save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp())


def test_bench_preemption_json_shape_and_identical_outputs(checkpoint, capsys, tmp_path):
    plot, timeline = tmp_path / "fig19.png", tmp_path / "timeline.png"
    code = main(["preemption", "--model", str(checkpoint), "--block-sizes", "4,16", "--num-seqs", "2",
                 "--seq-len", "32", "--repeats", "1", "--requests", "8", "--length-scale", "32", "--rounds", "1",
                 "--plot", str(plot), "--timeline", str(timeline), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert set(result) == {"micro", "e2e"}
    assert [r["block_size"] for r in result["micro"]] == [4, 16]
    for row in result["micro"]:
        assert set(row) == {"block_size", "swap_ms", "recompute_ms"}
        assert row["swap_ms"] > 0 and row["recompute_ms"] > 0
    e2e = result["e2e"]
    assert set(e2e) == set(PREEMPTION_MODES)
    assert len({r["outputs_sha256"] for r in e2e.values()}) == 1
    assert all(r["outputs_identical"] for r in e2e.values())
    assert len({r["output_tokens"] for r in e2e.values()}) == 1
    # the pool was starved: each mode preempted, by the mechanism it names
    assert e2e["swap"]["preemptions"]["swap"] > 0 and e2e["swap"]["preemptions"]["recompute"] == 0
    assert e2e["recompute"]["preemptions"]["recompute"] > 0 and e2e["recompute"]["preemptions"]["swap"] == 0
    assert sum(e2e["auto"]["preemptions"].values()) > 0
    for r in e2e.values():
        assert r["normalized_latency_s"] > 0 and r["throughput_tok_s"] > 0
    assert plot.stat().st_size > 0 and timeline.stat().st_size > 0


def test_bench_preemption_refuses_bad_sizes(checkpoint, capsys):
    assert main(["preemption", "--model", str(checkpoint), "--requests", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
