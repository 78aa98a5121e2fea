"""The paper's figures at paper scale: the real scheduler on a modelled GPU (Figures 12-14, 16-18).

``python -m paged.bench throughput`` runs the whole engine on this CPU, where
an iteration's cost grows with its batch. The paper's regime is different:
OPT-13B on one A100-40GB, about 12 GB of KV, and iterations bound by reading
26 GB of weights, so that a batch of 40 costs about what a batch of 4 does.
This bench replays that regime, in the spirit of LLM-serving simulators such
as Vidur: the step05 engine's scheduler, block manager, sharing and
preemption run unchanged (``replay_engine.ReplayEngine``); the model is a
stand-in that returns tokens without computing them; the clock advances each
iteration by a roofline cost model of the paper's GPU
(``replay_cost.CostModel``); the KV budget is what the model leaves on that
GPU, in blocks of the block size, with vLLM's 4 GiB of host swap space per GPU.

The workloads are at real lengths (no scaling): 1,000 requests (``--num-requests``)
of the synthetic ShareGPT-like or Alpaca-like trace (``paged.bench.traces``),
EOS ignored, ``max_tokens`` the trace's output length, Poisson arrivals at
each rate. Arrivals, metrics and the max-rate interpolation are those of
``paged.bench.throughput`` (``throughput.replay``, ``throughput.max_rate``):
normalized latency, mean batched requests (at the highest rate, where every
system is saturated), and the highest rate whose normalized latency stays
under 2x the lowest one measured at the lowest rate.

Rates: fractions (``FRACTIONS``; fewer for Figure 14) of paged's capacity,
measured first with every request at t = 0, so each system's knee is bracketed.

Figures (``--figure``):

* **12 / 13** — ShareGPT and Alpaca, OPT-13B: paged vs Orca (Oracle, Pow2,
  Max); Figure 13's batched requests come from the same runs.
* **14** — Alpaca, parallel sampling (n = 2, 4, 6) and beam search (width 2,
  4, 6): paged vs Orca (Oracle).
* **16** — shared prefix, LLaMA-13B: a fixed 80-token (1-shot) or 341-token
  (5-shot) prefix before each request's own sentence; paged with prefix
  caching vs Orca (Oracle). The paper's workload is WMT16 translation; here a
  sentence and its translation are log-normal with mean 30 tokens (our
  assumption: the paper gives no lengths).
* **17** — chatbot, OPT-13B: each request is a conversation so far (0-5
  earlier ShareGPT-like rounds plus the new prompt) cut to its last 1,024
  tokens, and an answer of at most 1,024 tokens; paged vs the three Orcas.
* **18** — block size vs normalized latency (Figure 18b), paged only, on
  ShareGPT and Alpaca at one fixed rate each (``FIG18_FRACTION``: about
  paged's knee at B = 16); plus the cost model's attention kernel times
  against Figure 18a.

Examples:
    python -m paged.bench replay --figure 12
    python -m paged.bench replay --figure 14 --json
    python -m paged.bench replay --figure 18 --gpu a100-80gb
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from paged.bench import e2e, throughput
from paged.bench.replay_cost import FIG18A_POINT, GPUS, MAX_NUM_BATCHED_TOKENS, MODELS, CostModel
from paged.bench.replay_engine import ReplayEngine, stand_in_model
from paged.step03_attention.stand_in import VOCAB
from paged.bench.traces import synthetic_trace

FIGURES = (12, 13, 14, 16, 17, 18)
FRACTIONS = (0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0)  # x paged's all-at-once capacity
# Figure 14's six panels replay beam search, the slowest to schedule: fewer rates, still around every knee
FRACTIONS_BY_FIGURE = {14: (0.2, 0.35, 0.5, 0.75, 1.0, 1.5)}
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ORCAS = ("orca-oracle", "orca-pow2", "orca-max")
# Where the paper's Figure 12a / 12d curves start (s/token) at their lowest rates: read off the
# plots by eye (the paper prints no number); the replay is checked against it within LOW_LOAD_FACTOR.
PAPER_LOW_LOAD = 0.04
LOW_LOAD_FACTOR = 2.0
# Figure 18b's fixed rates, as fractions of paged's B=16 capacity (every request at t=0): where the
# replayed Figure 12 puts paged's B=16 knee (2.86 of 2.82 req/s on ShareGPT, 105 of 60 on Alpaca),
# so that a block size that wastes memory shows in the latency.
FIG18_FRACTION = {"sharegpt": 1.0, "alpaca": 1.75}
# Figure 18a, the paper's paged kernel (us) where the plot can be read: (batch, context) -> latency.
FIG18A_PAPER_US = {(8, 256): 230, (32, 256): 225}


@dataclass
class Panel:
    """One panel of a figure: a workload, the systems that serve it, and the paper's ratios."""

    name: str
    model: str
    jobs: list
    params: list
    systems: tuple
    paper: dict = field(default_factory=dict)  # {"rate" | "batched": {system: paged / system}}
    prefix_caching: bool = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--figure", type=int, required=True, choices=FIGURES, help="the paper's figure")
    parser.add_argument("--gpu", default=None, choices=sorted(GPUS),
                        help="accelerator (default: the paper's for the model)")
    parser.add_argument("--model", default=None, choices=sorted(MODELS),
                        help="paper model (default: the figure's, OPT-13B or LLaMA-13B for 16)")
    parser.add_argument("--num-gpus", type=int, default=None, help="tensor-parallel GPUs (default: the paper's)")
    parser.add_argument("--num-requests", type=int, default=1000, help="requests per run (default 1000)")
    parser.add_argument("--max-num-seqs", type=int, default=256,
                        help="sequences one iteration may compute (default 256, vLLM's)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    parser.add_argument("--fractions", default=None,
                        help="request rates as fractions of paged's capacity, comma-separated (default "
                             f"{','.join(map(str, FRACTIONS))}; Figure 14: "
                             f"{','.join(map(str, FRACTIONS_BY_FIGURE[14]))})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the traces, prompts and arrivals")
    parser.add_argument("--plot", metavar="PATH", help="write the figure's curves (PNG)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


# -- workloads -----------------------------------------------------------------------
def _prompts(lengths: list[int], rng: random.Random) -> list[list[int]]:
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in lengths]


