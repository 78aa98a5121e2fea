"""A bounded soak: mixed traffic against one ``python -m paged.serve`` for a while, then the verdict.

    python tools/soak.py --duration 1200        # `make soak`: 20 minutes

One server (the demo model, float32, on a free 127.0.0.1 port) with a KV pool
small enough that requests are preempted. ``--concurrency`` clients send, back
to back, requests drawn from a fixed mix: completions and chat, streamed and
not, ``n`` > 1, ``best_of``, beam search, stop strings, seeds, logprobs,
clients that disconnect mid-stream, and a share of bad requests. At the end
the soak passes when

* no response had a 5xx status (and every bad request got a 4xx),
* every finished request generated the tokens it should (``max_tokens`` per
  choice when it ran to ``length``; usage adds up),
* every KV block is free and the swap pool is empty once traffic stops,
* the server's resident memory at the end is within ``--rss-tolerance`` of its
  value after warm-up,
* the p99 latency of the last third of the run is at most ``--p99-drift``
  times that of the first third (after warm-up): no upward drift;
* the server's CPU time per generated token in the last three tenths is at
  most 1.25 times that of the first three (latency on a shared CPU also
  follows the other processes' load; this figure does not).

The swap pool is small (``--swap-space 8MiB``): the KV and swap pools are
backed by memory only as their pages are first written, so with a large pool
the resident memory keeps growing, boundedly, long after warm-up.

It prints one JSON summary (request counts, preemptions, memory, latencies)
and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.serve.conftest import API_KEY, Server  # noqa: E402 (the suite's server launcher)

from paged.demo import DEFAULT_MODEL_PATH  # noqa: E402

MODEL = "test-model"
PROMPTS = ["def f(x):", "The cat sat on", "import numpy as np\n", "Once upon a time", "for i in range(10):",
           "class Stack:\n    def push(self, x):", "# sum of a list\n", "while True:"]
# (body, expected status) requests the server must refuse with a 4xx and without harm
BAD = [
    ({"prompt": "x", "max_tokens": 0}, 400),
    ({"prompt": "x", "temperature": -1}, 400),
    ({"prompt": [10**9]}, 400),
    ({"prompt": "x", "max_tokens": 10**9}, 400),
    ({"prompt": "x", "n": 3, "best_of": 2}, 400),
    ({"prompt": "x", "stream": True, "use_beam_search": True, "temperature": 0}, 400),
    ({"prompt": "x", "max_token": 4}, 400),
    ({"prompt": "x", "model": "nope"}, 404),
]


def completion_choices(body: dict) -> int:
    """How many choices a request returns per prompt."""
    return body.get("n", 1)


def draw_request(rng: random.Random) -> tuple[str, dict]:
    """One request of the mix: (kind, body). Kinds name what the check expects."""
    roll = rng.random()
    max_tokens = rng.randint(4, 40)
    base = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "seed": rng.randint(0, 10**6)}
    prompt = rng.choice(PROMPTS)
    if roll < 0.05:
        body, status = rng.choice(BAD)
        return f"bad{status}", {"model": MODEL, **body}
    if roll < 0.12:
        return "disconnect", {**base, "prompt": prompt, "max_tokens": 60, "stream": True}
    if roll < 0.20:
        return "beam", {**base, "prompt": prompt, "n": 2, "use_beam_search": True, "temperature": 0.0}
    if roll < 0.30:
        return "n", {**base, "prompt": prompt, "n": rng.randint(2, 3), "best_of": rng.choice([None, 4]),
                     "temperature": 0.8}
    if roll < 0.38:
        return "stop", {**base, "prompt": prompt, "stop": [rng.choice(["\n", " ", "e", "("])], "ignore_eos": False}
    if roll < 0.50:
        return "logprobs", {**base, "prompt": prompt, "logprobs": rng.randint(0, 5)}
    stream = rng.random() < 0.5
    if roll < 0.75:
        body = {**base, "prompt": prompt, "stream": stream, "temperature": rng.choice([0.0, 0.7, 1.0])}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return "completion", body
    body = {**base, "messages": [{"role": "user", "content": prompt}], "stream": stream,
            "logprobs": rng.random() < 0.3}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return "chat", body


def check_finished(kind: str, body: dict, choices: list[dict], usage: dict | None) -> str | None:
    """Why a finished request's token counts are wrong, or None when they are right."""
    want = body["max_tokens"]
    for c in choices:
        finish = c.get("finish_reason")
        if kind == "stop":
            if finish not in ("stop", "length"):
                return f"finish_reason {finish!r}"
        elif finish != "length":
            return f"finish_reason {finish!r} with ignore_eos"
        lp = c.get("logprobs")
        if lp and "tokens" in lp and finish == "length" and len(lp["tokens"]) != want:
            return f"{len(lp['tokens'])} logprob tokens, want {want}"
        if lp and "content" in lp and finish == "length" and len(lp["content"]) != want:
            return f"{len(lp['content'])} logprob tokens, want {want}"
    if usage is None:
        return "no usage"
    n = completion_choices(body)
    if len(choices) != n:
        return f"{len(choices)} choices, want {n}"
    if kind != "stop" and usage["completion_tokens"] != n * want:
        return f"usage.completion_tokens {usage['completion_tokens']}, want {n} x {want}"
    if kind == "stop" and not 0 < usage["completion_tokens"] <= n * want:
        return f"usage.completion_tokens {usage['completion_tokens']} outside (0, {n * want}]"
    return None


