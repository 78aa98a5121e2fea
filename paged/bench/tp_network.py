"""Step06 across hosts: what tensor parallelism sends per iteration, and what a slow, lossy or cut link costs it.

    python -m paged.bench tp_network                  # as root: two network namespaces, tc and nft
    python -m paged.bench tp_network --faults none,rate:10mbit,loss:5,cut:reset --steps 16 --json

One greedy batch of ``--num-seqs`` sequences decodes ``--steps`` iterations
on each setup, and the driver (rank 0) reports per decode iteration: the
step's wall time (mean, median, slowest), the tokens per second of the
mean, and from its ``TPGroup.traffic`` tally the calls, payload bytes and
seconds of its all-reduces, all-gathers (the LM head) and plan broadcasts.
Setups:

* ``tp=1``: one process, no collective (the baseline the others pay against),
  with the intra-op threads of one rank of tp = 2 (cores // 2);
* ``tp=2 one host``: the driver and one spawned worker over loopback;
* ``tp=2 two hosts, FAULT``: the driver in one network namespace, the
  headless worker (``python -m paged.serve --headless``) in another, joined
  by a veth pair that carries ``FAULT`` on both ends (``link_faults``: a
  ``tc tbf`` cap, nftables loss, a netem delay where the kernel has
  ``sch_netem``). Each "host" is pinned to a core of its own. Under each
  fault ``link_probe`` first measures the link itself (one TCP connection's
  round trip and throughput), so the row shows what the fault did to it;
* a cut (``cut:reset``, ``cut:silent``): the driver is ``python -m
  paged.serve``, and the link is cut under four streams, or while the
  server is idle (``--cut-when``; ``tp_network_cut``): what the clients got
  and after how long, when each host exited and with what code, and
  whether a process was left.

The faults that leave the link working share one deployment, started once;
the link is changed between measurements, and the faults take turns
``--rounds`` times over (each row: the medians of its rounds), so a load
that comes and goes on the machine does not land on one row. A collective's seconds on rank 0
include waiting for the other rank to reach it, not only the wire. The model
is the bundled demo model unless ``--model`` says otherwise; figures from a
loaded 2-core CPU are noisy, the ratios between setups of one run are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from paged.bench.link_faults import Fault
from paged.bench.netns import NamespaceError, unavailable
from paged.bench.tp_network_cut import CUT_STREAMS, cut, describe
from paged.bench.tp_network_hosts import combine, cpu_name, measure_faults

DEFAULT_FAULTS = "none,rate:1gbit,rate:100mbit,rate:10mbit,loss:1,loss:5,cut:reset,cut:silent"


def add_arguments(p) -> None:
    p.add_argument("--model", default=None, help="checkpoint folder (default: the bundled demo model)")
    p.add_argument("--faults", default=DEFAULT_FAULTS, type=_faults,
                   help="link faults across the two hosts, comma-separated: none, rate:10mbit (tc tbf), loss:5 "
                        "(nftables, %% of packets), delay:5ms (tc netem, where the kernel has it), cut:reset "
                        "(nftables tcp resets), cut:silent (every packet dropped); default: %(default)s")
    p.add_argument("--num-seqs", type=_positive(int), default=8, help="sequences in the decoding batch")
    p.add_argument("--steps", type=_positive(int), default=32, help="decode iterations measured per setup")
    p.add_argument("--rounds", type=_positive(int), default=3,
                   help="measurements per setup, taken in turns; each row holds their medians")
    p.add_argument("--distributed-timeout", type=_positive(float), default=10.0,
                   help="seconds a collective may wait in the cut deployments (the silent cut is noticed then)")
    p.add_argument("--cut-when", default="streams,idle", choices=["streams", "idle", "streams,idle"],
                   help="when each cut comes: under running streams, while the server is idle, or both (default)")
    p.add_argument("--no-local", action="store_true", help="skip the tp=1 and the one-host setups")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--role", choices=["driver"], help=argparse.SUPPRESS)
    p.add_argument("--master-addr", default="127.0.0.1", help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, default=0, help=argparse.SUPPRESS)


def _faults(text: str) -> list[Fault]:
    try:
        return [Fault.parse(f) for f in text.split(",") if f.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _load() -> str:
    return open("/proc/loadavg").read().split()[0]


def model_path(args) -> str:
    from paged.demo import DEFAULT_MODEL_PATH

    return args.model or str(DEFAULT_MODEL_PATH)


def measure(llm, num_seqs: int, steps: int) -> dict:
    """Per decode iteration of one greedy batch: step ms (mean, median, max), tokens/s, rank 0's collectives."""
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
    out = {"step_ms": 1e3 * sum(times) / n, "median_step_ms": 1e3 * statistics.median(times),
           "max_step_ms": 1e3 * max(times), "iterations": n,
           "tokens_per_s": num_seqs * n / sum(times)}
    for kind, (calls, nbytes, seconds) in before.items():
        t = group.traffic[kind]
        out[kind] = {"calls": (t.calls - calls) / n, "bytes": (t.bytes - nbytes) / n,
                     "ms": 1e3 * (t.seconds - seconds) / n}
    return out


