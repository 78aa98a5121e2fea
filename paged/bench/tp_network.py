"""Step06 across hosts: what tensor parallelism sends per iteration, and what the network's delay costs it.

    python -m paged.bench tp_network                      # as root: needs two network namespaces
    python -m paged.bench tp_network --delays 0,0.5ms,5ms --num-seqs 8 --steps 32 --json

One greedy batch of ``--num-seqs`` sequences decodes ``--steps`` iterations
on each setup, and the driver (rank 0) reports per decode iteration: the
step's wall time, and from its ``TPGroup.traffic`` tally the calls, payload
bytes and seconds of its all-reduces, all-gathers (the LM head) and plan
broadcasts. Setups, in this order:

* ``tp=1``: one process, no collective (the baseline the others pay against);
* ``tp=2 one host``: the driver and one spawned worker over loopback;
* ``tp=2 two hosts +D``: the driver in one network namespace, the headless
  worker (``python -m paged.serve --headless``) in another, joined by a veth
  pair with ``tc netem delay D`` on both ends (D each way, 2D per round trip).

The two-host deployment starts once; the driver measures one delay after the
other, and this process changes the netem delay between them. A
collective's seconds on rank 0 include waiting for the other rank to reach
it, not only the wire. The model is the bundled demo model unless
``--model`` says otherwise; figures from a loaded 2-core CPU are noisy, the
ratios between setups of the same run are what to read.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MASTER_PORT = 29610
START_TIMEOUT_S = 600  # three processes importing torch and loading the model on a loaded machine


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="checkpoint folder (default: the bundled demo model)")
    p.add_argument("--delays", default="0,0.5ms,5ms", help="netem delays each way, comma-separated (0 = none)")
    p.add_argument("--num-seqs", type=int, default=8, help="sequences in the decoding batch")
    p.add_argument("--steps", type=int, default=32, help="decode iterations measured per setup")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--role", choices=["driver"], help=argparse.SUPPRESS)
    p.add_argument("--nnodes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--tp", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--master-addr", default="127.0.0.1", help=argparse.SUPPRESS)


def _model(args) -> str:
    from paged.demo import DEFAULT_MODEL_PATH

    return args.model or str(DEFAULT_MODEL_PATH)


def measure(llm, num_seqs: int, steps: int) -> dict:
    """Per decode iteration of one greedy batch: step ms, and rank 0's collectives (calls, bytes, ms)."""
    from paged import SamplingParams

    engine = llm.engine
    group = engine.workers.group if engine.workers is not None else None
    for i in range(num_seqs):
        engine.add_request(f"m{time.monotonic_ns()}-{i}", [1 + (7 * i + j) % 50 for j in range(16)],
                           SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    engine.step()  # the prefill
    before = {k: (t.calls, t.bytes, t.seconds) for k, t in group.traffic.items()} if group else {}
    times = []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    n = len(times)
    out = {"step_ms": 1e3 * sum(times) / n, "iterations": n}
    for kind, (calls, nbytes, seconds) in before.items():
        t = group.traffic[kind]
        out[kind] = {"calls": (t.calls - calls) / n, "bytes": (t.bytes - nbytes) / n,
                     "ms": 1e3 * (t.seconds - seconds) / n}
    return out


def _llm(args, tp: int, nnodes: int = 1):
    from paged import LLM

    extra = {"nnodes": nnodes, "master_addr": args.master_addr, "master_port": MASTER_PORT} if nnodes > 1 else {}
    return LLM(_model(args), dtype="float32", tensor_parallel_size=tp, block_size=16, num_blocks=512,
               attention_backend="reference", **extra)


def _driver(args) -> int:
    """In the driver's namespace: one measurement per line read from stdin ("go DELAY"), until EOF."""
    with _llm(args, args.tp, args.nnodes) as llm:
        measure(llm, args.num_seqs, 4)  # warm-up
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            print(json.dumps({"delay": line.split()[1], **measure(llm, args.num_seqs, args.steps)}), flush=True)
    return 0


def _across(args, delays: list[str]) -> dict[str, dict]:
    from paged.bench.netns import TwoHosts

    root = Path(__file__).resolve().parents[2]
    py, model, out = sys.executable, _model(args), {}
    with TwoHosts() as hosts:
        common = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", hosts.address["a"],
                  "--master-port", str(MASTER_PORT)]
        env = {"PYTHONPATH": str(root)}
        worker = hosts.popen("b", ["env", *(f"{k}={v}" for k, v in env.items()), py, "-m", "paged.serve", "--model",
                                   model, "--dtype", "float32", "--device", "cpu", *common, "--node-rank", "1",
                                   "--headless"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        driver = hosts.popen("a", ["env", *(f"{k}={v}" for k, v in env.items()), py, "-m", "paged.bench",
                                   "tp_network", "--role", "driver", "--nnodes", "2", "--master-addr",
                                   hosts.address["a"], "--model", model, "--num-seqs", str(args.num_seqs),
                                   "--steps", str(args.steps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        try:
            line = driver.stdout.readline()
            if not line:
                raise RuntimeError(f"the two-host driver did not start; the worker host said:\n{worker.stderr.read()}")
            for d in delays:
                hosts.delay(None if d in ("0", "0ms") else d)
                driver.stdin.write(f"go {d}\n")
                driver.stdin.flush()
                out[d] = json.loads(driver.stdout.readline())
            driver.stdin.close()
            driver.wait(120)
            worker.wait(60)
        finally:
            for p in (driver, worker):
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return out


def _row(name: str, m: dict, base: float) -> str:
    cells = [f"{name:<22}", f"{m['step_ms']:>8.1f}", f"{m['step_ms'] / base:>6.2f}x"]
    for kind in ("all_reduce", "all_gather", "broadcast"):
        t = m.get(kind)
        cells.append(f"{t['calls']:>5.0f} {t['bytes'] / 1024:>8.1f} {t['ms']:>7.2f}" if t else f"{'-':>22}")
    return " ".join(cells)


def run(args) -> int:
    if args.role == "driver":
        return _driver(args)
    import platform

    from paged.bench.netns import unavailable

    delays = [d.strip() for d in args.delays.split(",") if d.strip()]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu}; model {_model(args)}; "
          f"{args.num_seqs} sequences, {args.steps} decode iterations per setup")
    results = {}
    for name, tp in (("tp=1", 1), ("tp=2 one host", 2)):
        with _llm(args, tp) as llm:
            measure(llm, args.num_seqs, 4)  # warm-up
            results[name] = measure(llm, args.num_seqs, args.steps)
    why = unavailable()
    if why:
        print(f"# two hosts skipped: {why}")
    else:
        for d, m in _across(args, delays).items():
            results[f"tp=2 two hosts +{d}"] = m
    base = results["tp=1"]["step_ms"]
    print(f"{'setup':<22} {'step ms':>8} {'vs tp=1':>7} {'all-reduce: n KiB ms':>22} {'all-gather: n KiB ms':>22} "
          f"{'broadcast: n KiB ms':>22}")
    for name, m in results.items():
        print(_row(name, m, base))
    if args.json:
        print(json.dumps({"cpu": cpu, "num_seqs": args.num_seqs, "steps": args.steps, "results": results}))
    return 0
