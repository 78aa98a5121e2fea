"""Check the live KV page in headless Chromium while a scripted load runs; save a screenshot.

    python tools/kv_view_check.py --screenshot docs/figures/serving_kv_view.png
    python tools/kv_view_check.py --throughput      # also: paged.bench serve with and without the page

What it does:

1. starts ``python -m paged.serve`` (demo model, float32, CPU) on a free
   loopback port with an API key and a small KV pool (so requests preempt);
2. sends a scripted load from threads: streaming completions, some with
   ``n = 2`` (forked sequences share their prompt blocks);
3. opens ``/kv#key=...`` in headless Chromium (Debian package ``chromium``)
   driven over the DevTools protocol, and waits until the page draws cells
   owned by live requests;
4. fails (exit 1) on any console error or uncaught exception, if no cell is
   owned by a live request, or if a drawn owner is not a request the page
   lists in its queues; saves the screenshot.

With ``--throughput`` it then runs ``python -m paged.bench serve`` against a
second server (no API key: the benchmark sends none) in rounds of three:
without the page, with a poller reading ``/kv/snapshot`` as an open page does
(the server's cost of a page opened elsewhere), and with the page open in
Chromium on this machine (the browser competes for the same cores). It prints
request throughput and the server's CPU seconds per request of each run, and
the medians. With ``--cost`` it times one snapshot and its JSON in an engine
like the check's server and in one with paged's default pool sizes (CPU time,
so it does not depend on what else the machine runs). Everything listens on
127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import websocket

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "kv-view-check"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--window-size=1400,1000"]
# in the page: the owners drawn on cells, and the requests listed in the queues
READ_PAGE = """JSON.stringify({
  owners: [...document.querySelectorAll('.cell[data-owner]')].map(c => c.dataset.owner),
  listed: [...document.querySelectorAll('.chip')].map(c => c.dataset.request),
  shared: document.querySelectorAll('.cell.shared').length,
  host: document.querySelectorAll('.cell[data-pool="host"][data-owner]').length,
  events: document.getElementById('events').textContent.split('\\n').filter(Boolean).length,
  status: document.getElementById('status').textContent})"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, api_key: str | None, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "paged.serve", "--model", str(ROOT / "paged" / "demo" / "model"),
           "--served-model-name", "paged-demo", "--port", str(port), "--dtype", "float32", "--device", "cpu",
           "--block-size", "8", "--num-blocks", "96", "--swap-space", "1MiB", "--preemption-mode", "swap",
           "--max-num-seqs", "32", "--seed", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PAGED_API_KEY", None)
    if api_key:
        env["PAGED_API_KEY"] = api_key
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the server was not healthy within 180 s; see {log.name}")


def scripted_load(url: str, seconds: float, stop: threading.Event) -> threading.Thread:
    """Threads sending streaming completions (every third with n = 2) until ``seconds`` pass or ``stop``."""
    def worker(i: int) -> None:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        end = time.monotonic() + seconds
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            k = 0
            while time.monotonic() < end and not stop.is_set():
                body = {"model": "paged-demo", "prompt": f"def f{i}_{k}(x):\n    return", "max_tokens": 48 + 8 * i,
                        "temperature": 0.8, "ignore_eos": True, "stream": True, "n": 2 if i % 3 == 0 else 1}
                with client.stream("POST", "/v1/completions", json=body) as resp:
                    for _ in resp.iter_lines():
                        pass
                k += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(12)]
    for t in threads:
        t.start()
    return threads


