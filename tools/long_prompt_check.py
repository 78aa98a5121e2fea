"""A long prompt against a short request on a live server: the long one's time to first token, and how
long the short one, sent a second later, waits for its answer.

Starts ``python -m paged.serve`` at its defaults (the default chat model, bfloat16, prefix caching on,
batch-invariant mode on) plus ``--server-args``, sends one prompt of ``--tokens`` random token ids with
``max_tokens=1`` (so its answer time is its time to first token), and ``--after`` seconds later a
3-token prompt with ``max_tokens=1``; prints both latencies (one JSON line with ``--json``). A second
run of the long prompt follows (the prefix cache's hit). The prompts are drawn from ``--seed`` over
the model's vocabulary, BOS first, as ``paged.bench engine`` draws them.

    python tools/long_prompt_check.py [--tokens 8000] [--after 1.0] [--server-args "--long-prefill-token-threshold 256"]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(client: httpx.Client, prompt: list[int], out: dict, key: str, start: float) -> None:
    t0 = time.monotonic()
    r = client.post("/v1/completions", json={"model": served(client), "prompt": prompt, "max_tokens": 1,
                                             "temperature": 0}, timeout=600)
    out[key] = {"status": r.status_code, "seconds": round(time.monotonic() - t0, 3),
                "sent_at": round(t0 - start, 3)}


_served: dict = {}


def served(client: httpx.Client) -> str:
    if "id" not in _served:
        _served["id"] = client.get("/v1/models").json()["data"][0]["id"]
    return _served["id"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--after", type=float, default=1.0, help="seconds between the long and the short request")
    ap.add_argument("--server-args", default="", help="more options of python -m paged.serve")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    port = free_port()
    cmd = [sys.executable, "-m", "paged.serve", "--port", str(port), *shlex.split(args.server_args)]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        for _ in range(600):
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"the server exited: {server.stderr.read()[-2000:]}")
            time.sleep(0.5)
        rng = random.Random(args.seed)
        high = 49152  # SmolLM2's vocabulary; ids stay below any default model's
        long_prompt = [1] + [rng.randrange(3, high) for _ in range(args.tokens - 1)]
        complete(client, [1, 5, 6], {}, "warm", time.monotonic())  # kernels loaded, first request served
        out: dict = {}
        start = time.monotonic()
        long = threading.Thread(target=complete, args=(client, long_prompt, out, "long", start))
        long.start()
        time.sleep(args.after)
        complete(client, [1, 7, 8], out, "short", start)
        long.join()
        complete(client, long_prompt, out, "long_again", time.monotonic())
        report = {"tokens": args.tokens, "after_s": args.after, "server_args": args.server_args, **out}
        if args.json:
            print(json.dumps(report))
        else:
            print(f"long prompt ({args.tokens} tokens): first token after {out['long']['seconds']} s "
                  f"(status {out['long']['status']})")
            print(f"short request sent {out['short']['sent_at']} s later: answered in {out['short']['seconds']} s")
            print(f"the long prompt again (a prefix-cache hit): {out['long_again']['seconds']} s")
        return 0
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


if __name__ == "__main__":
    raise SystemExit(main())