def make_llm(args, tp: int, nnodes: int = 1):
    from paged import LLM

    extra = {"nnodes": nnodes, "master_addr": args.master_addr, "master_port": args.master_port} if nnodes > 1 else {}
    return LLM(model_path(args), dtype="float32", tensor_parallel_size=tp, block_size=16, num_blocks=512,
               attention_backend="reference", **extra)


def _driver(args) -> int:
    """In host A: one measurement per line read from stdin (the fault's name), until EOF; an error ends it."""
    with make_llm(args, 2, nnodes=2) as llm:
        measure(llm, args.num_seqs, args.steps)  # warm-up: a whole measurement, or the first row pays for it
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            try:
                result = measure(llm, args.num_seqs, args.steps)
            except Exception as exc:  # the engine is stopped: say why, and end
                print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
                return 1
            print(json.dumps({"fault": line.strip(), **result}), flush=True)
    return 0


def _cell(m: dict, kind: str) -> str:
    t = m.get(kind)
    return f"{t['ms']:>9.2f}" if t else f"{'-':>9}"


def _row(name: str, m: dict, base: float | None) -> str:
    if "skipped" in m or "error" in m:
        return f"{name:<30} {'skipped: ' + m['skipped'] if 'skipped' in m else 'error: ' + m['error']}"
    link = m.get("link", {})
    probe = f"{link['rtt_ms']:>7.3f} {link['mbit_s']:>8.1f}" if "mbit_s" in link else f"{'-':>7} {'-':>8}"
    vs = f"{m['step_ms'] / base:>6.2f}x" if base else f"{'-':>7}"
    return (f"{name:<30} {probe} {m['step_ms']:>8.1f} {m['median_step_ms']:>8.1f} {m['max_step_ms']:>8.1f} {vs} "
            f"{m['tokens_per_s']:>7.1f} "
            f"{_cell(m, 'broadcast')} {_cell(m, 'all_reduce')} {_cell(m, 'all_gather')}")


def print_table(results: dict, cuts: dict) -> None:
    base = next((m["step_ms"] for name, m in results.items() if name.endswith(", none")), None)
    payload = next((m for m in results.values() if "broadcast" in m), None)
    if payload:
        print("# per decode iteration, rank 0 sends: " + "; ".join(
            f"{k.replace('_', '-')} {payload[k]['calls']:.0f} call(s), {payload[k]['bytes'] / 1024:.1f} KiB"
            for k in ("broadcast", "all_reduce", "all_gather")))
    print("# rtt ms, Mbit/s: the link itself under the fault (one TCP connection); the rest per decode iteration: "
          "the step (mean, median, slowest), tokens/s of the mean, rank 0's ms in each collective")
    print(f"{'setup':<30} {'rtt ms':>7} {'Mbit/s':>8} {'step ms':>8} {'median':>8} {'max':>8} {'vs none':>7} "
          f"{'tok/s':>7} {'bcast ms':>9} {'allred ms':>9} {'allgat ms':>9}")
    for name, m in results.items():
        print(_row(name, m, base if "two hosts" in name else None))
    for name, c in cuts.items():
        print(f"\n{name}")
        for line in describe(c):
            print(f"  {line}")


def run(args) -> int:
    if args.role == "driver":
        return _driver(args)
    faults, cpu, load_start = args.faults, cpu_name(), _load()
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu}; model {model_path(args)}; "
          f"{args.num_seqs} sequences, {args.steps} decode iterations per setup, the median of {args.rounds} rounds; "
          f"1-minute load average {load_start} at the start")
    results: dict[str, dict] = {}
    if not args.no_local:
        import torch

        # tp = 1 gets the threads one rank of tp = 2 gets (cores // 2): with every core's worth of
        # OpenMP threads, a shared machine's other jobs make them spin (600 ms a step instead of 31 here)
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))
        for name, tp in (("tp=1", 1), ("tp=2 one host", 2)):
            with make_llm(args, tp) as llm:
                measure(llm, args.num_seqs, args.steps)  # warm-up: a whole measurement, or the first row pays for it
                results[name] = combine([measure(llm, args.num_seqs, args.steps) for _ in range(args.rounds)])
    why, cuts = unavailable(), {}
    if why:
        results["tp=2 two hosts"] = {"skipped": why}
    else:
        results.update(measure_faults(args, [f for f in faults if f.kind != "cut"], model_path(args)))
        for fault, when in ((f, w) for f in faults if f.kind == "cut" for w in args.cut_when.split(",")):
            name = f"tp=2 two hosts, {fault.label}, {f'under {CUT_STREAMS} streams' if when == 'streams' else 'while idle'}"
            try:
                cuts[name] = cut(args, fault, model_path(args), idle=when == "idle")
            except NamespaceError as exc:
                cuts[name] = {"skipped": str(exc)}
            except RuntimeError as exc:  # the deployment did not start: the row says so, the others still run
                cuts[name] = {"error": str(exc)}
    print_table(results, cuts)
    print(f"# 1-minute load average {_load()} at the end")
    if args.json:
        print(json.dumps({"cpu": cpu, "num_seqs": args.num_seqs, "steps": args.steps, "rounds": args.rounds,
                          "load_start": load_start,
                          "load_end": _load(), "results": results, "cuts": cuts}))
    return 0
