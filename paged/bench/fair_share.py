"""Fair share under a hog: how long one client's one-token request waits while another client floods the server.

For each ``--scheduling-policy`` given, a ``python -m paged.serve`` on this
machine (the demo model unless ``--model``); one client, from 127.0.0.9, sends
``--hog-requests`` completions of ``--hog-tokens`` tokens at once (``ignore_eos``),
which fill the KV cache and get preempted; another, from 127.0.0.1, asks for
one token every ``--interval`` seconds until the hog is done. Both addresses are
this machine's (Linux routes all of 127.0.0.0/8 to loopback), so the server sees
two clients.

Reported per policy: the newcomer's waits (count, median, worst, in seconds,
timed on the client from sending to the whole answer), and the hog's time and
output tokens/s. ``fcfs`` is the paper's order; ``fair`` (the server's default)
ranks the clients by how many requests each has running; under ``priority`` the
newcomer's asks carry ``priority`` -1, the hog's requests the default 0.

Example:
    python -m paged.bench fair_share --policies fcfs fair priority
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

HOG_ADDRESS, NEWCOMER_ADDRESS = "127.0.0.9", "127.0.0.1"
STARTUP_S = 300


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", nargs="+", choices=["fcfs", "fair", "priority"], default=["fcfs", "fair"])
    p.add_argument("--model", help="the served model (default: the demo model)")
    p.add_argument("--hog-requests", type=int, default=200, help="the hog's requests, sent at once (default 200)")
    p.add_argument("--hog-tokens", type=int, default=1000, help="tokens each of them generates (default 1000)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between the newcomer's asks (default 2)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for python -m paged.serve (repeat it)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object last")


def _free_port() -> int:
    """A port free on every address, as the server will listen (one free on 127.0.0.1 alone may still be held
    on 127.0.0.9 by a connection of the flood before)."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def start_server(policy: str, model: str | None, extra: list[str], log) -> tuple[subprocess.Popen, str]:
    """A server with ``policy`` on a free port of 0.0.0.0 (both addresses reach it); waits until healthy."""
    from paged.models.default import DEFAULT_MODEL_PATH

    port = _free_port()
    cmd = [sys.executable, "-m", "paged.serve", "--model", model or str(DEFAULT_MODEL_PATH), "--host", "0.0.0.0",
           "--port", str(port), "--served-model-name", "m", "--scheduling-policy", policy, "--seed", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} (its log: {log.name})")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the server was not healthy after {STARTUP_S} s (its log: {log.name})")


async def hogged(url: str, hog_requests: int, hog_tokens: int, interval: float, priority: int = 0) -> dict:
    """The hog's requests at once, the newcomer's asks (of ``priority``) beside them: the figures of one policy."""
    hog_body = {"model": "m", "prompt": "def f(x):", "max_tokens": hog_tokens, "ignore_eos": True, "temperature": 0}
    limits = httpx.Limits(max_connections=hog_requests + 5)
    hog_transport = httpx.AsyncHTTPTransport(local_address=HOG_ADDRESS, limits=limits)
    newcomer_transport = httpx.AsyncHTTPTransport(local_address=NEWCOMER_ADDRESS)
    async with httpx.AsyncClient(transport=hog_transport, timeout=3600) as hog, \
            httpx.AsyncClient(transport=newcomer_transport, timeout=3600) as newcomer:
        started = time.perf_counter()
        tasks = [asyncio.create_task(hog.post(url + "/v1/completions", json=hog_body)) for _ in range(hog_requests)]
        waits = []
        while not all(t.done() for t in tasks):
            await asyncio.sleep(interval)
            sent = time.perf_counter()
            r = await newcomer.post(url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1,
                                                                   "priority": priority})
            r.raise_for_status()
            waits.append(time.perf_counter() - sent)
        answers = await asyncio.gather(*tasks)
        hog_s = time.perf_counter() - started
    tokens = sum(a.json()["usage"]["completion_tokens"] for a in answers if a.status_code == 200)
    return {"newcomer_asks": len(waits), "newcomer_median_s": statistics.median(waits) if waits else None,
            "newcomer_worst_s": max(waits, default=None), "hog_s": hog_s, "hog_tokens_per_s": tokens / hog_s,
            "hog_ok": sum(a.status_code == 200 for a in answers)}


def run(args: argparse.Namespace) -> int:
    results = {}
    for policy in args.policies:
        with tempfile.NamedTemporaryFile("w+", prefix=f"paged_fair_{policy}_", suffix=".log", delete=False) as log:
            proc, url = start_server(policy, args.model, args.server_arg, log)
            try:
                priority = -1 if policy == "priority" else 0
                results[policy] = asyncio.run(hogged(url, args.hog_requests, args.hog_tokens, args.interval, priority))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        os.unlink(log.name)
        r = results[policy]
        waits = (f"median {r['newcomer_median_s']:.2f} s, worst {r['newcomer_worst_s']:.2f} s"
                 if r["newcomer_asks"] else "none (the hog was done first)")
        print(f"{policy:8s}  newcomer: {r['newcomer_asks']} asks, {waits}  |  hog: {r['hog_ok']}/{args.hog_requests} "
              f"answered in {r['hog_s']:.1f} s, {r['hog_tokens_per_s']:.0f} output tokens/s", flush=True)
    if args.json:
        print(json.dumps(results))
    return 0