def trace_jobs(name: str, n: int, seed: int, max_len: int = 2048) -> list[e2e.Job]:
    """``n`` requests of a synthetic trace at real lengths, random prompts."""
    trace = synthetic_trace(name, n, seed, max_len)
    prompts = _prompts([r.prompt_len for r in trace], random.Random(seed))
    return [e2e.Job(p, r.output_len) for p, r in zip(prompts, trace)]


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    return np.maximum(1, np.round(rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size))).astype(int)


def prefix_jobs(prefix_len: int, n: int, seed: int) -> list[e2e.Job]:
    """Figure 16: one shared prefix, then a sentence (mean 30 tokens) to translate into about as many."""
    rng = np.random.default_rng([seed, prefix_len])
    sentences, outputs = _lognormal(rng, 30, 0.5, n), _lognormal(rng, 30, 0.5, n)
    r = random.Random(seed)
    prefix = _prompts([prefix_len], r)[0]
    return [e2e.Job(prefix + s, int(o)) for s, o in zip(_prompts(sentences.tolist(), r), outputs)]


def chatbot_jobs(n: int, seed: int, context: int = 1024) -> list[e2e.Job]:
    """Figure 17: the conversation so far (0-5 earlier rounds + the new prompt), its last ``context``
    tokens; an answer of at most ``context`` tokens. Rounds are ShareGPT-like (prompt, answer) pairs."""
    rng = np.random.default_rng([seed, 17])
    rounds = synthetic_trace("sharegpt", 6 * n, seed)
    earlier = rng.integers(0, 6, n)
    jobs, r, k = [], random.Random(seed), 0
    for i in range(n):
        history = sum(t.total_len for t in rounds[k:k + earlier[i]])
        k += earlier[i]
        now = rounds[k]
        k += 1
        prompt_len = min(context, history + now.prompt_len)
        jobs.append(e2e.Job(_prompts([prompt_len], r)[0], min(context, now.output_len)))
    return jobs