class Browser:
    """One headless Chromium tab over the DevTools protocol: navigate, evaluate, screenshot, errors."""

    def __init__(self, chromium: str, url: str = "about:blank") -> None:
        self.profile = tempfile.mkdtemp(prefix="kv-view-chromium-")
        self.proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, "--remote-debugging-address=127.0.0.1",
                                      "--remote-debugging-port=0", f"--user-data-dir={self.profile}", url],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        tabs = httpx.get(f"http://127.0.0.1:{port}/json", timeout=10).json()
        tab = next(t for t in tabs if t["type"] == "page")
        self.ws = websocket.create_connection(tab["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.next_id = 0
        self.errors: list[str] = []
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._note(msg)

    def _note(self, msg: dict) -> None:
        """Keep every console error, uncaught exception and error log entry the page produces."""
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(p["exceptionDetails"].get("exception", {}).get("description")
                               or p["exceptionDetails"].get("text"))
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            self.errors.append(f"{p['entry'].get('source')}: {p['entry'].get('text')} {p['entry'].get('url', '')}")

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.profile, ignore_errors=True)


def check_page(chromium: str, url: str, screenshot: Path | None, timeout_s: float = 90) -> dict:
    """Open the page while the load runs; the page's reading once it shows live requests."""
    browser = Browser(chromium)
    try:
        browser.call("Page.navigate", url=f"{url}/kv#key={API_KEY}")
        start = time.monotonic()
        while time.monotonic() < start + timeout_s:
            seen = json.loads(browser.evaluate(READ_PAGE) or "{}")
            busy = len(set(seen.get("owners", []))) >= 3 and seen.get("events", 0) >= 10
            # for the picture, wait a while for a moment with a group in the host pool too
            if busy and (seen["host"] > 0 or time.monotonic() > start + timeout_s / 2):
                break
            time.sleep(0.25)
        # pick a request, for its block table: a swapped one if any, else the newest running one
        browser.evaluate("(document.querySelector('.queue:nth-child(3) .chip') || "
                         "[...document.querySelectorAll('.queue:nth-child(2) .chip')].pop())?.click()")
        time.sleep(0.5)  # a few more polls, then read once more for the verdict
        seen = json.loads(browser.evaluate(READ_PAGE))
        if screenshot is not None:
            browser.screenshot(screenshot)
        browser.evaluate("0")  # collect the events that arrived meanwhile
        seen["errors"] = browser.errors
        return seen
    finally:
        browser.close()


def verdict(seen: dict) -> list[str]:
    """What is wrong with the page's reading (empty: it passed)."""
    problems = [f"console error: {e}" for e in seen["errors"]]
    if not seen["owners"]:
        problems.append("no cell is owned by a live request")
    strangers = set(seen["owners"]) - set(seen["listed"])
    if strangers:
        problems.append(f"cells owned by requests the queues do not list: {sorted(strangers)[:5]}")
    return problems


def bench(url: str, num_requests: int) -> float:
    """Request throughput (req/s) of one ``python -m paged.bench serve`` run against ``url``."""
    out = subprocess.run([sys.executable, "-m", "paged.bench", "serve", "--base-url", url,
                          "--num-requests", str(num_requests),
                          "--request-rate", "inf", "--max-concurrency", "16", "--no-progress", "--json"],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout.strip().splitlines()[-1])["request_throughput"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Poller:
    """What an open page costs the server, without a browser on this machine: GET /kv/snapshot 4 times a second."""

    def __init__(self, url: str) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self.thread.start()

    def _run(self, url: str) -> None:
        since = 0
        with httpx.Client(base_url=url, timeout=30) as client:
            while not self.stop.wait(0.25):
                since = client.get(f"/kv/snapshot?since={since}").json()["last_event"]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


def throughput(chromium: str, rounds: int, num_requests: int) -> dict:
    """``paged.bench serve`` without the page, with a poller reading /kv/snapshot as the page does, and with
    the page open in Chromium on this machine; rounds alternate the three.

    Per run: request throughput (wall clock: noisy on a shared machine) and the server's CPU seconds per
    request (what the server spent, whatever else runs). Reported: each arm's median and the medians of
    the per-round ratios to "without".
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    arms = {"without": lambda: None, "poll": lambda: Poller(url), "chromium": lambda: Browser(chromium, url + "/kv")}
    runs = {arm: {"req_per_s": [], "cpu_s_per_req": []} for arm in arms}
    with open(Path(tempfile.gettempdir()) / f"kv_view_bench_{port}.log", "w") as log:
        server = start_server(port, None, log)
        try:
            bench(url, num_requests)  # warm-up
            for _ in range(rounds):
                for arm, open_page in arms.items():
                    watcher = open_page()
                    time.sleep(2 if watcher else 0)
                    cpu = cpu_seconds(server.pid)
                    runs[arm]["req_per_s"].append(bench(url, num_requests))
                    runs[arm]["cpu_s_per_req"].append((cpu_seconds(server.pid) - cpu) / num_requests)
                    if watcher:
                        watcher.close()
        finally:
            server.terminate()
            server.wait(30)
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    ratios = {arm: {key: median([x / y for x, y in zip(runs[arm][key], runs["without"][key])]) for key in runs[arm]}
              for arm in ("poll", "chromium")}
    return {"runs": runs, "median": {arm: {k: median(v) for k, v in r.items()} for arm, r in runs.items()},
            "median_ratio_to_without": ratios}


def snapshot_cost(num_blocks: int, swap_space: int, rounds: int = 200) -> dict:
    """CPU milliseconds of one snapshot and of its JSON, in an engine like the server's with 16 requests
    (some with ``n = 2``) after 40 iterations; and what 4 snapshots a second cost, in % of one core."""
    from paged import LLM
    from paged.serve.kv_view import DEFAULT_MAX_PER_SECOND
    from paged.step05_preemption import SamplingParams

    engine = LLM(model=str(ROOT / "paged" / "demo" / "model"), dtype="float32", device="cpu", block_size=8, num_blocks=num_blocks, swap_space=swap_space,
                 preemption_mode="swap", seed=0).engine
    for i in range(16):
        engine.add_request(f"cmpl-{i:032x}-0", list(range(3, 40 + i)), SamplingParams(
            n=2 if i % 3 == 0 else 1, temperature=0.8, max_tokens=100, ignore_eos=True))
    for _ in range(40):
        engine.step()
    start = time.process_time()
    for _ in range(rounds):
        snap = engine.kv_snapshot()
    mid = time.process_time()
    for _ in range(rounds):
        body = json.dumps(snap)
    snap_ms, json_ms = (mid - start) / rounds * 1e3, (time.process_time() - mid) / rounds * 1e3
    return {"device_blocks": num_blocks, "host_blocks": engine.swap.allocator.num_blocks,
            "running": len(engine.running), "swapped": len(engine.swapped), "snapshot_ms": snap_ms,
            "json_ms": json_ms, "json_bytes": len(body),
            "percent_of_one_core": (snap_ms + json_ms) * DEFAULT_MAX_PER_SECOND / 10}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--screenshot", type=Path, help="save the page here (PNG)")
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"),
                   help="the Chromium binary (Debian: apt-get install chromium)")
    p.add_argument("--throughput", action="store_true", help="also time paged.bench serve with and without the page")
    p.add_argument("--rounds", type=int, default=3, help="--throughput: rounds of (without, poll, chromium)")
    p.add_argument("--num-requests", type=int, default=100, help="--throughput: requests per benchmark run")
    p.add_argument("--cost", action="store_true", help="also time one snapshot and its JSON (small and default pools)")
    args = p.parse_args(argv)
    if not args.chromium:
        print("kv_view_check: chromium not found: apt-get install -y chromium (or pass --chromium)", file=sys.stderr)
        return 2
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    with open(Path(tempfile.gettempdir()) / f"kv_view_check_{port}.log", "w") as log:
        server = start_server(port, API_KEY, log)
        try:
            scripted_load(url, seconds=120, stop=stop)
            seen = check_page(args.chromium, url, args.screenshot)
        finally:
            stop.set()
            server.terminate()
            server.wait(30)
    problems = verdict(seen)
    print(json.dumps({"owners_drawn": len(seen["owners"]), "requests_drawn": len(set(seen["owners"])),
                      "host_cells_owned": seen["host"],
                      "requests_listed": len(seen["listed"]), "shared_cells": seen["shared"],
                      "event_lines": seen["events"], "status": seen["status"], "problems": problems}))
    if args.screenshot:
        print(f"screenshot: {args.screenshot}")
    if problems:
        return 1
    if args.throughput:
        print(json.dumps(throughput(args.chromium, args.rounds, args.num_requests)))
    if args.cost:
        for num_blocks, swap_space in ((96, 2**20), (2048, 256 * 2**20)):  # the check's server; paged's defaults
            print(json.dumps(snapshot_cost(num_blocks, swap_space)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
