"""How long one hostile request holds up everyone else: the stall of a concurrent 1-token request.

Starts ``python -m paged.serve`` (the demo model) from ``--root`` (a checkout: run it once
from a checkout before a change and once after), measures the latency of a plain 1-token
completion when the server is otherwise idle (median of 5), then, for each request of
``CASES``, sends it and at the same time a stream of plain 1-token requests back to back;
the stall is the slowest plain request's latency minus the idle median. A request the
server refuses stalls nobody. Prints one line per case and, with ``--json``, a JSON object.

    python tools/stall_check.py --root /path/to/checkout [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

BASE = {"model": "m", "prompt": "def f(x):", "max_tokens": 4}
CASES = {
    "bad_words 20 000": {**BASE, "bad_words": [f"w{i}" for i in range(20_000)]},
    "bad_words 1 024 (the bound)": {**BASE, "bad_words": [f"w{i}" for i in range(1024)]},
    "guided_choice 100 000": {**BASE, "guided_choice": [f"c{i}" for i in range(100_000)]},
    "guided_choice 1 000 (the bound)": {**BASE, "guided_choice": [f"c{i}" for i in range(1000)]},
    "guided_regex a{1000} (the bound)": {**BASE, "guided_regex": "a{1000}"},
    "stop 64 x 1 024 chars (the bound)": {**BASE, "stop": [chr(0x4e00 + i) * 1024 for i in range(64)]},
    "logit_bias 1 024 (the bound)": {**BASE, "logit_bias": {str(i): 1.0 for i in range(1024)}},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain(client: httpx.Client) -> float:
    t0 = time.monotonic()
    r = client.post("/v1/completions", json={**BASE, "max_tokens": 1, "temperature": 0})
    r.raise_for_status()
    return time.monotonic() - t0


def stall(client: httpx.Client, body: dict, idle: float) -> tuple[int, float, float]:
    """``(status of the hostile request, its answer time, worst extra latency of plain requests)``."""
    done, worst, result = threading.Event(), [0.0], {}

    def hostile():
        t0 = time.monotonic()
        try:
            with httpx.Client(base_url=str(client.base_url), timeout=600) as c:
                result["status"] = c.post("/v1/completions", json=body).status_code
        except httpx.HTTPError as e:
            result["status"] = type(e).__name__
        result["took"] = time.monotonic() - t0
        done.set()

    thread = threading.Thread(target=hostile)
    thread.start()
    while not done.is_set():
        worst[0] = max(worst[0], plain(client))
    thread.join()
    worst[0] = max(worst[0], plain(client))
    return result["status"], result["took"], max(0.0, worst[0] - idle)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": args.root}
    model = str(Path(args.root) / "paged" / "demo" / "model")
    proc = subprocess.Popen([sys.executable, "-m", "paged.serve", "--model", model, "--served-model-name", "m",
                             "--port", str(port), "--dtype", "float32", "--device", "cpu", "--num-blocks", "200",
                             "--block-size", "8"], cwd=args.root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        out = {}
        with httpx.Client(base_url=url, timeout=600) as client:
            plain(client)
            idle = statistics.median(plain(client) for _ in range(5))
            print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, root {args.root}, "
                  f"idle 1-token request {idle * 1000:.0f} ms")
            for name, body in CASES.items():
                alive = proc.poll() is None
                status, took, extra = stall(client, body, idle) if alive else ("server gone", 0.0, 0.0)
                out[name] = {"status": status, "answer_s": round(took, 3), "stall_s": round(extra, 3)}
                print(f"{name:36s} status {status!s:5s} answered in {took:7.2f} s; "
                      f"a concurrent 1-token request stalled {extra:7.2f} s")
        if args.json:
            print(json.dumps({"idle_s": round(idle, 3), "cases": out}))
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
