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
   owned by a live request, if a drawn owner is not a request the page lists
   in its queues, or if a canvas pixel disagrees with its cell's data (the
   centre of every free cell, and only of those, is the free grey); saves the
   screenshot.

With ``--throughput`` it then runs ``python -m paged.bench serve`` against a
second server (no API key: the benchmark sends none) in rounds of three:
without the page, with a poller reading ``/kv/snapshot`` as an open page does
(the server's cost of a page opened elsewhere), and with the page open in
Chromium on this machine (the browser competes for the same cores); the order
rotates from round to round. Per run it prints (to stderr) request throughput,
the server's and the watcher's CPU milliseconds per request, the engine
thread's share spent on snapshots and the load average; at the end the medians
and the median, lowest and highest per-round ratio to "without". With
``--cost`` it times one snapshot and its JSON in an engine like the check's
server and in one with paged's default pool sizes (CPU time, so it does not
depend on what else the machine runs). Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import websocket

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: paged is importable
from paged.serve.kv_view import WATCH_TIMEOUT_S  # noqa: E402 (after the sys.path line above)

API_KEY = "kv-view-check"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--window-size=1400,1000"]
# in the page: what each canvas cell shows (and whether its pixel agrees), and the requests listed in the queues
READ_PAGE = """JSON.stringify((() => {
  const out = {owners: [], shared: 0, host: 0, cells: 0, unlike: [],
               listed: [...document.querySelectorAll('.chip')].map(c => c.dataset.request),
               events: [...document.getElementById('events').children].reduce((t, b) => t + Number(b.dataset.lines), 0),
               status: document.getElementById('status').textContent};
  for (const [name, g] of Object.entries(window.kvPage ? kvPage.grids : {})) {
    const ctx = g.canvas.getContext('2d');
    g.drawn.forEach((d, c) => {
      out.cells++;
      if (d.owner) { out.owners.push(d.owner); if (name === 'host') out.host++; }
      if (d.shared) out.shared++;
      const [x, y] = kvPage.cellXY(g, c);
      const px = ctx.getImageData(Math.round((x + 7) * g.dpr), Math.round((y + 7) * g.dpr), 1, 1).data;
      const grey = px[0] === 0xe8 && px[1] === 0xe8 && px[2] === 0xe8 && px[3] === 255;
      if (grey !== (d.kind === 'free')) out.unlike.push(`${name} ${c} ${d.kind}`);
    });
  }
  return out;
})())"""


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
    env.pop("PAGED_KV_VIEW_KEY", None)
    if api_key:  # the page's data needs the operator's key; this check is both client and operator
        env["PAGED_API_KEY"] = env["PAGED_KV_VIEW_KEY"] = api_key
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
        time.sleep(0.2)  # the next frame draws its table and outlines its blocks
        if screenshot is not None:
            browser.screenshot(screenshot)
        time.sleep(0.5)  # a few more polls, then read once more for the verdict
        seen = json.loads(browser.evaluate(READ_PAGE))
        browser.evaluate("0")  # collect the events that arrived meanwhile
        seen["errors"] = browser.errors
        return seen
    finally:
        browser.close()


def verdict(seen: dict) -> list[str]:
    """What is wrong with the page's reading (empty: it passed)."""
    problems = [f"console error: {e}" for e in seen["errors"]]
    if seen["unlike"]:
        problems.append(f"canvas pixels disagree with the cells' data (free grey or not): {seen['unlike'][:5]}")
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


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid`` and every live process below it (Chromium's renderer, GPU, network...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
        except OSError:
            continue
        todo.extend(children.get(p, []))
    return total


class Poller:
    """What an open page costs the server, without a browser on this machine: reads ``/kv/snapshot`` as the
    page does (``since`` its last event, ``have`` its snapshot, again after the answer's ``poll_ms``)."""

    def __init__(self, url: str) -> None:
        self.stop = threading.Event()
        self.reads, self._cpu = 0, 0.0
        self.thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self.thread.start()

    def _run(self, url: str) -> None:
        since, have, wait = 0, 0, 0.0
        with httpx.Client(base_url=url, timeout=30) as client:
            while not self.stop.wait(wait):
                start = time.thread_time()
                answer = client.get(f"/kv/snapshot?since={since}&have={have}").json()
                since, have, wait = answer["last_event"], answer["number"], answer["poll_ms"] / 1000
                self.reads += 1
                self._cpu += time.thread_time() - start

    def cpu_seconds(self) -> float:
        return self._cpu

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


class PageInBrowser(Browser):
    """The page open in headless Chromium on this machine; its CPU is every Chromium process's."""

    def __init__(self, chromium: str, url: str) -> None:
        super().__init__(chromium, url + "/kv")

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.proc.pid)


