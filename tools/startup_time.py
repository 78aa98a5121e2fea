"""How long paged takes to start: process start -> model ready -> first generated token.

Each run is a fresh interpreter, so nothing is imported or loaded yet; only the
operating system's file cache is warm (the first, untimed run of each checkout
reads every file once). Two ways to start, each timed from the moment the
process is spawned:

* ``offline``: ``python -c`` running ``LLM()`` (the default model), then
  ``generate`` of one token; the child reports when ``torch`` and ``paged`` were
  imported, when ``LLM()`` returned and when the token came.
* ``serve``: ``python -m paged.serve --port N``; this script polls ``/v1/models``
  until it answers (ready), then sends one ``/v1/completions`` request for one
  token (first token).

And two states of the converted-weights cache of GGUF files (``PAGED_GGUF_CACHE``,
docs/models.md): ``cold``, an empty cache folder for every run (the GGUF file is
dequantized), and ``warm``, a folder the untimed run filled. A checkout without the
cache ignores the variable, so its cold and warm runs are the same work.

Several ``--root`` checkouts (one before a change, one after) run side by side: run
``i`` of every checkout and state before run ``i + 1`` of any, so that a machine
shared with other jobs slows them alike. Prints the medians, the ratio of each
checkout to the first, and the load average before and after.

    python tools/startup_time.py --root /path/to/before --root /path/to/after [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

OFFLINE = """
import json, sys, time
marks = {"interpreter": time.time()}
import torch
marks["import torch"] = time.time()
from paged import LLM, SamplingParams
LLM
marks["import paged"] = time.time()
llm = LLM()
marks["LLM() ready"] = time.time()
llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
marks["first token"] = time.time()
print("MARKS " + json.dumps(marks))
"""
OFFLINE_PHASES = ("interpreter", "import torch", "import paged", "LLM() ready", "first token")
SERVE_PHASES = ("ready", "first token")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(root: Path, cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(root), "PAGED_GGUF_CACHE": str(cache)}


def run_offline(root: Path, cache: Path) -> dict[str, float]:
    """Seconds from spawning the interpreter to each mark of ``OFFLINE``."""
    start = time.time()
    done = subprocess.run([sys.executable, "-c", OFFLINE], cwd=root, env=_env(root, cache),
                          capture_output=True, text=True, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("MARKS ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"offline run in {root} failed:\n{done.stderr[-2000:]}")
    return {k: v - start for k, v in json.loads(line[6:]).items()}


def _get(url: str, body: dict | None = None, timeout: float = 600):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def run_serve(root: Path, cache: Path) -> dict[str, float]:
    """Seconds from spawning ``python -m paged.serve`` to its first answer and to one token."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        start = time.time()
        server = subprocess.Popen([sys.executable, "-m", "paged.serve", "--port", str(port),
                                   "--log-level", "warning"], cwd=root, env=_env(root, cache),
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                if server.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"server in {root} exited:\n{log.read()[-2000:]}")
                try:
                    name = _get(f"{base}/v1/models", timeout=5)["data"][0]["id"]
                    break
                except OSError:
                    time.sleep(0.05)
            ready = time.time() - start
            _get(f"{base}/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 1, "temperature": 0})
            return {"ready": ready, "first token": time.time() - start}
        finally:
            server.terminate()
            server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", action="append", type=Path, required=True,
                   help="a checkout to start from (repeat: the first is the baseline of the ratios)")
    p.add_argument("--runs", type=int, default=3, help="timed runs per checkout, mode and cache state (default 3)")
    p.add_argument("--modes", default="offline,serve", help="offline, serve or both (default)")
    p.add_argument("--states", default="cold,warm", help="cold, warm or both (default)")
    p.add_argument("--json", action="store_true", help="print a JSON object of every run too")
    args = p.parse_args(argv)
    modes, states = args.modes.split(","), args.states.split(",")
    runner = {"offline": run_offline, "serve": run_serve}
    phases = {"offline": OFFLINE_PHASES, "serve": SERVE_PHASES}
    roots = [r.resolve() for r in args.root]
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="startup-time-") as tmp:
        warm = {root: Path(tmp) / f"warm{i}" for i, root in enumerate(roots)}
        for root in roots:  # untimed: builds the kernels, reads the files, fills the warm cache
            for mode in modes:
                runner[mode](root, warm[root])
        for run in range(args.runs):
            for i, root in enumerate(roots):
                for mode in modes:
                    for state in states:
                        cache = warm[root] if state == "warm" else Path(tmp) / f"cold{i}-{mode}-{run}"
                        marks = runner[mode](root, cache)
                        marks["load average"] = os.getloadavg()[0]
                        results.setdefault(f"{i}|{mode}|{state}", []).append(marks)
                        print(f"run {run + 1}: {root} {mode} {state}: {marks[phases[mode][-1]]:.2f} s",
                              file=sys.stderr)
    load_after = os.getloadavg()

    print(f"load average (1, 5, 15 min) before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
          f"after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print(f"seconds from process start, median of {args.runs} runs (ratio to {roots[0]})")
    for mode in modes:
        for state in states:
            print(f"\n{mode}, {state} cache:")
            base = results[f"0|{mode}|{state}"]
            for phase in phases[mode]:
                cells = []
                for i, root in enumerate(roots):
                    median = statistics.median(m[phase] for m in results[f"{i}|{mode}|{state}"])
                    ratio = median / statistics.median(m[phase] for m in base)
                    cells.append(f"{median:6.2f}" + ("" if i == 0 else f" ({ratio:.2f}x)"))
                print(f"  {phase:14s} " + "   ".join(cells))
    if args.json:
        print(json.dumps({"roots": [str(r) for r in roots], "load_before": load_before, "load_after": load_after,
                          "runs": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