async def read_stream(r: httpx.Response, body: dict, disconnect_after: int | None):
    """Gather a streamed response's choices and usage; stop reading after ``disconnect_after`` events."""
    choices: dict[int, dict] = {}
    usage, events = None, 0
    async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        events += 1
        if disconnect_after is not None and events >= disconnect_after:
            return None, None, "disconnected"
        chunk = json.loads(line[6:])
        if "error" in chunk:
            return None, None, f"error chunk {chunk['error']['message']}"
        usage = chunk.get("usage") or usage
        for c in chunk["choices"]:
            mine = choices.setdefault(c["index"], {"index": c["index"], "finish_reason": None, "logprobs": None})
            mine["finish_reason"] = c["finish_reason"] or mine["finish_reason"]
            lp = c.get("logprobs")
            if lp and "tokens" in lp:
                mine["logprobs"] = {"tokens": (mine["logprobs"] or {}).get("tokens", []) + lp["tokens"]}
            elif lp and "content" in lp:
                mine["logprobs"] = {"content": (mine["logprobs"] or {}).get("content", []) + lp["content"]}
    return [choices[i] for i in sorted(choices)], usage, None


class Soak:
    """The traffic, the tallies and the verdict."""

    def __init__(self, server: Server, args) -> None:
        self.server, self.args = server, args
        self.statuses: Counter = Counter()
        self.kinds: Counter = Counter()
        self.failures: list[str] = []
        self.latencies: list[tuple[float, float]] = []  # (finished at, seconds), finished requests only
        self.cost: list[dict] = []  # per tenth of the run after warm-up (sample_cost)
        self.t0 = time.monotonic()

    async def one(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        kind, body = draw_request(rng)
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        start = time.monotonic()
        async with http.stream("POST", path, json=body) as r:
            self.statuses[r.status_code] += 1
            self.kinds[kind] += 1
            if kind.startswith("bad"):
                await r.aread()
                if r.status_code != int(kind[3:]):
                    self.failures.append(f"{kind} {body}: status {r.status_code}")
                return
            if r.status_code != 200:
                self.failures.append(f"{kind} {body}: status {r.status_code} {(await r.aread())[:300]!r}")
                return
            if body.get("stream"):
                choices, usage, why = await read_stream(r, body, rng.randint(2, 6) if kind == "disconnect" else None)
                if why == "disconnected":
                    return
            else:
                data = json.loads(await r.aread())
                choices, usage, why = data["choices"], data["usage"], None
        why = why or check_finished(kind, body, choices, usage)
        if why:
            self.failures.append(f"{kind} {body}: {why}")
        else:
            self.latencies.append((time.monotonic() - self.t0, time.monotonic() - start))

    async def client(self, seed: int, until: float) -> None:
        rng = random.Random(seed)
        async with httpx.AsyncClient(base_url=self.server.url, timeout=300,
                                     headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            while time.monotonic() < until:
                try:
                    await self.one(http, rng)
                except httpx.HTTPError as e:
                    self.failures.append(f"transport error: {e!r}")

    async def run(self) -> None:
        until = self.t0 + self.args.duration
        await asyncio.gather(*(self.client(i, until) for i in range(self.args.concurrency)))


async def sample_cost(soak: Soak, proc: psutil.Process, args, windows: int = 10) -> None:
    """Each tenth of the run after warm-up: the server's CPU time per generated token, and the load average.

    Latency on a shared CPU also rises when other processes take the cores; the server's own CPU time per
    token does not, so a rise in it would be the server slowing down (a leak, a growing structure).
    """
    width = (args.duration - args.warmup) / windows
    async with httpx.AsyncClient(base_url=soak.server.url, timeout=60) as http:
        async def tokens() -> float:
            text = (await http.get("/metrics")).text
            return float(next(line.split()[-1] for line in text.splitlines()
                              if line.startswith("vllm:generation_tokens_total{")))

        last_cpu, last_tokens = sum(proc.cpu_times()[:2]), await tokens()
        for _ in range(windows):
            await asyncio.sleep(width)
            cpu, done = sum(proc.cpu_times()[:2]), await tokens()
            soak.cost.append({"cpu_ms_per_token": round(1000 * (cpu - last_cpu) / max(done - last_tokens, 1), 3),
                              "tokens": int(done - last_tokens), "load_avg_1m": round(os.getloadavg()[0], 1)})
            last_cpu, last_tokens = cpu, done


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


def cost_ratio(cost: list[dict]) -> float:
    """The server's CPU time per token in the last three tenths over that in the first three."""
    if len(cost) < 6:
        return 1.0
    per_token = [c["cpu_ms_per_token"] for c in cost]
    return sum(per_token[-3:]) / sum(per_token[:3])


def windowed_p99(latencies: list[tuple[float, float]], start: float, end: float, windows: int) -> list[float]:
    """p99 latency of each of ``windows`` equal spans of [start, end): the drift, for the eye."""
    width = (end - start) / windows
    spans = [[lat for t, lat in latencies if start + i * width <= t < start + (i + 1) * width] for i in range(windows)]
    return [round(p99(span), 3) for span in spans]


def wait_idle(server: Server, timeout_s: float = 60.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = server.metrics()
        if all(v == 0 for k, v in m.items() if k.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting",
                                                              "vllm:num_requests_swapped"))):
            return m
        if time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=1200.0, help="seconds of traffic (default 1200)")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before the memory baseline (default 60)")
    p.add_argument("--concurrency", type=int, default=24, help="clients sending back to back (default 24)")
    p.add_argument("--num-blocks", type=int, default=96, help="KV pool in blocks of 8 (default 96: preemption)")
    p.add_argument("--swap-space", default="8MiB",
                   help="host swap pool (default 8MiB). The KV and swap pools are backed by memory only as their "
                        "pages are first written, so a large pool would grow the server's RSS long after warm-up "
                        "without any leak; a small one bounds that growth (8 MiB, about 2 %%)")
    p.add_argument("--rss-tolerance", type=float, default=0.05, help="allowed RSS growth after warm-up (5 %%)")
    p.add_argument("--p99-drift", type=float, default=1.5,
                   help="allowed ratio of the last third's p99 to the first third's (default 1.5)")
    args = p.parse_args(argv)

    server = Server(str(DEFAULT_MODEL_PATH), ["--block-size", "8", "--num-blocks", str(args.num_blocks),
                                              "--max-num-seqs", "64", "--seed", "0", "--log-level", "warning",
                                              "--swap-space", args.swap_space],
                    env={"PAGED_API_KEY": API_KEY})
    try:
        proc = psutil.Process(server.proc.pid)
        soak = Soak(server, args)
        rss: dict[str, float] = {"start": proc.memory_info().rss}

        async def traffic():
            task = asyncio.ensure_future(soak.run())
            await asyncio.sleep(min(args.warmup, args.duration))
            rss["after_warmup"] = proc.memory_info().rss
            await sample_cost(soak, proc, args)
            await task

        asyncio.run(traffic())
        m = wait_idle(server)
        rss["end"] = proc.memory_info().rss
        summary = verdict(soak, m, rss, args)
    finally:
        server.stop()
    print(json.dumps(summary, indent=2))
    return 0 if summary["pass"] else 1


