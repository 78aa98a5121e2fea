"""What a SIGTERM does to the requests in flight: how each ends, what a new client gets, how the process exits.

Starts ``python -m paged.serve`` (the demo model) from ``--root`` (a checkout: run it once before a
change and once after; ``--server-args`` adds options, e.g. ``--shutdown-timeout 3``), sends three
requests — a long stream, a long non-streamed request (both ``--long`` tokens, longer than the
shutdown allows) and a short one (``--short`` tokens) — and once all three run, sends the server
SIGTERM. Half a second later a new request arrives. It prints how each request ended, what the new
one got, the exit status and how long the process took to exit; ``--json`` adds a JSON object.

    python tools/stop_check.py --root /path/to/checkout [--server-args "--shutdown-timeout 3"] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def body(tokens: int, stream: bool) -> dict:
    return {"model": "m", "prompt": "def f(x):", "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream": stream}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--server-args", default="")
    p.add_argument("--long", type=int, default=1000, help="tokens of the two long requests")
    p.add_argument("--short", type=int, default=40, help="tokens of the short request")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    port, url = free_port(), None
    model = str(Path(args.root) / "paged" / "demo" / "model")
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"stop_check_{port}.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "paged.serve", "--model", model, "--served-model-name", "m",
                             "--port", str(port), "--dtype", "float32", "--device", "cpu",
                             *shlex.split(args.server_args)], cwd=args.root,
                            env={**os.environ, "PYTHONPATH": args.root}, stdout=log, stderr=subprocess.STDOUT)
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
    out: dict = {}
    started = threading.Event()

    def stream():
        events, last, before = 0, None, None
        try:
            with httpx.stream("POST", url + "/v1/completions", json=body(args.long, True), timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events += 1
                        before, last = last, line[6:]
                        started.set()
            out["long stream"] = f"{r.status_code}, {events} events, the last two: {(before or '')[:160]} | {last}"
        except httpx.HTTPError as e:
            out["long stream"] = f"{type(e).__name__} after {events} events, the last: {(last or '')[:100]}"

    def plain(name: str, tokens: int):
        try:
            r = httpx.post(url + "/v1/completions", json=body(tokens, False), timeout=120)
            text = r.json()["choices"][0]["finish_reason"] if r.status_code == 200 else r.text[:160]
            out[name] = f"{r.status_code} {r.headers.get('content-type', '')}: {text}"
        except httpx.HTTPError as e:
            out[name] = type(e).__name__

    threads = [threading.Thread(target=stream), threading.Thread(target=plain, args=("long", args.long)),
               threading.Thread(target=plain, args=("short", args.short))]
    for t in threads:
        t.start()
    started.wait(60)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    try:
        r = httpx.post(url + "/v1/completions", json=body(4, False), timeout=10)
        out["new request"] = f"{r.status_code}, Retry-After {r.headers.get('retry-after')}: {r.text[:120]}"
    except httpx.HTTPError as e:
        out["new request"] = type(e).__name__
    code = proc.wait(120)
    out["exit"] = f"status {code} after {time.monotonic() - t0:.1f} s"
    for t in threads:
        t.join(60)
    proc.wait()
    log.close()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, root {args.root}, server args "
          f"{args.server_args!r}, load average {os.getloadavg()[0]:.2f}")
    for name in ("short", "long", "long stream", "new request", "exit"):
        print(f"{name:12s} {out.get(name)}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