def panels(figure: int, args) -> list[Panel]:
    n, seed = args.num_requests, args.seed

    def basic(jobs):
        return [throughput.sampling_params("basic", j, seed * 100_003 + i) for i, j in enumerate(jobs)]

    if figure in (12, 13):
        out = []
        for trace in ("sharegpt", "alpaca"):
            jobs = trace_jobs(trace, n, seed)
            out.append(Panel(trace, args.model or "opt-13b", jobs, basic(jobs), ("paged",) + ORCAS,
                             throughput.PAPER.get((trace, "basic"), {})))
        return out
    if figure == 14:
        jobs = trace_jobs("alpaca", n, seed)
        return [Panel(f"alpaca {d}", args.model or "opt-13b", jobs,
                      [throughput.sampling_params(d, j, seed * 100_003 + i) for i, j in enumerate(jobs)],
                      ("paged", "orca-oracle"), throughput.PAPER[("alpaca", d)])
                for d in ("parallel-2", "parallel-4", "parallel-6", "beam-2", "beam-4", "beam-6")]
    if figure == 16:
        return [Panel(f"{shots} prefix ({length} tokens)", args.model or "llama-13b", jobs, basic(jobs),
                      ("paged", "orca-oracle"), {"rate": {"orca-oracle": ratio}})
                for shots, length, ratio in (("1-shot", 80, 1.67), ("5-shot", 341, 3.58))
                for jobs in [prefix_jobs(length, n, seed)]]
    if figure == 17:
        jobs = chatbot_jobs(n, seed)
        return [Panel("chatbot", args.model or "opt-13b", jobs, basic(jobs), ("paged",) + ORCAS,
                      {"rate": {s: 2.0 for s in ORCAS}})]
    if figure == 18:
        return [Panel(trace, args.model or "opt-13b", jobs, basic(jobs), ("paged",))
                for trace in ("sharegpt", "alpaca") for jobs in [trace_jobs(trace, n, seed)]]
    raise ValueError(f"--figure must be one of {FIGURES}, got {figure}")


# -- runs --------------------------------------------------------------------------------
def make_engine(cost: CostModel, system: str, prefix_caching: bool = True, max_len: int = 2048,
                max_num_seqs: int = 256) -> ReplayEngine:
    """The replay engine of ``system`` on ``cost``'s GPU: its KV blocks, its swap space, vLLM's budgets."""
    model = stand_in_model(max_len)
    kw = {} if system != "paged" else {"enable_prefix_caching": prefix_caching}
    return ReplayEngine(model, cost=cost, memory=system, block_size=cost.block_size, num_blocks=cost.num_blocks(),
                        max_model_len=max_len, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                        max_num_seqs=max_num_seqs, swap_blocks=cost.num_swap_blocks(), **kw)


def run_one(cost, system, panel, rate, seed, max_num_seqs: int = 256) -> dict:
    """One replay of ``panel`` by ``system`` at ``rate``: the throughput metrics, plus wall time."""
    engine = make_engine(cost, system, panel.prefix_caching, max_num_seqs=max_num_seqs)
    arrivals = throughput.poisson_arrivals(len(panel.jobs), rate, seed)
    t0 = time.perf_counter()
    m = throughput.replay(engine, panel.jobs, arrivals, panel.params, lambda: engine.elapsed)
    m["wall_s"] = time.perf_counter() - t0
    m["iterations"] = engine.runner.iterations
    return m


HEAD = (f"{'system':<15}{'rate':>8}{'norm. lat':>11}{'p50 lat':>9}{'p99 lat':>9}{'tok/s':>8}{'batched':>9}"
        f"{'preempt':>9}{'iters':>9}{'wall s':>8}")


