"""Load and faults against the real server: 200 concurrent streams all complete with the right token
counts and leave every KV block free; 20 clients that drop mid-stream are aborted and free theirs."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.serve.conftest import API_KEY, metric

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
NUM_LOAD = 200
NUM_DROP = 20
DRAIN_TIMEOUT_S = 30


def wait_idle(server) -> dict[str, float]:
    """Poll /metrics (bounded) until nothing runs or waits; return the last scrape."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        m = server.metrics()
        if metric(m, "vllm:num_requests_running") == 0 and metric(m, "vllm:num_requests_waiting") == 0:
            return m
        assert time.monotonic() < deadline, f"still busy after {DRAIN_TIMEOUT_S}s: {m}"
        time.sleep(0.05)


async def stream_one(http: httpx.AsyncClient, i: int) -> tuple[int, int, str, bool]:
    body = {"model": "test-model", "prompt": f"def f{i % 7}(x):", "max_tokens": 12 + i % 9, "temperature": 1.0,
            "seed": i, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    usage, finish, done, text = None, None, False, ""
    async with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                text += c["text"]
                finish = c["finish_reason"] or finish
    return body["max_tokens"], usage["completion_tokens"], finish, done


def test_200_concurrent_streams_complete_and_free_every_block(server):
    before = server.metrics()

    async def run():
        limits = httpx.Limits(max_connections=NUM_LOAD, max_keepalive_connections=NUM_LOAD)
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, limits=limits, timeout=120) as http:
            return await asyncio.gather(*(stream_one(http, i) for i in range(NUM_LOAD)))

    t0 = time.monotonic()
    results = asyncio.run(run())
    elapsed = time.monotonic() - t0
    assert len(results) == NUM_LOAD
    for want, got, finish, done in results:
        assert (got, finish, done) == (want, "length", True)
    m = wait_idle(server)
    assert m['paged_kv_blocks{device="cpu",state="free"}'] == m['paged_kv_blocks{device="cpu",state="total"}']
    assert m['paged_kv_slots{state="token_states"}'] == 0
    generated = metric(m, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total")
    assert generated == sum(r[0] for r in results)
    ttft = "vllm:time_to_first_token_seconds_count"
    assert metric(m, ttft, model_name="test-model") - metric(before, ttft) >= NUM_LOAD
    assert sum(v for k, v in m.items() if k.startswith("paged_preemptions_total")) > 0  # the cache was outgrown
    assert m['paged_kv_blocks{device="cpu_swap",state="used"}'] == 0
    print(f"\n{NUM_LOAD} concurrent streams, {int(generated)} tokens: {elapsed:.1f}s")


def test_clients_dropping_mid_stream_are_aborted_and_free_their_blocks(server):
    before = server.metrics()

    async def drop(http: httpx.AsyncClient, i: int) -> int:
        body = {"model": "test-model", "prompt": f"x{i} =", "max_tokens": 80, "ignore_eos": True, "stream": True}
        chunks = 0
        async with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    chunks += 1
                    if chunks == 3:  # the role / first text chunks have arrived: go away
                        break
        return chunks

    async def run():
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, timeout=60) as http:
            return await asyncio.gather(*(drop(http, i) for i in range(NUM_DROP)))

    assert asyncio.run(run()) == [3] * NUM_DROP
    m = wait_idle(server)
    assert m['paged_kv_blocks{device="cpu",state="free"}'] == m['paged_kv_blocks{device="cpu",state="total"}']
    aborted = metric(m, "vllm:request_success_total", finished_reason="abort") - metric(
        before, "vllm:request_success_total", finished_reason="abort")
    assert aborted == NUM_DROP
    generated = metric(m, "vllm:generation_tokens_total") - metric(before, "vllm:generation_tokens_total")
    assert generated < NUM_DROP * 80 / 2  # stopped early, not run to max_tokens
    # and the server still serves
    r = httpx.post(server.url + "/v1/completions", headers=HEADERS, timeout=60,
                   json={"model": "test-model", "prompt": "ok", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_non_streamed_clients_that_time_out_are_aborted(server):
    """A non-streamed request has no stream to cancel: the server watches for the disconnect."""
    before = server.metrics()
    body = {"model": "test-model", "prompt": "y =", "max_tokens": 120, "ignore_eos": True}

    async def run():
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, timeout=0.05) as http:
            return await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(5)),
                                        return_exceptions=True)

    assert all(isinstance(r, httpx.TimeoutException) for r in asyncio.run(run()))
    m = wait_idle(server)
    assert m['paged_kv_blocks{device="cpu",state="free"}'] == m['paged_kv_blocks{device="cpu",state="total"}']
    key = "vllm:request_success_total"
    assert metric(m, key, finished_reason="abort") - metric(before, key, finished_reason="abort") == 5


def test_metrics_exports_every_series(server):
    names = set(k.split("{")[0] for k in server.metrics())
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_swapped",
                 "paged_kv_blocks", "vllm:kv_cache_usage_perc", "paged_kv_slots", "paged_prefix_cache_hit_rate",
                 "paged_preemptions_total", "paged_prompt_tokens_computed_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket"]:
        assert name in names, name
    m = server.metrics()
    assert {'paged_preemptions_total{mode="swap"}', 'paged_preemptions_total{mode="recompute"}'} <= set(m)
    slots = sum(m[f'paged_kv_slots{{state="{s}"}}'] for s in ("token_states", "internal_fragmentation", "free"))
    assert slots == m['paged_kv_blocks{device="cpu",state="total"}'] * 8  # Figure 2 partitions the pool
