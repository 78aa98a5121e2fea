"""What the link between two namespaces does now: one TCP connection's round trip and throughput.

    measure_link(hosts)   # {"rtt_ms": 0.05, "mbit_s": 9.6}, or {"error": "ConnectionRefusedError: …", "after_s": 0.001}

A fault is only as real as what crosses the link under it, so the benchmark
and the tests measure it rather than trust the ``tc`` / ``nft`` command: this
file, run as a script in host B (``serve``), accepts one connection from
host A (``measure``), echoes ``PINGS`` one-byte messages (the round trip: the
median), then counts what A sends for ``seconds`` (the throughput: bytes
from the first to the last arrival). A cut link shows as the error A's
``connect`` gets and how soon.

Standard library only, and run as a file (``python -I link_probe.py``): it
starts in well under a second in a namespace, with no package to import.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

PORT = 29700  # inside fresh namespaces: nothing else listens there
PINGS = 20
CONNECT_TIMEOUT_S = 3.0  # a silent cut: connect and every read give up after this
SEND_BUFFER = 256 * 1024  # bytes: a small send buffer, so a slow link drains it in well under a second
CHUNK = 64 * 1024


def serve(port: int) -> None:
    """Host B: accept one connection, echo the pings, count the bulk bytes, send back the count."""
    with socket.create_server(("0.0.0.0", port)) as srv:
        print("ready", flush=True)
        srv.settimeout(CONNECT_TIMEOUT_S + 30)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(CONNECT_TIMEOUT_S + 30)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while (b := conn.recv(1)) not in (b"", b"s"):
                conn.sendall(b)
            n, first, last = 0, None, None
            while chunk := conn.recv(CHUNK):
                last = time.perf_counter()
                first, n = first or last, n + len(chunk)
            conn.sendall(json.dumps({"bytes": n, "seconds": (last or 0) - (first or 0)}).encode())


def measure(host: str, port: int, seconds: float) -> dict:
    """Host A: the round trip (ms, median of ``PINGS``) and the throughput (Mbit/s), or the error and when."""
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            rtts = []
            for _ in range(PINGS):
                t = time.perf_counter()
                s.sendall(b"p")
                if s.recv(1) != b"p":
                    raise ConnectionError("the echo server closed the connection")
                rtts.append(time.perf_counter() - t)
            s.sendall(b"s")
            chunk, end = bytes(CHUNK), time.perf_counter() + seconds
            while time.perf_counter() < end:
                s.sendall(chunk)
            s.shutdown(socket.SHUT_WR)
            reply = b"".join(iter(lambda: s.recv(CHUNK), b""))
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "after_s": time.perf_counter() - t0}
    got = json.loads(reply)
    return {"rtt_ms": 1e3 * statistics.median(rtts), "mbit_s": got["bytes"] * 8 / max(got["seconds"], 1e-9) / 1e6}


def measure_link(hosts, seconds: float = 1.0, port: int = PORT) -> dict:
    """Run ``serve`` in host B and ``measure`` in host A of ``hosts`` (a ``netns.TwoHosts``); ``measure``'s dict."""
    me = str(Path(__file__).resolve())
    server = hosts.popen("b", [sys.executable, "-I", me, "serve", str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the link probe did not start in host B: {server.stderr.read().strip()}")
        done = subprocess.run([*hosts.prefix("a"), sys.executable, "-I", me, "measure", hosts.address["b"],
                               str(port), str(seconds)], capture_output=True, text=True, timeout=seconds + 60)
        if done.returncode != 0:
            raise RuntimeError(f"the link probe failed in host A: {done.stderr.strip()}")
        return json.loads(done.stdout)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))))