def verdict(soak: Soak, m: dict[str, float], rss: dict[str, float], args) -> dict:
    """The figures and each check's outcome."""
    third = (args.duration - args.warmup) / 3
    first = [lat for t, lat in soak.latencies if args.warmup <= t < args.warmup + third]
    last = [lat for t, lat in soak.latencies if t >= args.duration - third]
    server_errors = sum(n for code, n in soak.statuses.items() if code >= 500)
    used = m['paged_kv_blocks{device="cpu",state="total"}'] - m['paged_kv_blocks{device="cpu",state="free"}']
    swapped = m.get('paged_kv_blocks{device="cpu_swap",state="used"}', 0)
    growth = rss["end"] / rss["after_warmup"] - 1
    checks = {
        "no_5xx": server_errors == 0,
        "every_request_right": not soak.failures,
        "no_block_used_at_end": used == 0 and swapped == 0,
        "rss_within_tolerance": growth <= args.rss_tolerance,
        "p99_not_drifting": p99(last) <= args.p99_drift * p99(first),
        "cpu_per_token_not_drifting": cost_ratio(soak.cost) <= 1.25,
    }
    mib = 2**20
    return {
        "duration_s": args.duration, "concurrency": args.concurrency, "num_blocks": args.num_blocks,
        "requests": sum(soak.statuses.values()), "by_kind": dict(soak.kinds),
        "by_status": {str(k): v for k, v in sorted(soak.statuses.items())},
        "finished_checked": len(soak.latencies), "failures": soak.failures[:20], "num_failures": len(soak.failures),
        "preemptions": {k.split('"')[1]: v for k, v in m.items() if k.startswith("paged_preemptions_total")},
        "generation_tokens": sum(v for k, v in m.items() if k.startswith("vllm:generation_tokens_total")),
        "blocks_used_at_end": used, "swap_blocks_used_at_end": swapped,
        "rss_mib": {k: round(v / mib, 1) for k, v in rss.items()}, "rss_growth_after_warmup": round(growth, 4),
        "p99_latency_s": {"first_third": round(p99(first), 3), "last_third": round(p99(last), 3),
                          "by_tenth": windowed_p99(soak.latencies, args.warmup, args.duration, 10)},
        "server_cost_by_tenth": soak.cost,
        "checks": checks, "pass": all(checks.values()),
    }


if __name__ == "__main__":
    sys.exit(main())
