"""``python -m paged.bench waste``: the JSON contract and the Figure 2 claims.

The headline test runs the default ShareGPT-like trace (1000 requests, seed 0,
15 700 slots, B = 16) and checks the paper's qualitative result: paged keeps
>= 95% of its memory in token states, every Orca policy <= 45%, and
Max < Pow2 < Oracle. These are measured, so they can fail if the simulation
changes; the docs page explains the gaps to the paper's exact numbers.
"""

import json
import math

import pytest

from paged.bench.__main__ import main
from paged.step01_allocator.waste import CATEGORIES
from tests.tolerances import SHARES_SUM

SYSTEMS = ["paged", "orca_max", "orca_pow2", "orca_oracle"]


def _run(capsys, *argv):
    rc = main(["waste", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def test_bench_waste_json_is_the_last_line_with_the_documented_shape(capsys):
    rc, out, _ = _run(capsys, "--json", "--num-requests", "200", "--block-size", "8")
    assert rc == 0
    report = _last_json(out)
    assert set(report) == {"trace", "block_size", "systems"}
    assert report["trace"] == "sharegpt" and report["block_size"] == 8
    assert list(report["systems"]) == SYSTEMS
    for shares in report["systems"].values():
        assert list(shares) == list(CATEGORIES)
        assert math.isclose(sum(shares.values()), 1.0, **SHARES_SUM)
    assert "Orca (Oracle)" in out  # the table came first


def test_bench_waste_sharegpt_reproduces_figure2_ordering(capsys):
    rc, out, _ = _run(capsys, "--json")
    assert rc == 0
    s = {name: v["token_states"] for name, v in _last_json(out)["systems"].items()}
    assert s["paged"] >= 0.95
    assert max(s["orca_max"], s["orca_pow2"], s["orca_oracle"]) <= 0.45
    assert s["orca_max"] < s["orca_pow2"] < s["orca_oracle"]


def test_bench_waste_alpaca_paged_still_wins(capsys):
    rc, out, _ = _run(capsys, "--trace", "alpaca", "--json")
    assert rc == 0
    s = {name: v["token_states"] for name, v in _last_json(out)["systems"].items()}
    assert all(s["paged"] > s[o] for o in ("orca_max", "orca_pow2", "orca_oracle"))


def test_bench_waste_reads_a_jsonl_trace_and_plots(capsys, tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"prompt_len": 10 + i, "output_len": 20 + i} for i in range(40)]
    rows.append({"prompt_len": 100, "output_len": 100})  # output stops at --max-len 128
    rows.append({"prompt_len": 130, "output_len": 5})  # no room to generate: dropped
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    png = tmp_path / "fig.png"
    rc, out, _ = _run(capsys, "--trace", str(path), "--max-len", "128", "--kv-slots", "1000",
                      "--plot", str(png), "--json")
    assert rc == 0
    assert "1 prompts of >= 128 tokens dropped, 1 outputs stopped at 128 tokens" in out
    assert _last_json(out)["trace"] == str(path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content, match", [
    (None, "is neither alpaca nor sharegpt nor a file"),
    ('{"prompt_len": 3, "output_len": -1}\n', ":1: output_len must be an integer >= 1"),
], ids=["missing-file", "bad-row"])
def test_bench_waste_bad_trace_exits_2_with_the_reason(capsys, tmp_path, content, match):
    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_text(content)
    rc, out, err = _run(capsys, "--trace", str(path), "--json")
    assert rc == 2 and match in err and out == ""
