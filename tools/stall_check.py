"""How long one hostile request or a crowd of bad connections holds up everyone else: the stall of a
concurrent 1-token request.

Starts ``python -m paged.serve`` (the demo model) from ``--root`` (a checkout: run it once
from a checkout before a change and once after), measures the latency of a plain 1-token
completion when the server is otherwise idle (median of 5), then, for each request of
``CASES``, sends it and at the same time a stream of plain 1-token requests back to back;
the stall is the slowest plain request's latency minus the idle median. A request the
server refuses stalls nobody. Then the connection cases (``CROWDS``): sockets that send
nothing, sockets that send a request head one byte a second, and sockets that one address keeps
alive with a request every 3 s, opened from this machine's network address (the server counts
it per client; for these cases it listens on 0.0.0.0) while plain requests, each on a new
connection, run from loopback (not counted); each says how many of those sockets the server
had closed after ``--hold`` seconds, and the plain requests' stall (a refused one counts as
600 s). ``--fd-limit N`` adds one more: a server whose descriptor limit is N, N + 100 silent
sockets, and what a new client gets and how many log lines the server wrote meanwhile.
Prints one line per case and, with ``--json``, a JSON object; ``--only WORDS`` runs the cases
whose name holds one of the comma-separated words.

    python tools/stall_check.py --root /path/to/checkout [--only tokenize,prompts] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

BASE = {"model": "m", "prompt": "def f(x):", "max_tokens": 4}
CODE = "def add(a, b):\n    return a + b\n\n" * 60  # 1 980 bytes, 840 tokens of the demo model
COMPLETIONS, CHAT, TOKENIZE = "/v1/completions", "/v1/chat/completions", "/tokenize"
CASES = {  # name: (route, body)
    "bad_words 20 000": (COMPLETIONS, {**BASE, "bad_words": [f"w{i}" for i in range(20_000)]}),
    "bad_words 1 024 (the bound)": (COMPLETIONS, {**BASE, "bad_words": [f"w{i}" for i in range(1024)]}),
    "guided_choice 100 000": (COMPLETIONS, {**BASE, "guided_choice": [f"c{i}" for i in range(100_000)]}),
    "guided_choice 1 000 (the bound)": (COMPLETIONS, {**BASE, "guided_choice": [f"c{i}" for i in range(1000)]}),
    "guided_regex a{1000} (the bound)": (COMPLETIONS, {**BASE, "guided_regex": "a{1000}"}),
    "stop 64 x 1 024 chars (the bound)": (COMPLETIONS, {**BASE, "stop": [chr(0x4e00 + i) * 1024 for i in range(64)]}),
    "logit_bias 1 024 (the bound)": (COMPLETIONS, {**BASE, "logit_bias": {str(i): 1.0 for i in range(1024)}}),
    "prompts 20 000 token-id lists": (COMPLETIONS, {**BASE, "prompt": [[5, 6, 7]] * 20_000, "max_tokens": 1}),
    "prompts 256 token-id lists (the bound)": (COMPLETIONS, {**BASE, "prompt": [[5, 6, 7]] * 256, "max_tokens": 1}),
    "response n 64, echo, logprobs 20, 2 KB prompt": (COMPLETIONS, {**BASE, "prompt": CODE, "n": 64, "echo": True,
                                                                   "logprobs": 20, "max_tokens": 16}),
    "response n 13, echo, logprobs 20, 2 KB prompt (the largest allowed)": (
        COMPLETIONS, {**BASE, "prompt": CODE, "n": 13, "echo": True, "logprobs": 20, "max_tokens": 16}),
    "tokenize 3 MB": (TOKENIZE, {"prompt": CODE * 1515}),
    "tokenize 3 MB, return_token_strs": (TOKENIZE, {"prompt": CODE * 1515, "return_token_strs": True}),
    "prompt 1 MiB text (too long)": (COMPLETIONS, {**BASE, "prompt": CODE * 530}),
    "chat message 1 MiB (too long)": (CHAT, {"model": "m", "messages": [{"role": "user", "content": CODE * 530}],
                                             "max_tokens": 4}),
    # bodies at the 4 MiB limit, of many items
    "4 MiB: 1 392 000 token ids, then a string": (COMPLETIONS, {**BASE, "prompt": [5] * 1_392_000 + ["x"]}),
    "4 MiB: 131 000 chat messages of content 5": (CHAT, {"model": "m", "messages": [{"role": "user", "content": 5}]
                                                         * 131_000}),
    "4 MiB: 220 000 image parts": (CHAT, {"model": "m", "messages": [{"role": "user",
                                                                      "content": [{"type": "image"}] * 220_000}]}),
    "4 MiB: 123 000 Responses items (too long)": ("/v1/responses", {"model": "m", "input": [
        {"role": "user", "content": "h"}] * 123_000}),
}
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
CROWDS = {"sockets 2 000 silent": (2000, "silent"), "sockets 200 slowloris": (200, "trickle"),  # name: (count, mode)
          "sockets 1 000 kept alive by one address": (1000, "keep")}
HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain(client: httpx.Client) -> float:
    t0 = time.monotonic()
    r = client.post("/v1/completions", json={**BASE, "max_tokens": 1, "temperature": 0})
    r.raise_for_status()
    return time.monotonic() - t0


def stall(client: httpx.Client, route: str, body: dict, idle: float) -> tuple[int, float, float]:
    """``(status of the hostile request, its answer time, worst extra latency of plain requests)``."""
    done, worst, result = threading.Event(), [0.0], {}

    def hostile():
        t0 = time.monotonic()
        try:
            with httpx.Client(base_url=str(client.base_url), timeout=600) as c:
                result["status"] = c.post(route, json=body).status_code
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


def closed(sock: socket.socket) -> bool:
    """Has the server closed ``sock`` (an answer or an end of stream is waiting, or the socket is reset)?"""
    sock.setblocking(False)
    try:
        return sock.recv(65536, socket.MSG_PEEK) is not None
    except BlockingIOError:
        return False
    except OSError:
        return True


def served(sock: socket.socket) -> bool:
    """Does the server still answer on ``sock`` (a kept-alive socket; its earlier answers are drained first)?"""
    try:
        sock.setblocking(False)
        while sock.recv(65536):
            pass
    except BlockingIOError:
        pass
    except OSError:
        return False
    try:
        sock.settimeout(5)
        sock.send(HEALTH)
        return sock.recv(65536).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def machine_address() -> str | None:
    """This machine's IPv4 address on the interface its traffic leaves by (not loopback), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # a documentation address: a UDP connect sends nothing
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def crowd(client: httpx.Client, target: tuple[str, int], count: int, mode: str, hold: float, idle: float) -> dict:
    """Open ``count`` sockets to ``target`` (this machine's network address: the server counts them as
    another machine's, while the plain requests come from loopback) that send nothing (``mode`` "silent"), a
    request head a byte a second ("trickle"), or a ``GET /health`` every 3 s, so they stay open ("keep"),
    while plain requests, each on a new connection, run back to back for ``hold`` seconds; how many the server
    closed, and the plain requests' stall (a refused one counts as 600 s)."""
    socks, worst, t0 = [], 0.0, time.monotonic()
    for _ in range(count):
        try:
            socks.append(socket.create_connection(target, timeout=5))
        except OSError:
            break
    opened, sent, asked = len(socks), 0, 0.0
    while time.monotonic() - t0 < hold:
        if mode == "trickle" and sent < len(HEAD):
            for s in socks:
                try:
                    s.send(HEAD[sent:sent + 1])
                except OSError:
                    pass
            sent += 1
        if mode == "keep" and time.monotonic() - asked > 3.0:
            asked = time.monotonic()
            for s in socks:
                try:
                    s.setblocking(False)
                    while s.recv(65536):  # the last answer (or the refusal), drained
                        pass
                except (BlockingIOError, OSError):
                    pass
                try:
                    s.send(HEALTH)
                except OSError:
                    pass
        t1 = time.monotonic()
        try:
            with httpx.Client(base_url=client.base_url, timeout=client.timeout) as new_client:  # a new connection
                worst = max(worst, plain(new_client))
        except httpx.HTTPError:
            worst = max(worst, time.monotonic() - t1 + 600)  # counted as a failure: far past any stall
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t1)))
    shut = sum(not served(s) for s in socks) if mode == "keep" else sum(closed(s) for s in socks)
    for s in socks:
        s.close()
    return {"opened": opened, "closed": shut, "hold_s": hold, "stall_s": round(max(0.0, worst - idle), 3)}