def _row(system, rate, m) -> str:
    return (f"{throughput.LABELS[system]:<15}{rate:>8.3g}{m['normalized_latency']:>11.4f}{m['p50_latency']:>9.2f}"
            f"{m['p99_latency']:>9.2f}{m['tokens_per_s']:>8.0f}{m['mean_batched_requests']:>9.1f}"
            f"{m['preemptions']:>9d}{m['iterations']:>9d}{m['wall_s']:>8.1f}")


def sweep(cost, panel: Panel, fractions, seed, max_num_seqs: int = 256) -> dict:
    """Every system of ``panel`` at rates bracketing the knees; the per-system summary."""
    cap = run_one(cost, "paged", panel, float("inf"), seed, max_num_seqs)
    capacity = len(panel.jobs) / cap["makespan"]
    rates = [round(f * capacity, 4) for f in fractions]
    print(f"paged capacity, every request at t=0: {capacity:.3f} req/s ({cap['wall_s']:.1f} s wall); "
          f"rates: {rates}")
    print(HEAD + "\n" + "-" * len(HEAD))
    results = {s: {} for s in panel.systems}
    for rate in rates:
        for s in panel.systems:
            results[s][rate] = m = run_one(cost, s, panel, rate, seed, max_num_seqs)
            print(_row(s, rate, m), flush=True)
    low = rates[0]
    threshold = throughput.THRESHOLD_FACTOR * min(results[s][low]["normalized_latency"] for s in panel.systems)
    top = rates[-1]
    summary = {}
    for s in panel.systems:
        rate, qual = throughput.max_rate([(r, m["normalized_latency"]) for r, m in results[s].items()], threshold)
        summary[s] = {"max_rate": rate, "qualifier": qual,
                      "mean_batched_requests": results[s][top]["mean_batched_requests"],
                      "tokens_per_s": results[s][top]["tokens_per_s"]}
    return {"rates": rates, "results": results, "threshold": threshold, "summary": summary, "capacity": capacity,
            "low_load": results["paged"][low]["normalized_latency"]}


def print_summary(panel: Panel, out: dict) -> dict:
    """The per-system table with paged / system ratios beside the paper's; returns the ratios."""
    summary, paper = out["summary"], panel.paper
    print(f"\nthreshold {out['threshold']:.4f} s/token ({throughput.THRESHOLD_FACTOR:g} x the lowest at "
          f"{out['rates'][0]} req/s); batched requests at {out['rates'][-1]} req/s")
    print(f"{'system':<15}{'max rate':>11}{'batched':>9}{'paged/x rate':>14}{'(paper)':>9}"
          f"{'paged/x batched':>17}{'(paper)':>9}")
    p = summary["paged"]
    ratios = {}
    for s, m in summary.items():
        cells = ["", "", "", ""]
        if s != "paged":
            rr = p["max_rate"] / m["max_rate"] if m["max_rate"] else float("inf")
            br = p["mean_batched_requests"] / m["mean_batched_requests"]
            ratios[s] = {"rate": rr, "batched": br}
            cells = [f"{rr:.2f}", str(paper.get("rate", {}).get(s, "-")), f"{br:.2f}",
                     str(paper.get("batched", {}).get(s, "-"))]
        print(f"{throughput.LABELS[s]:<15}{m['qualifier']:>3}{m['max_rate']:>8.3f}{m['mean_batched_requests']:>9.1f}"
              f"{cells[0]:>14}{cells[1]:>9}{cells[2]:>17}{cells[3]:>9}")
    return ratios


def _systems_json(summary: dict) -> dict:
    return {s.replace("-", "_"): {k: summary[s][k] for k in ("max_rate", "qualifier", "mean_batched_requests")}
            for s in summary}


def _paper_json(paper: dict) -> dict:
    return {kind: {s.replace("-", "_"): v for s, v in by.items()} for kind, by in paper.items()}


