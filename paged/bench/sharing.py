"""Memory saved by sharing KV blocks: parallel sampling and beam search (paper §6.3, Figure 15).

The paper's metric: at every iteration, the blocks the live sequences would
need if nothing were shared (each sequence holding its own
``ceil(tokens / B)`` blocks) against the blocks actually in use; the saving
is ``1 - mean(used) / mean(needed)`` over the run. Both sums are sums over
requests (without preemption one request's blocks do not depend on the
others), so the figure does not depend on how requests overlap in time.

* **Parallel sampling** (``n`` = 2, 4, 6) is replayed with the real step04
  ``SharingKVManager``: the prompt is allocated once, ``n - 1`` children fork
  from it, then every sample appends its own tokens one iteration at a time
  (copy-on-write on the first write into the shared last prompt block), for
  the trace's output length. All samples of a request run to the trace's
  output length (no early EOS). No model is needed: only block accounting.
  ``tests/step04_sharing/test_bench_sharing.py`` checks that the replay gives
  the same sums as the real engine.
* **Beam search** (width ``k`` = 2, 4, 6) runs a real model through
  ``SharingEngine``: a tiny random LLaMA (``paged.models.random_llama``: 2
  layers, hidden 64, vocab 256, context 2048) built in-process,
  on the first ``--beam-requests`` requests of the same trace (prompt:
  random token ids of the trace's length; ``max_tokens`` = the trace's output
  length, EOS ignored). An engine observer reads every executed ``StepPlan``:
  the blocks its sequences' tables map (each distinct block once: used) and
  the sum of their lengths (needed), as they were after the plan's
  allocations and copy-on-writes.

The paper (OPT-13B, real traces): parallel 6.1–9.8% (Alpaca), 16.2–30.5%
(ShareGPT); beam search 37.6–55.2% (Alpaca), 44.3–66.3% (ShareGPT).

Examples:
    From a shell:

        python -m paged.bench sharing
        python -m paged.bench sharing --trace alpaca --plot fig15_alpaca.png --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from paged.bench._threads import torch_threads
from paged.bench.traces import SYNTHETIC, random_prompts, synthetic_trace
from paged.models.random_llama import load_random_llama
from paged.step01_allocator.waste import TraceRequest
from paged.step04_sharing import SamplingParams, SharingEngine, SharingKVManager

WIDTHS = (2, 4, 6)
PAPER = {  # Figure 15 of the paper, % saved, over widths 2..6
    "alpaca": {"parallel": (6.1, 9.8), "beam": (37.6, 55.2)},
    "sharegpt": {"parallel": (16.2, 30.5), "beam": (44.3, 66.3)},
}
MAX_LEN = 2048  # the traces' longest prompt + output, and the tiny model's context


@dataclass
class Usage:
    """Blocks in use and blocks needed without sharing, summed over iterations."""

    used: int = 0
    needed: int = 0
    iterations: int = 0

    def add(self, used: int, needed: int) -> None:
        self.used += used
        self.needed += needed
        self.iterations += 1

    @property
    def saved(self) -> float:
        """Fraction of blocks saved, ``1 - mean(used) / mean(needed)``."""
        return 1.0 - self.used / self.needed if self.needed else 0.0


# --8<-- [start:replay]
def replay_parallel(trace: list[TraceRequest], n: int, block_size: int) -> Usage:
    """Parallel sampling's block accounting with the real ``SharingKVManager``, one request at a time.

    Iteration 0 computes the prompt and forks it; each later iteration gives
    every sample one more token slot (as the engine does for the token it
    sampled last), ``output_len - 1`` times.
    """
    most = max(n * -(-r.total_len // block_size) for r in trace)
    bm = SharingKVManager(most, block_size, enable_prefix_caching=False)
    usage = Usage()

    def measure(samples):
        usage.add(bm.allocator.num_used, sum(len(t.blocks) for t in samples))

    for r in trace:
        first = bm.new_table()
        bm.allocate_prompt(first, [0] * r.prompt_len)
        samples = [first] + [first.fork() for _ in range(n - 1)]
        measure(samples)
        for _ in range(r.output_len - 1):
            for table in samples:
                table.append(1)  # copy-on-write if its last block is still shared
                table.take_copies()
            measure(samples)
        for table in samples:
            table.free()
    assert bm.allocator.num_used == 0, "the replay leaked blocks"
    return usage
# --8<-- [end:replay]


# --8<-- [start:engine]
def blocks_in_plan(plan) -> tuple[int, int]:
    """``(blocks used, blocks needed without sharing)`` by the sequences of one ``StepPlan``.

    A block mapped by several tables is used once but needed by each of them.
    The plan holds every running sequence's table as it was when the runner ran
    it (after the iteration's new blocks and copy-on-writes), except the
    samples forked from a prompt computed in this plan (``fanout``): each maps
    its parent's table.
    """
    tables = dict(zip(plan.seq_ids, plan.block_tables))
    needed = sum(map(len, tables.values())) + sum(len(tables[parent]) for parent, _, _ in plan.fanout)
    used = len({block for table in tables.values() for block in table})
    return used, needed


def measure_engine(engine: SharingEngine) -> Usage:
    """Run ``engine`` until it is idle, adding up the block usage of every plan it executes."""
    usage = Usage()

    def observe(engine, plan, results):
        usage.add(*blocks_in_plan(plan))

    engine.add_observer(observe)
    try:
        while engine.has_unfinished():
            engine.step()
    finally:
        engine.remove_observer(observe)
    return usage
# --8<-- [end:engine]


def run_beam(model, trace: list[TraceRequest], k: int, block_size: int, seed: int = 0,
             attention_backend: str | None = None) -> Usage:
    """Beam search of width ``k`` on every request of ``trace`` at once, through ``SharingEngine``."""
    num_blocks = sum(k * -(-r.total_len // block_size) + k for r in trace)
    engine = SharingEngine(model, block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=False,
                           attention_backend=attention_backend, max_num_seqs=max(256, k * len(trace)))
    for i, (r, prompt) in enumerate(zip(trace, random_prompts([r.prompt_len for r in trace], model.config.vocab_size, seed))):
        engine.add_request(f"beam-{i}", prompt, SamplingParams(
            use_beam_search=True, n=k, temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
    usage = measure_engine(engine)
    assert engine.scheduler.kv.allocator.num_used == 0, "the engine leaked blocks"
    return usage


# -- command line ----------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", choices=sorted(SYNTHETIC), default="sharegpt",
                        help="synthetic length trace (default sharegpt)")
    parser.add_argument("--requests", type=int, default=500,
                        help="requests replayed for parallel sampling (default 500)")
    parser.add_argument("--beam-requests", type=int, default=16,
                        help="of those, the first ones run with beam search on the tiny model (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace and of the prompts")
    parser.add_argument("--block-size", type=int, default=16, help="block size B (default 16)")
    parser.add_argument("--attention-backend", default=None,
                        help="reference | blockwise | cpu (default: the fastest available)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: a tiny model gains nothing from more)")
    parser.add_argument("--plot", metavar="PATH", help="write a bar chart like Figure 15 (PNG)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def plot(result: dict, trace: str, path: str) -> None:
    """Two groups of bars (parallel sampling, beam search) beside the paper's range."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6))  # no pyplot: the caller's backend is left alone
    ax = fig.subplots()
    colors = {"parallel": "#4c72b0", "beam": "#dd8452"}
    for g, kind in enumerate(("parallel", "beam")):
        xs = [g * 4 + i for i in range(len(WIDTHS))]
        values = [100 * result[kind][str(w)] for w in WIDTHS]
        ax.bar(xs, values, color=colors[kind], width=0.8,
               label=f"{'parallel sampling' if kind == 'parallel' else 'beam search'} (ours)")
        for x, v in zip(xs, values):
            ax.text(x, v + 1, f"{v:.1f}", ha="center", fontsize=8)
        lo, hi = PAPER[trace][kind]
        ax.fill_between([xs[0] - 0.5, xs[-1] + 0.5], lo, hi, color="grey", alpha=0.25,
                        label="paper's range" if g == 0 else None)
    ax.set_xticks([g * 4 + i for g in range(2) for i in range(len(WIDTHS))])
    ax.set_xticklabels([f"n={w}" for w in WIDTHS] + [f"k={w}" for w in WIDTHS])
    ax.set_ylabel("memory saved by sharing (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Figure 15 · {trace} trace", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args: argparse.Namespace) -> int:
    if args.requests < 1 or not 1 <= args.beam_requests or args.block_size < 1 or args.threads < 1:
        print("python -m paged.bench sharing: error: --requests, --beam-requests, --block-size and "
              "--threads must be >= 1", file=sys.stderr)
        return 2
    with torch_threads(args.threads):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    trace = synthetic_trace(args.trace, args.requests, args.seed, MAX_LEN)
    beam_trace = trace[: args.beam_requests]
    print(f"trace {args.trace}: {len(trace)} requests (mean prompt "
          f"{sum(r.prompt_len for r in trace) / len(trace):.1f}, mean output "
          f"{sum(r.output_len for r in trace) / len(trace):.1f}), block size {args.block_size}")
    result: dict = {"parallel": {}, "beam": {}, "trace": args.trace}
    rows = []
    for n in WIDTHS:
        u = replay_parallel(trace, n, args.block_size)
        result["parallel"][str(n)] = u.saved
        rows.append(("parallel", n, u, None))
    model = load_random_llama()
    c = model.config
    print(f"beam search: tiny random LLaMA ({c.num_layers} layers, hidden {c.hidden_size}, vocab "
          f"{c.vocab_size}, float32) on the first {len(beam_trace)} requests, all at once")
    for k in WIDTHS:
        t0 = time.perf_counter()
        u = run_beam(model, beam_trace, k, args.block_size, args.seed, args.attention_backend)
        result["beam"][str(k)] = u.saved
        rows.append(("beam", k, u, time.perf_counter() - t0))
    head = (f"{'':<18}{'width':>6}{'iterations':>12}{'blocks needed':>15}{'blocks used':>13}"
            f"{'saved':>9}{'paper':>14}")
    print("blocks needed / used: summed over iterations (block-iterations); parallel sampling "
          "replays one request at a time, beam search runs them together")
    print(head)
    print("-" * len(head))
    for kind, w, u, secs in rows:
        lo, hi = PAPER[args.trace][kind]
        name = "parallel sampling" if kind == "parallel" else "beam search"
        print(f"{name:<18}{w:>6}{u.iterations:>12}{u.needed:>15}{u.used:>13}"
              f"{100 * u.saved:>8.1f}%{f'{lo}–{hi}%':>14}"
              + (f"   ({secs:.1f} s)" if secs is not None else ""))
    if args.plot:
        plot(result, args.trace, args.plot)
        print(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps(result))
    return 0
