"""Length traces: synthetic means match the paper (§6.1), JSONL errors name the line."""

import json
import statistics

import pytest

from paged.bench.traces import (
    SYNTHETIC,
    TraceFormatError,
    clip_to_max_len,
    load_jsonl,
    synthetic_trace,
)
from paged.step01_allocator import TraceRequest
from tests.tolerances import TRACE_MEAN_RTOL

PAPER_MEANS = {"sharegpt": (161.3, 338.0), "alpaca": (19.3, 58.5)}  # §6.1, Figure 11


@pytest.mark.parametrize("name", sorted(PAPER_MEANS))
def test_traces_synthetic_means_match_the_paper(name):
    """Toleranced (TRACE_MEAN_RTOL): sampling noise plus the redraw of over-long pairs."""
    trace = synthetic_trace(name, 20_000, seed=1)
    prompt, output = PAPER_MEANS[name]
    assert statistics.mean(r.prompt_len for r in trace) == pytest.approx(prompt, rel=TRACE_MEAN_RTOL)
    assert statistics.mean(r.output_len for r in trace) == pytest.approx(output, rel=TRACE_MEAN_RTOL)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_traces_synthetic_are_seeded_and_fit_max_len(name):
    a = synthetic_trace(name, 300, seed=7, max_len=512)
    assert a == synthetic_trace(name, 300, seed=7, max_len=512)
    assert a != synthetic_trace(name, 300, seed=8, max_len=512)
    assert len(a) == 300
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.total_len <= 512 for r in a)


def test_traces_synthetic_sharegpt_is_longer_than_alpaca():
    share, alpaca = synthetic_trace("sharegpt", 2000), synthetic_trace("alpaca", 2000)
    assert statistics.mean(r.total_len for r in share) > 5 * statistics.mean(r.total_len for r in alpaca)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="lmsys", num_requests=5), "unknown synthetic trace 'lmsys'"),
    (dict(name="alpaca", num_requests=0), "num_requests must be >= 1"),
    (dict(name="alpaca", num_requests=5, max_len=1), "max_len must be >= 2"),
], ids=["name", "count", "max-len"])
def test_traces_synthetic_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_trace(**kwargs)


def test_traces_jsonl_round_trip(tmp_path):
    path = tmp_path / "trace.jsonl"
    rows = [{"prompt_len": 5, "output_len": 7, "id": "a"}, {"output_len": 1, "prompt_len": 2}]
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    assert load_jsonl(path) == [TraceRequest(5, 7), TraceRequest(2, 1)]


@pytest.mark.parametrize("bad_line, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"prompt_len": 3}', "output_len must be an integer >= 1, got None"),
    ('{"prompt_len": 0, "output_len": 3}', "prompt_len must be an integer >= 1, got 0"),
    ('{"prompt_len": "12", "output_len": 3}', "prompt_len must be an integer >= 1, got '12'"),
    ('{"prompt_len": 4, "output_len": 2.5}', "output_len must be an integer >= 1, got 2.5"),
    ('{"prompt_len": true, "output_len": 3}', "prompt_len must be an integer >= 1, got True"),
], ids=["json", "list", "missing", "zero", "string", "float", "bool"])
def test_traces_jsonl_bad_row_names_the_line(tmp_path, bad_line, match):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"prompt_len": 1, "output_len": 1}\n\n' + bad_line + "\n")
    with pytest.raises(TraceFormatError, match=match) as info:
        load_jsonl(path)
    assert f"{path}:3:" in str(info.value)


def test_traces_jsonl_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(TraceFormatError, match="no requests"):
        load_jsonl(path)


def test_traces_clip_to_max_len_drops_and_stops():
    trace = [TraceRequest(10, 5), TraceRequest(16, 1), TraceRequest(12, 9)]
    kept, dropped, clipped = clip_to_max_len(trace, 16)
    assert kept == [TraceRequest(10, 5), TraceRequest(12, 4)]
    assert (dropped, clipped) == (1, 1)