def snapshot_ms_total(url: str) -> float:
    """The server's CPU milliseconds spent on KV snapshots so far (the engine thread's, as ``/kv/snapshot`` says)."""
    return httpx.get(f"{url}/kv/snapshot?since={2**62}", timeout=30).json()["cost"]["total_ms"]


ARMS = ("without", "poll", "chromium")


def throughput(chromium: str, rounds: int, num_requests: int) -> dict:
    """``paged.bench serve`` without the page, with a poller reading /kv/snapshot as the page does, and with
    the page open in Chromium on this machine, alternating within each round; the order rotates from round
    to round so that each arm runs first, second and third equally often.

    Per run: request throughput (wall clock: noisy on a shared machine), the server's CPU milliseconds per
    request (what the server spent, whatever else runs), the watcher's (the poller's thread, or every
    Chromium process), the share of the bench's wall time the engine thread spent on snapshots, and the
    1-minute load average before the run. Reported: each arm's median, and the median, lowest and highest
    of the per-round ratios to the same round's "without" run.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    makers = {"without": lambda: None, "poll": lambda: Poller(url), "chromium": lambda: PageInBrowser(chromium, url)}
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with open(Path(tempfile.gettempdir()) / f"kv_view_bench_{port}.log", "w") as log:
        server = start_server(port, None, log)
        try:
            bench(url, num_requests)  # warm-up
            for r in range(rounds):
                for arm in ARMS[r % 3:] + ARMS[:r % 3]:
                    watcher = makers[arm]()
                    time.sleep(WATCH_TIMEOUT_S + 1)  # the last arm's watching has ended; this one's page is drawn
                    load = os.getloadavg()[0]
                    spent = snapshot_ms_total(url) if watcher else 0.0
                    cpu, watcher_cpu = cpu_seconds(server.pid), watcher.cpu_seconds() if watcher else 0.0
                    start = time.monotonic()
                    rps = bench(url, num_requests)
                    wall = time.monotonic() - start
                    server_ms = (cpu_seconds(server.pid) - cpu) / num_requests * 1e3
                    run = {"req_per_s": rps, "server_cpu_ms_per_req": server_ms,
                           "watcher_cpu_ms_per_req": 0.0, "snapshot_share": 0.0, "load_1min": load}
                    if watcher:
                        run["watcher_cpu_ms_per_req"] = (watcher.cpu_seconds() - watcher_cpu) / num_requests * 1e3
                        run["snapshot_share"] = (snapshot_ms_total(url) - spent) / (wall * 1e3)
                        watcher.close()
                    runs[arm].append(run)
                    print(json.dumps({"round": r, "arm": arm, **{k: round(v, 4) for k, v in run.items()}}),
                          file=sys.stderr, flush=True)
        finally:
            server.terminate()
            server.wait(30)
    summary = {arm: {key: statistics.median([run[key] for run in runs[arm]]) for key in runs[arm][0]} for arm in ARMS}
    ratios = {}
    for arm in ("poll", "chromium"):
        ratios[arm] = {}
        for key in ("req_per_s", "server_cpu_ms_per_req"):
            per_round = [w[key] / o[key] for w, o in zip(runs[arm], runs["without"])]
            ratios[arm][key] = {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}
    return {"rounds": rounds, "num_requests": num_requests, "runs": runs, "median": summary,
            "ratio_to_without": ratios}


def snapshot_cost(num_blocks: int, swap_space: int, rounds: int = 200) -> dict:
    """CPU milliseconds of one snapshot and of its JSON, in an engine like the server's with 16 requests
    (some with ``n = 2``) after 40 iterations; and what they cost in % of one core at the page's two rates
    (``IDLE_POLL_S`` and, once the engine is busy, ``BUSY_POLL_S``)."""
    from paged import LLM
    from paged.serve.kv_view import BUSY_POLL_S, IDLE_POLL_S
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
    return {"device_blocks": num_blocks, "host_blocks": engine.scheduler.kv.host.num_blocks,
            "running": len(engine.scheduler.running), "swapped": len(engine.scheduler.swapped), "snapshot_ms": snap_ms,
            "json_ms": json_ms, "json_bytes": len(body),
            "percent_of_one_core_idle_rate": (snap_ms + json_ms) / IDLE_POLL_S / 10,
            "percent_of_one_core_busy_rate": (snap_ms + json_ms) / BUSY_POLL_S / 10}


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
    if args.rounds < 1 or args.num_requests < 1:
        p.error(f"--rounds and --num-requests must be >= 1, got {args.rounds} and {args.num_requests}")
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