def start(root: str, port: int, log, fd_limit: int | None = None, host: str = "127.0.0.1") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": root}
    model = str(Path(root) / "paged" / "demo" / "model")

    def limit():
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    proc = subprocess.Popen([sys.executable, "-m", "paged.serve", "--model", model, "--served-model-name", "m",
                             "--port", str(port), "--dtype", "float32", "--device", "cpu", "--num-blocks", "200",
                             "--block-size", "8", "--host", host], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=limit)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the server did not start")
        time.sleep(0.5)


def fd_limit_case(root: str, fd_limit: int, hold: float) -> dict:
    """A server limited to ``fd_limit`` descriptors, ``fd_limit + 100`` silent sockets: what a new client gets
    while they are open, and the log lines the server wrote in ``hold`` seconds."""
    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"stall_check_{port}.log"
    with open(log_path, "w+") as log:
        proc = start(root, port, log, fd_limit)
        try:
            before = log_path.read_text().count("\n")
            socks = []
            for _ in range(fd_limit + 100):
                try:
                    socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                except OSError:
                    break
            time.sleep(1.0)
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={**BASE, "max_tokens": 1}, timeout=10)
                answer = f"{r.status_code} {r.text[:80]!r}"
            except httpx.HTTPError as e:
                answer = type(e).__name__
            time.sleep(max(0.0, hold - 1.0))
            text = log_path.read_text()
            lines = text.count("\n") - before
            for s in socks:
                s.close()
            return {"opened": len(socks), "new_client": answer, "log_lines": lines,
                    "log_bytes": len(text.encode()), "hold_s": hold}
        finally:
            proc.terminate()
            proc.wait(30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--only", default="", help="comma-separated words: run the cases whose name holds one")
    p.add_argument("--hold", type=float, default=20.0, help="seconds the connection cases keep their sockets")
    p.add_argument("--fd-limit", type=int, help="also run the descriptor-limit case with this limit")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    words = [w for w in args.only.split(",") if w]

    def wanted(name: str) -> bool:
        return not words or any(w in name for w in words)

    port = free_port()
    out = {}
    with open(os.devnull, "w") as null:
        # the connection crowds come from this machine's network address, which the server counts per
        # client, and the plain requests from loopback, which it does not: so it listens on both
        address = machine_address() if any(wanted(n) for n in CROWDS) else None
        proc = start(args.root, port, null, host="127.0.0.1" if address is None else "0.0.0.0")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            plain(client)
            idle = statistics.median(plain(client) for _ in range(5))
            print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, root {args.root}, "
                  f"idle 1-token request {idle * 1000:.0f} ms, load average {os.getloadavg()[0]:.2f}")
            for name, (route, body) in CASES.items():
                if not wanted(name):
                    continue
                alive = proc.poll() is None
                status, took, extra = stall(client, route, body, idle) if alive else ("server gone", 0.0, 0.0)
                out[name] = {"status": status, "answer_s": round(took, 3), "stall_s": round(extra, 3)}
                print(f"{name:58s} status {status!s:5s} answered in {took:7.2f} s; "
                      f"a concurrent 1-token request stalled {extra:7.2f} s")
            for name, (count, mode) in CROWDS.items():
                if wanted(name):
                    if address is None:
                        print(f"{name:58s} skipped: this machine has no network address besides loopback")
                        continue
                    out[name] = r = crowd(client, (address, port), count, mode, args.hold, idle)
                    print(f"{name:58s} {r['closed']} of {r['opened']} closed after {args.hold:.0f} s; "
                          f"a concurrent 1-token request stalled {r['stall_s']:7.2f} s")
    finally:
        proc.terminate()
        proc.wait(30)
    if args.fd_limit and wanted("fd limit"):
        out["fd limit"] = r = fd_limit_case(args.root, args.fd_limit, 15.0)
        print(f"{'fd limit ' + str(args.fd_limit):58s} {r['opened']} sockets open; a new client got {r['new_client']}; "
              f"the log grew by {r['log_lines']} lines in {r['hold_s']:.0f} s")
    if args.json:
        print(json.dumps({"idle_s": round(idle, 3), "cases": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