def figure18(args, cost_for, panel_list) -> dict:
    """Figure 18a (the cost model's kernel times) and 18b (block size sweep at one rate per trace)."""
    cost = cost_for(args.model or "opt-13b", 16)
    print("Figure 18a: one paged-attention call (one layer of OPT-13B) in the cost model")
    print(f"{'batch':>6}{'context':>9}{'model us':>10}{'paper us':>10}")
    for batch in (8, 32):
        for ctx in (64, 128, 256):
            t = (cost.iteration_time([1] * batch, [ctx] * batch) - cost.iteration_time([1] * batch, [0] * batch))
            print(f"{batch:>6}{ctx:>9}{t / cost.model.num_layers * 1e6:>10.1f}"
                  f"{FIG18A_PAPER_US.get((batch, ctx), '-'):>10}")
    print(f"(calibrated on the paper's point: batch {FIG18A_POINT['batch']}, context {FIG18A_POINT['context']}: "
          f"{FIG18A_POINT['latency_s'] * 1e6:.0f} us; at batch 8 the paper's kernel is not bandwidth bound, "
          "which the model leaves out)\n")
    out = {}
    for panel in panel_list:
        base = cost_for(panel.model, 16)
        cap = run_one(base, "paged", panel, float("inf"), args.seed, args.max_num_seqs)
        fraction = FIG18_FRACTION[panel.name]
        rate = round(fraction * len(panel.jobs) / cap["makespan"], 3)
        print(f"== Figure 18b, {panel.name}: paged at {rate} req/s ({fraction} x its B=16 capacity)")
        head = f"{'block':>6}{'blocks':>8}{'norm. lat':>11}{'batched':>9}{'preempt':>9}{'wall s':>8}"
        print(head + "\n" + "-" * len(head))
        rows = {}
        for b in BLOCK_SIZES:
            c = cost_for(panel.model, b)
            m = run_one(c, "paged", panel, rate, args.seed, args.max_num_seqs)
            rows[b] = {"normalized_latency": m["normalized_latency"], "mean_batched_requests":
                       m["mean_batched_requests"], "num_blocks": c.num_blocks(), "wall_s": m["wall_s"]}
            print(f"{b:>6}{c.num_blocks():>8}{m['normalized_latency']:>11.4f}{m['mean_batched_requests']:>9.1f}"
                  f"{m['preemptions']:>9d}{m['wall_s']:>8.1f}", flush=True)
        best = min(rows, key=lambda b: rows[b]["normalized_latency"])
        print(f"lowest normalized latency at B={best} (paper: 16-128 on ShareGPT, 16-32 on Alpaca)\n")
        out[panel.name] = {"rate": rate, "block_sizes": rows}
    return out


def _cpu() -> str:
    """This machine's CPU model and core count (what the wall times were measured on)."""
    import os

    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        name = "?"
    return f"{name}, {os.cpu_count()} cores"


