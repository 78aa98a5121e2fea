"""Serving benchmark: an async streaming client for any OpenAI-compatible server (paper §6, online).

Sends the requests of a length trace (``paged.bench.e2e``: lengths divided by
``--length-scale``, random prompts) to ``POST {base}/v1/completions`` with
``stream: true``, at ``--request-rate`` requests/s (``inf``: all at once),
inter-arrival gaps drawn from a gamma distribution of shape ``--burstiness``
(1 = Poisson; < 1 burstier), at most ``--max-concurrency`` in flight. Each
request asks for ``max_tokens`` = the trace's output length with
``ignore_eos: true`` (a vLLM extension that ``paged.serve`` honours; other
servers may stop early, and the token counts then say so).

Per request, timed on the client (``time.perf_counter``):

* TTFT — from sending to the first streamed chunk carrying text;
* ITL — the gaps between successive text-carrying chunks;
* TPOT — ``(E2E - TTFT) / (output tokens - 1)``;
* E2E — from sending to the end of the stream;
* output tokens — the ``usage`` chunk's ``completion_tokens`` (asked for with
  ``stream_options.include_usage``), else the number of text chunks.

Reported: request and token throughput, TTFT / TPOT / ITL / E2E (mean, p50,
p99, in ms) and normalized latency (mean of E2E / output tokens, s/token,
the paper's metric). ``--json`` prints them as one JSON object last.

Examples:
    python -m paged.serve --port 8000 &
    python -m paged.bench serve --base-url http://127.0.0.1:8000 --request-rate 4 --json
    python -m paged.bench serve --request-rate inf --max-concurrency 16 --burstiness 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from paged.bench import e2e


@dataclass
class Result:
    """What the client saw of one request."""

    ok: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    e2e.add_common_arguments(parser, num_requests=100)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    parser.add_argument("--served-model", default=None, help="model name to send (default: first of /v1/models)")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="requests per second, or inf: all at once (default)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="shape of the gamma inter-arrival gaps (1: Poisson; default 1)")
    parser.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default 600)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def arrival_gaps(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds to wait before each request: gamma(shape=burstiness, mean=1/rate); 0 if rate is inf."""
    if rate == float("inf"):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"request rate and burstiness must be > 0, got {rate} and {burstiness}")
    rng = np.random.default_rng(seed)
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), n).tolist()


# --8<-- [start:one_request]
async def one_request(client, url: str, body: dict, prompt_len: int) -> Result:
    """Stream one completion; time its chunks."""
    res = Result(prompt_len=prompt_len)
    chunks = 0
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"].get("completion_tokens", 0)
                if any(c.get("text") for c in chunk.get("choices", [])):
                    now = time.perf_counter()
                    if chunks == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += 1
        res.e2e = time.perf_counter() - start
        res.output_tokens = res.output_tokens or chunks
        res.ok = chunks > 0
        if not res.ok:
            res.error = "the stream carried no text"
    except Exception as e:  # a failed request is counted, not fatal to the run
        res.error = f"{type(e).__name__}: {e}"
    return res
# --8<-- [end:one_request]


async def benchmark(base_url: str, model: str | None, jobs: list[e2e.Job], request_rate: float = float("inf"),
                    burstiness: float = 1.0, max_concurrency: int | None = None, seed: int = 0,
                    timeout: float = 600.0, progress: bool = False) -> tuple[list[Result], float]:
    """Send every job; returns the per-request results and the run's duration (s)."""
    import httpx
    from tqdm.auto import tqdm

    gaps = arrival_gaps(len(jobs), request_rate, burstiness, seed)
    limits = httpx.Limits(max_connections=max_concurrency or len(jobs) or 1, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:
        if model is None:
            resp = await client.get("/v1/models")
            resp.raise_for_status()
            model = resp.json()["data"][0]["id"]
        gate = asyncio.Semaphore(max_concurrency or len(jobs) or 1)
        bar = tqdm(total=len(jobs), desc="serve", unit="req", disable=not progress)

        async def send(job: e2e.Job) -> Result:
            body = {"model": model, "prompt": job.prompt, "max_tokens": job.output_len, "stream": True,
                    "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
            async with gate:
                res = await one_request(client, "/v1/completions", body, len(job.prompt))
            bar.update(1)
            return res

        start = time.perf_counter()
        tasks = []
        for job, gap in zip(jobs, gaps):
            await asyncio.sleep(gap)
            tasks.append(asyncio.create_task(send(job)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return list(results), duration


def _stats(values: list[float], scale: float = 1000.0) -> dict:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    v = np.asarray(values) * scale
    return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}


def summarize(results: list[Result], duration: float) -> dict:
    """The run's metrics (times in ms, normalized latency in s/token)."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_token_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (out_tokens + sum(r.prompt_len for r in ok)) / duration if duration else 0.0,
        "ttft_ms": _stats([r.ttft for r in ok]),
        "tpot_ms": _stats([(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]),
        "itl_ms": _stats([g for r in ok for g in r.itl]),
        "e2e_ms": _stats([r.e2e for r in ok]),
        "normalized_latency_s": float(np.mean([r.e2e / r.output_tokens for r in ok])) if ok else 0.0,
    }


def format_report(m: dict) -> str:
    lines = [f"completed {m['completed']}, failed {m['failed']} in {m['duration_s']:.2f} s",
             f"request throughput {m['request_throughput']:.2f} req/s; output tokens "
             f"{m['output_token_throughput']:.1f} tok/s; total tokens {m['total_token_throughput']:.1f} tok/s",
             f"{'(ms)':<6}{'mean':>10}{'p50':>10}{'p99':>10}"]
    for key in ("ttft", "tpot", "itl", "e2e"):
        s = m[f"{key}_ms"]
        lines.append(f"{key.upper():<6}{s['mean']:>10.1f}{s['p50']:>10.1f}{s['p99']:>10.1f}")
    lines.append(f"normalized latency {m['normalized_latency_s']:.4f} s/token")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    prog = "python -m paged.bench serve"
    try:
        if args.max_concurrency is not None and args.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
        arrival_gaps(1, args.request_rate, args.burstiness, args.seed)  # validates
        vocab = _vocab_size(args)
        jobs = e2e.workload(args, vocab)
    except (ValueError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    print(f"server {args.base_url}; trace {args.trace} (lengths / {args.length_scale}): {e2e.describe(jobs)}; "
          f"rate {args.request_rate} req/s, burstiness {args.burstiness}, max concurrency {args.max_concurrency}")
    try:
        results, duration = asyncio.run(benchmark(
            args.base_url, args.served_model, jobs, args.request_rate, args.burstiness, args.max_concurrency,
            args.seed, args.timeout, progress=not args.no_progress))
    except Exception as e:  # the server is not there, or /v1/models is not OpenAI's
        print(f"{prog}: error: cannot reach {args.base_url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    m = summarize(results, duration)
    print(format_report(m))
    errors = [r.error for r in results if not r.ok]
    if errors:
        print(f"first error: {errors[0]}")
    if args.json:
        print(json.dumps({"base_url": args.base_url, "request_rate": args.request_rate, **m}))
    return 0 if m["completed"] else 1


def _vocab_size(args) -> int:
    """Prompt ids must be valid for the server's model: the checkpoint's vocab if ``--model`` is given."""
    if args.model:
        with open(f"{args.model}/config.json", encoding="utf-8") as f:
            return json.load(f)["vocab_size"]
    return 256  # ids 3..255 are valid for every model this repository serves
