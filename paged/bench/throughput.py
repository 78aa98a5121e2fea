"""Throughput of paged vs contiguous reservation in one engine: the paper's Figures 12, 13 and 14.

The paper (§6.2–6.3) replays ShareGPT and Alpaca requests with Poisson
arrivals and plots normalized latency (mean over requests of end-to-end
latency / output length) against the request rate, for vLLM and Orca with
three reservation sizings; a system's throughput is the highest rate it
sustains before latency explodes. Its Orca is a separate implementation, so
scheduling and kernels differ too. Here every system is the same step05
engine (same kernels, runner, FCFS scheduler, budgets, block pool) with a
different ``memory=`` setting (``paged.bench.reservation``), so
the ratios isolate memory management.

How a run works: the workload (``paged.bench.e2e``: a trace with lengths
divided by ``--length-scale``, random prompts, EOS ignored) gets Poisson
arrival times at each rate of ``--rates`` (the same arrivals for every
system). The engine loop runs for real on a simulated clock: requests whose
arrival time has passed are added, one ``engine.step()`` runs, and the clock
advances by that step's measured time (``--clock``); when the engine is idle
the clock jumps to the next arrival. A request's latency is its finish time
minus its arrival time. The KV budget is ``--kv-tokens`` (about 2,000 tokens),
small enough that memory binds.

Reported per system and rate: normalized latency (s/token), p50 / p99
latency (s), output tokens/s (all generated tokens / makespan), mean batched
requests (requests in the batch, averaged over the engine's busy time) and
preemptions; per system the max rate: where its normalized latency crosses
``--threshold`` (linear interpolation between the two rates around the
crossing). ``--rates auto`` first runs paged with every request at t = 0 and
sweeps fractions of that capacity (requests/s).

``--decoding``: ``basic`` (one sample), ``parallel-N`` (``n`` samples, N in
2, 4, 6) or ``beam-N`` (beam width N), as the paper's Figure 14.

Examples:
    python -m paged.bench throughput
    python -m paged.bench throughput --trace alpaca --decoding beam-4 --plot fig14.png --json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from paged.bench import e2e
from paged.bench.reservation import ReservingEngine
from paged.step03_attention import SamplingParams

SYSTEMS = ("paged", "orca-oracle", "orca-pow2", "orca-max")
LABELS = {"paged": "vLLM (paged)", "orca-oracle": "Orca (Oracle)", "orca-pow2": "Orca (Pow2)",
          "orca-max": "Orca (Max)"}
DECODINGS = ("basic",) + tuple(f"{k}-{n}" for k in ("parallel", "beam") for n in (2, 4, 6))
AUTO_RATES = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)  # x paged's all-at-once capacity
THRESHOLD_FACTOR = 2.0  # auto threshold: x the lowest normalized latency at the lowest rate
# The paper, OPT-13B on one A100 (Figures 12a/d, 13a/b, 14): paged / system ratios of the
# sustainable rate and of the mean batched requests; None: the paper gives no number.
PAPER = {
    ("sharegpt", "basic"): {"rate": {"orca-oracle": 2.4, "orca-pow2": 4.25, "orca-max": 8.5},
                            "batched": {"orca-oracle": 2.2, "orca-pow2": 3.1, "orca-max": 4.3}},
    ("alpaca", "basic"): {"rate": {"orca-oracle": 1.3}, "batched": {"orca-oracle": 1.8}},
    ("alpaca", "parallel-2"): {"rate": {"orca-oracle": 1.7}},
    ("alpaca", "parallel-4"): {"rate": {"orca-oracle": 2.3}},
    ("alpaca", "parallel-6"): {"rate": {"orca-oracle": 2.8}},
    ("alpaca", "beam-2"): {"rate": {"orca-oracle": 1.8}},
    ("alpaca", "beam-4"): {"rate": {"orca-oracle": 2.6}},
    ("alpaca", "beam-6"): {"rate": {"orca-oracle": 2.3}},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    e2e.add_common_arguments(parser, num_requests=150)
    parser.add_argument("--rates", default="auto",
                        help="comma-separated request rates (req/s), or auto (fractions of paged's capacity)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}")
    parser.add_argument("--decoding", default="basic", choices=DECODINGS)
    parser.add_argument("--threshold", default="auto",
                        help="normalized latency (s/token) a sustainable rate stays under; auto: "
                             "2 x the lowest normalized latency measured at the lowest rate")
    parser.add_argument("--plot", metavar="PATH", help="write Figure 12/13-style curves and bars (PNG)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def sampling_params(decoding: str, job: e2e.Job, seed: int) -> SamplingParams:
    """What the request asks for: the trace's output length exactly (EOS ignored)."""
    kind, _, width = decoding.partition("-")
    if kind == "beam":
        return SamplingParams(n=1, best_of=int(width), use_beam_search=True, temperature=0.0,
                              max_tokens=job.output_len, ignore_eos=True)
    return SamplingParams(n=int(width or 1), temperature=1.0, max_tokens=job.output_len,
                          ignore_eos=True, seed=seed)


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Arrival times (s) of ``n`` requests at ``rate`` per second; all at 0 if the rate is inf."""
    if rate == float("inf"):
        return [0.0] * n
    rng = np.random.default_rng([seed, int(rate * 1e6)])
    return np.cumsum(rng.exponential(1.0 / rate, n)).tolist()


# --8<-- [start:replay]
def replay(engine, jobs: list[e2e.Job], arrivals: list[float], params: list[SamplingParams], clock) -> dict:
    """Feed ``jobs`` to ``engine`` at their arrival times on a simulated clock; the metrics."""
    n, added, now = len(jobs), 0, 0.0
    finish: dict[int, float] = {}
    busy = batched = 0.0
    while len(finish) < n:
        while added < n and arrivals[added] <= now:
            engine.add_request(str(added), jobs[added].prompt, params[added])
            added += 1
        if not engine.has_unfinished():
            now = arrivals[added]  # idle: jump to the next arrival
            continue
        t0 = clock()
        outs = engine.step()
        dt = clock() - t0
        now += dt
        done = [o for o in outs if o.finished]
        busy += dt
        batched += dt * (len(engine.scheduler.running) + len(done))  # the finished ones were in this batch
        for o in done:
            finish[int(o.request_id)] = now
    latency = np.array([finish[i] - arrivals[i] for i in range(n)])
    out_len = np.array([j.output_len for j in jobs])
    makespan = max(finish.values()) - min(arrivals)
    return {
        "normalized_latency": float(np.mean(latency / out_len)),
        "p50_latency": float(np.percentile(latency, 50)),
        "p99_latency": float(np.percentile(latency, 99)),
        "tokens_per_s": engine.generation_tokens_total / makespan,
        "mean_batched_requests": batched / busy,
        "preemptions": sum(engine.scheduler.preemptions.values()),
        "makespan": makespan,
    }
# --8<-- [end:replay]


def max_rate(points: list[tuple[float, float]], threshold: float) -> tuple[float, str]:
    """Highest rate under ``threshold``: ``(rate, qualifier)`` from ``[(rate, normalized latency)]``.

    The qualifier is ``""`` (interpolated crossing), ``">="`` (never crossed:
    at least the highest rate) or ``"<"`` (crossed at the lowest rate already).
    """
    points = sorted(points)
    if points[0][1] > threshold:
        return points[0][0], "<"
    for (r0, y0), (r1, y1) in zip(points, points[1:]):
        if y1 > threshold:
            return r0 + (r1 - r0) * (threshold - y0) / (y1 - y0), ""
    return points[-1][0], ">="


def parse_rates(text: str) -> list[float] | None:
    if text == "auto":
        return None
    rates = sorted(float(r) for r in text.split(","))
    if not rates or rates[0] <= 0:
        raise ValueError(f"--rates must be positive numbers or auto, got {text!r}")
    return rates


def run(args: argparse.Namespace) -> int:
    prog = "python -m paged.bench throughput"
    try:
        systems = [s for s in args.systems.split(",") if s]
        if not systems or set(systems) - set(SYSTEMS):
            raise ValueError(f"--systems must name some of {SYSTEMS}, got {args.systems!r}")
        rates = parse_rates(args.rates)
        threshold = None if args.threshold == "auto" else float(args.threshold)
        torch.set_num_threads(1)
        model, _, line = e2e.load(args)
        jobs = e2e.workload(args, model.config.vocab_size)
        params = [sampling_params(args.decoding, j, args.seed * 100_003 + i) for i, j in enumerate(jobs)]
        num_blocks = args.kv_tokens // args.block_size
        context = e2e.max_model_len(args)

        def engine(memory):
            return ReservingEngine(model, memory=memory, block_size=args.block_size, num_blocks=num_blocks,
                                   max_model_len=context, seed=args.seed)

        for system in systems:  # every request must be admissible alone, in every system
            probe = engine(system)
            for i, (j, p) in enumerate(zip(jobs, params)):
                try:
                    probe.check_request(j.prompt, p)
                except ValueError as e:
                    raise ValueError(f"{system}: request {i}: {e}") from None
    except (ValueError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    clock = e2e.CLOCKS[args.clock]
    print(line)
    print(f"trace {args.trace} (lengths / {args.length_scale}): {e2e.describe(jobs)}; decoding {args.decoding}")
    print(f"KV cache: {num_blocks} blocks of {args.block_size} tokens ({num_blocks * args.block_size} tokens); "
          f"max_model_len {context}; clock: {args.clock} (simulated: advanced by each step's measured time)")
    replay(engine("paged"), jobs[:8], [0.0] * min(8, len(jobs)), params[:8], clock)  # warm-up
    if rates is None:
        capacity = len(jobs) / replay(engine("paged"), jobs, [0.0] * len(jobs), params, clock)["makespan"]
        rates = [round(f * capacity, 3) for f in AUTO_RATES]
        print(f"paged capacity with every request at t=0: {capacity:.2f} req/s; rates: {rates}")

    results: dict[str, dict[float, dict]] = {s: {} for s in systems}
    head = (f"{'system':<15}{'rate':>8}{'norm. lat':>11}{'p50 lat':>9}{'p99 lat':>9}"
            f"{'tok/s':>9}{'batched':>9}{'preempt':>9}")
    print(head + "\n" + "-" * len(head))
    for rate in rates:
        arrivals = poisson_arrivals(len(jobs), rate, args.seed)
        for system in systems:
            m = replay(engine(system), jobs, arrivals, params, clock)
            results[system][rate] = m
            print(f"{LABELS[system]:<15}{rate:>8.2f}{m['normalized_latency']:>11.4f}{m['p50_latency']:>9.3f}"
                  f"{m['p99_latency']:>9.3f}{m['tokens_per_s']:>9.0f}{m['mean_batched_requests']:>9.1f}"
                  f"{m['preemptions']:>9d}", flush=True)
        if threshold is None:
            threshold = THRESHOLD_FACTOR * min(results[s][rate]["normalized_latency"] for s in systems)
            print(f"threshold: {threshold:.4f} s/token ({THRESHOLD_FACTOR:g} x the lowest at rate {rate})")
    top = rates[-1]
    summary = {}
    for system in systems:
        rate, qual = max_rate([(r, m["normalized_latency"]) for r, m in results[system].items()], threshold)
        summary[system] = {"max_rate": rate, "qualifier": qual,
                           "mean_batched_requests": results[system][top]["mean_batched_requests"],
                           "tokens_per_s": results[system][top]["tokens_per_s"]}
    print_summary(summary, args.trace, args.decoding, top)
    if args.plot:
        plot(results, summary, threshold, top, args, args.plot)
        print(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps({"trace": args.trace, "decoding": args.decoding, "systems": {
            s.replace("-", "_"): {k: summary[s][k] for k in ("max_rate", "mean_batched_requests", "tokens_per_s")}
            for s in systems}}))
    return 0


def print_summary(summary: dict, trace: str, decoding: str, top: float) -> None:
    paper = PAPER.get((trace, decoding), {})
    print(f"\nper system: max rate under the threshold; mean batched requests and tokens/s at rate {top}")
    print(f"{'system':<15}{'max rate':>11}{'batched':>9}{'tok/s':>8}{'paged/x rate':>14}{'(paper)':>9}"
          f"{'paged/x batched':>17}{'(paper)':>9}")
    p = summary.get("paged")
    for s, m in summary.items():
        rate_ratio = batch_ratio = paper_rate = paper_batch = ""
        if p and s != "paged":
            rate_ratio = f"{p['max_rate'] / m['max_rate']:.2f}" if m["max_rate"] else "inf"
            batch_ratio = f"{p['mean_batched_requests'] / m['mean_batched_requests']:.2f}"
            paper_rate = str(paper.get("rate", {}).get(s, "-"))
            paper_batch = str(paper.get("batched", {}).get(s, "-"))
        print(f"{LABELS[s]:<15}{m['qualifier']:>3}{m['max_rate']:>8.2f}{m['mean_batched_requests']:>9.1f}"
              f"{m['tokens_per_s']:>8.0f}{rate_ratio:>14}{paper_rate:>9}{batch_ratio:>17}{paper_batch:>9}")


def plot(results: dict, summary: dict, threshold: float, top: float, args, path: str) -> None:
    """Left: normalized latency vs request rate (Figure 12/14); right: batched requests (Figure 13)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"paged": "#c44e52", "orca-oracle": "#4c72b0", "orca-pow2": "#55a868", "orca-max": "#8172b2"}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9.6, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    for s, by_rate in results.items():
        rs = sorted(by_rate)
        ax.plot(rs, [by_rate[r]["normalized_latency"] for r in rs], "o-", color=colors[s], label=LABELS[s], ms=4)
    ax.axhline(threshold, color="gray", ls=":", lw=1)
    ax.set_ylim(0, 3 * threshold)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.legend(fontsize=8)
    names = list(summary)
    bars = bx.bar([LABELS[s].replace(" (", "\n(") for s in names],
                  [summary[s]["mean_batched_requests"] for s in names], color=[colors[s] for s in names])
    bx.bar_label(bars, fmt="%.1f", fontsize=8)
    bx.set_ylabel(f"mean batched requests at {top} req/s")
    bx.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"{args.trace} (lengths / {args.length_scale}), {args.decoding}, KV {args.kv_tokens} tokens, "
                 f"B={args.block_size}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