def run(args: argparse.Namespace) -> int:
    prog = "python -m paged.bench replay"
    try:
        if min(args.num_requests, args.block_size, args.max_num_seqs) < 1:
            raise ValueError("--num-requests, --block-size and --max-num-seqs must be >= 1")
        text = args.fractions or ",".join(map(str, FRACTIONS_BY_FIGURE.get(args.figure, FRACTIONS)))
        fractions = sorted(float(f) for f in text.split(","))
        if len(fractions) < 2 or fractions[0] <= 0:
            raise ValueError(f"--fractions needs two or more positive numbers, got {args.fractions!r}")
        panel_list = panels(args.figure, args)

        def cost_for(model, block_size):
            return CostModel.build(model, args.gpu, args.num_gpus, block_size)

        for p in panel_list:  # the hardware fits the model and every request fits alone
            cost = cost_for(p.model, args.block_size)
            for s in p.systems:
                probe = make_engine(cost, s, p.prefix_caching)
                for i, (j, sp) in enumerate(zip(p.jobs, p.params)):
                    try:
                        probe.check_request(j.prompt, sp)
                    except ValueError as e:
                        raise ValueError(f"{p.name}, {s}: request {i}: {e}") from None
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(f"replay of the paper's Figure {args.figure}: the step05 engine's scheduler with a stand-in model, "
          f"on a modelled GPU (not measured on this machine); run on {_cpu()}")
    record = {"figure": args.figure, "gpu": args.gpu, "model": args.model, "num_requests": args.num_requests,
              "panels": {}}
    if args.figure == 18:
        print(cost_for(args.model or "opt-13b", 16).describe())
        record["panels"] = figure18(args, cost_for, panel_list)
        record["wall_s"] = time.perf_counter() - started
        print(f"wall time: {record['wall_s']:.0f} s")
        if args.plot:
            c = cost_for(args.model or "opt-13b", 16)
            plot18(record["panels"], args.plot, f"{c.model.name}, {c.num_gpus} x {c.gpu.name}")
        if args.json:
            print(json.dumps(record))
        return 0
    sweeps = {}
    for p in panel_list:
        cost = cost_for(p.model, args.block_size)
        print(f"\n== {p.name}: {e2e.describe(p.jobs)}")
        print(cost.describe())
        out = sweeps[p.name] = sweep(cost, p, fractions, args.seed, args.max_num_seqs)
        ratios = print_summary(p, out)
        low = out["low_load"]
        if args.figure in (12, 13):
            ok = PAPER_LOW_LOAD / LOW_LOAD_FACTOR <= low <= PAPER_LOW_LOAD * LOW_LOAD_FACTOR
            print(f"low load: paged's normalized latency at {out['rates'][0]} req/s is {low:.4f} s/token; the paper's "
                  f"curves start near {PAPER_LOW_LOAD} (by eye): within {LOW_LOAD_FACTOR:g}x: {ok}")
        record["panels"][p.name] = {"systems": _systems_json(out["summary"]), "paper": _paper_json(p.paper),
                                    "ratios": {s.replace("-", "_"): r for s, r in ratios.items()},
                                    "low_load_normalized_latency": low, "threshold": out["threshold"],
                                    "capacity": out["capacity"]}
    record["wall_s"] = time.perf_counter() - started
    first = next(iter(record["panels"].values()))
    record["systems"], record["paper"] = first["systems"], first["paper"]
    print(f"\nwall time: {record['wall_s']:.0f} s")
    if args.plot:
        plot(sweeps, panel_list, args)
        print(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps(record))
    return 0


def plot(sweeps: dict, panel_list: list[Panel], args) -> None:
    """One subplot per panel: normalized latency vs request rate (as the paper's Figures 12, 14, 16, 17)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"paged": "#c44e52", "orca-oracle": "#4c72b0", "orca-pow2": "#55a868", "orca-max": "#8172b2"}
    cols = min(3, len(panel_list))
    rows = -(-len(panel_list) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax, p in zip(axes.flat, panel_list):
        out = sweeps[p.name]
        for s, by_rate in out["results"].items():
            rs = sorted(by_rate)
            ax.plot(rs, [by_rate[r]["normalized_latency"] for r in rs], "o-", ms=3, color=colors[s],
                    label=f"{throughput.LABELS[s]} ({out['summary'][s]['mean_batched_requests']:.0f} batched)")
        ax.axhline(out["threshold"], color="gray", ls=":", lw=1)
        ax.set_ylim(0, 4 * out["threshold"])
        ax.set_title(p.name, fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panel_list):]:
        ax.axis("off")
    fig.suptitle(f"Figure {args.figure}, replayed on a modelled GPU ({panel_list[0].model}), "
                 f"{args.num_requests} requests", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    plt.close(fig)


def plot18(panels_out: dict, path: str, hardware: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for name, out in panels_out.items():
        bs = sorted(out["block_sizes"])
        ax.plot(bs, [out["block_sizes"][b]["normalized_latency"] for b in bs], "o-", ms=3,
                label=f"{name} at {out['rate']} req/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.legend(fontsize=8)
    ax.set_title(f"Figure 18b, replayed on a modelled GPU: {hardware}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
