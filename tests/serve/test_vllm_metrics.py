"""Cached prompt tokens in ``usage`` and vLLM's metric names on ``/metrics``, in-process on the demo model.

* ``usage.prompt_tokens_details.cached_tokens``: a prompt sent twice finds its
  full blocks in the prefix cache the second time; the count is exactly those
  blocks' tokens, in the whole answer and in a stream's usage chunk.
* ``/metrics``: every series vLLM's example Grafana dashboard queries
  (``examples/online_serving/prometheus_grafana/grafana.json``, both of its
  recent versions) is exported under its name with the ``model_name`` label;
  the prefix-cache counters move by exactly the tokens ``usage`` reports, and
  the prompt counter by the prompt tokens, cached ones included.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from paged import LLM
from paged.demo import DEFAULT_MODEL_PATH
from paged.serve.app import build_app
from tests.serve.conftest import metric

BLOCK = 8
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
# every series the dashboard's queries read (name as scraped: a histogram's parts, a counter's _total)
DASHBOARD = ["vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
             "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
             "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
             "vllm:time_per_output_token_seconds_count", "vllm:num_requests_running", "vllm:num_requests_swapped",
             "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_bucket",
             "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
             "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
             "vllm:request_generation_tokens_bucket", "vllm:request_success_total",
             "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
             "vllm:request_decode_time_seconds_sum", "vllm:request_max_num_generation_tokens_sum",
             # and what vLLM's v1 engine adds
             "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
             "vllm:inter_token_latency_seconds_bucket", "vllm:num_preemptions_total", "vllm:iteration_tokens_total_bucket"]


@pytest.fixture(scope="module")
def c():
    llm = LLM(str(DEFAULT_MODEL_PATH), dtype="float32", device="cpu", block_size=BLOCK, num_blocks=96, seed=0)
    with TestClient(build_app(llm, "m")) as client:
        yield client


def scrape(c) -> dict[str, float]:
    out = {}
    for line in c.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_a_repeated_prompt_reports_its_cached_tokens(c):
    """Exact: the first request caches nothing; the same prompt again finds every full block of it but the
    last token's (a prompt's last token is always computed), in the answer and in the stream's usage."""
    body = {"prompt": PROMPT + "# a", "max_tokens": 2, "temperature": 0}
    first = c.post("/v1/completions", json=body).json()["usage"]
    second = c.post("/v1/completions", json=body).json()["usage"]
    prompt = first["prompt_tokens"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"] == {"cached_tokens": (prompt - 1) // BLOCK * BLOCK}
    r = c.post("/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}})
    last = json.loads([line for line in r.text.splitlines() if line.startswith("data: {")][-1][6:])
    assert last["usage"]["prompt_tokens_details"] == second["prompt_tokens_details"]


def test_chat_reports_cached_tokens_too(c):
    body = {"messages": [{"role": "user", "content": PROMPT * 2}], "max_tokens": 2}
    c.post("/v1/chat/completions", json=body)
    usage = c.post("/v1/chat/completions", json=body).json()["usage"]
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"]


def test_the_dashboards_series_are_exported_with_the_model_name(c):
    c.post("/v1/completions", json={"prompt": "x = ", "max_tokens": 3})
    scraped = scrape(c)
    names = {key.split("{")[0] for key in scraped if 'model_name="m"' in key}
    assert [n for n in DASHBOARD if n not in names] == []


def test_the_counters_move_by_what_usage_reports(c):
    """Exact: prompt tokens (cached ones included), prefix-cache queries and hits, requests by reason."""
    before = scrape(c)
    body = {"prompt": PROMPT + "# b", "max_tokens": 4, "ignore_eos": True}
    usages = [c.post("/v1/completions", json=body).json()["usage"] for _ in range(2)]
    after = scrape(c)

    def moved(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    prompts = sum(u["prompt_tokens"] for u in usages)
    assert moved("vllm:prompt_tokens_total") == moved("vllm:prefix_cache_queries_total") == prompts
    assert moved("vllm:prefix_cache_hits_total") == sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages) > 0
    assert moved("vllm:request_success_total", finished_reason="length") == 2
    assert moved("vllm:generation_tokens_total") == 8
    assert moved("vllm:time_to_first_token_seconds_count") == moved("vllm:e2e_request_latency_seconds_count") == 2
    assert moved("vllm:request_queue_time_seconds_count") == moved("vllm:request_prefill_time_seconds_count") == 2
    assert moved("vllm:inter_token_latency_seconds_count") == 2 * 3  # 4 tokens, each request's 3 gaps
    assert moved("paged_prompt_tokens_computed_total") == prompts - moved("vllm:prefix_cache_hits_total")
