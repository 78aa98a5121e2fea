"""Swap or recompute: the cost of preemption (paper §4.5, §7.3, Figure 19).

Two measurements, both through step05's own code:

* **micro** (Figure 19a, ``paged.bench.preemption_micro``) — ``--num-seqs``
  sequences of ``--seq-len`` tokens each, for every block size of
  ``--block-sizes``: the time to swap their blocks out and back in (host
  memory copies) against the time to recompute them (one prefill forward
  pass), ``--repeats`` times after one warm-up, medians.

* **end to end** (Figure 19b, ``paged.bench.preemption_workload``) — a
  synthetic ShareGPT-like trace with every length divided by
  ``--length-scale``, all requests at t = 0, greedy, on a KV pool of
  ``--pool-fraction`` of the blocks they need at full length; the same
  requests under ``swap``, ``recompute`` and ``auto``, interleaved,
  ``--rounds`` times (medians): normalized latency, throughput, preemptions
  by kind, tokens through the model, blocks moved, iterations, and a digest
  of the outputs, which must be identical in the three modes.

The model: ``--model`` if given; else the bundled demo model
(``paged.demo.DEFAULT_MODEL_PATH``) if it exists; else a random LLaMA of the
demo model's shape (``paged.models.random_llama``). The micro benchmark runs
it in float32, the end to end one in float64 (so that greedy tokens cannot
flip under recomputation).

Time is the CPU time of this process by default (``--clock cpu``): with
one torch thread it equals the elapsed time on an idle machine, and on a
shared one it leaves out the time the OS gives to other processes. On a GPU
(``--device cuda``, micro only) elapsed time is used, after a synchronize.

The paper (OPT-13B, A100, PCIe): recompute costs the same at every block
size; swapping is slow for small blocks (many small PCIe transfers) and
beats recomputation for large ones; end to end the two are within 20%. On a
CPU "swap" is a host memory copy and recomputation is CPU compute, so the
balance is different: see ``docs/step05_preemption.md``.

Examples:
    From a shell:

        python -m paged.bench preemption
        python -m paged.bench preemption --plot fig19.png --timeline timeline.png --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from paged.bench.preemption_micro import micro
from paged.bench.preemption_plots import plot_figure19, plot_timeline
from paged.bench.preemption_workload import end_to_end, pool_blocks, record_timeline, scaled_trace
from paged.models.random_llama import demo_shaped_llama
from paged.step03_attention.backends import resolve_backend

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}  # see --clock


def model_folder(requested: str | None, tmp: str) -> tuple[Path, str]:
    """The checkpoint to use and a line saying which it is."""
    if requested:
        return Path(requested), f"model: {requested}"
    from paged.demo import DEFAULT_MODEL_PATH

    if (DEFAULT_MODEL_PATH / "config.json").exists():
        return DEFAULT_MODEL_PATH, f"model: the bundled demo model ({DEFAULT_MODEL_PATH})"
    return demo_shaped_llama(tmp)


# -- command line -------------------------------------------------------------------
def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--block-sizes", type=_ints, default=list(BLOCK_SIZES),
                        help="micro: comma-separated block sizes (default 1,2,...,256)")
    parser.add_argument("--num-seqs", type=int, default=8, help="micro: sequences in the group (default 8)")
    parser.add_argument("--seq-len", type=int, default=256, help="micro: tokens per sequence (default 256)")
    parser.add_argument("--repeats", type=int, default=5, help="micro: timed repeats after a warm-up (default 5)")
    parser.add_argument("--requests", type=int, default=48, help="end to end: requests (default 48)")
    parser.add_argument("--length-scale", type=int, default=8,
                        help="end to end: divide the trace's lengths by this (default 8)")
    parser.add_argument("--pool-fraction", type=float, default=0.15,
                        help="end to end: KV pool as a fraction of the full demand (default 0.15)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="end to end: runs of each mode, interleaved; medians reported (default 3)")
    parser.add_argument("--e2e-block-size", type=int, default=16, help="end to end: block size (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace, the prompts and the model")
    parser.add_argument("--model", default=None, help="checkpoint folder (default: demo model or a random one)")
    parser.add_argument("--device", default="cpu", help="micro: device of the KV cache and model (default cpu)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: CPU time of this process, robust to other load on a shared machine "
                             "(default; equals wall time on an idle one with --threads 1); wall: elapsed time "
                             "(always on a GPU)")
    parser.add_argument("--plot", metavar="PATH", help="write Figure 19's two panels (PNG)")
    parser.add_argument("--timeline", metavar="PATH",
                        help="write the queue / block timeline of a small starved run (PNG)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def run(args: argparse.Namespace) -> int:
    if min(args.num_seqs, args.seq_len, args.repeats, args.requests, args.rounds, args.length_scale, args.e2e_block_size,
           args.threads) < 1 or not 0 < args.pool_fraction <= 1:
        print("python -m paged.bench preemption: error: sizes must be >= 1 and 0 < --pool-fraction <= 1",
              file=sys.stderr)
        return 2
    from paged.models import load_model

    clock = CLOCKS["wall" if args.device != "cpu" else args.clock]
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder, which = model_folder(args.model, tmp)
        fast = load_model(folder, dtype=torch.float32, device=args.device)
        exact = load_model(folder, dtype=torch.float64)
    print(which)
    print(f"torch threads: {args.threads}; attention backend: {resolve_backend(args.device)}; "
          f"clock: {'process CPU time' if clock is time.process_time else 'wall time'}")

    print(f"\n(a) micro, {args.device}, float32: a group of {args.num_seqs} sequences x {args.seq_len} tokens; "
          f"median of {args.repeats} after a warm-up")
    head = (f"{'block size':>10}{'blocks':>8}{'swap out ms':>13}{'swap in ms':>12}{'swap ms':>10}"
            f"{'recompute ms':>14}{'recompute/swap':>16}{'bookkeeping ms':>16}")
    print(head)
    print("-" * len(head))
    micro_rows = []
    for bs in args.block_sizes:
        r = micro(fast, bs, args.num_seqs, args.seq_len, args.repeats, args.seed, clock)
        micro_rows.append(r)
        print(f"{bs:>10}{r['blocks']:>8}{r['swap_out_ms']:>13.2f}{r['swap_in_ms']:>12.2f}{r['swap_ms']:>10.2f}"
              f"{r['recompute_ms']:>14.2f}{r['recompute_ms'] / r['swap_ms']:>15.1f}x{r['bookkeeping_ms']:>16.2f}")
    cheaper = ["swap" if r["swap_ms"] < r["recompute_ms"] else "recompute" for r in micro_rows]
    flips = [micro_rows[i]["block_size"] for i in range(1, len(cheaper)) if cheaper[i] != cheaper[i - 1]]
    listing = ", ".join(f"{r['block_size']}: {c}" for r, c in zip(micro_rows, cheaper))
    print(f"cheaper: {listing}"
          + (f"; crossover at block size {', '.join(map(str, flips))}" if flips else "; no crossover"))

    trace = scaled_trace(args.requests, args.seed, args.length_scale)
    bs = args.e2e_block_size
    num_blocks = pool_blocks(trace, bs, args.pool_fraction)
    demand = sum(-(-r.total_len // bs) for r in trace)
    print(f"\n(b) end to end, cpu, float64: {len(trace)} ShareGPT-like requests, lengths / {args.length_scale} "
          f"(mean prompt {sum(r.prompt_len for r in trace) / len(trace):.1f}, mean output "
          f"{sum(r.output_len for r in trace) / len(trace):.1f}), all arriving at t = 0, greedy; block size "
          f"{bs}, KV pool {num_blocks} blocks = {num_blocks / demand:.0%} of the {demand} needed at full length; "
          f"median of {args.rounds} interleaved rounds")
    e2e = end_to_end(exact, trace, bs, num_blocks, args.seed, args.rounds, clock)
    head = (f"{'mode':>10}{'norm. latency s/tok':>21}{'throughput tok/s':>18}{'swap-outs':>11}{'recomputes':>12}"
            f"{'tokens computed':>17}{'blocks moved':>14}{'iterations':>12}{'time s':>9}{'outputs':>18}")
    print(head)
    print("-" * len(head))
    for mode, r in e2e.items():
        p = r["preemptions"]
        print(f"{mode:>10}{r['normalized_latency_s']:>21.4f}{r['throughput_tok_s']:>18.1f}{p['swap']:>11}"
              f"{p['recompute']:>12}{r['tokens_computed']:>17}{r['blocks_moved']:>14}{r['iterations']:>12}{r['time_s']:>9.1f}{r['outputs_sha256']:>18}")
    same = all(r["outputs_identical"] for r in e2e.values())
    base = e2e["recompute"]["normalized_latency_s"]
    print(f"prompt + output tokens of the trace: {sum(r.total_len for r in trace)}")
    print(f"outputs identical across modes: {same}; normalized latency relative to recompute: "
          + ", ".join(f"{m} {r['normalized_latency_s'] / base:.2f}" for m, r in e2e.items()))

    result = {"micro": [{"block_size": r["block_size"], "swap_ms": r["swap_ms"], "recompute_ms": r["recompute_ms"]}
                        for r in micro_rows], "e2e": e2e}
    if args.plot:
        plot_figure19({"micro": micro_rows, "e2e": e2e}, args.plot,
                      f"Figure 19 on a CPU: {args.num_seqs}x{args.seq_len} tokens (a); {len(trace)} requests (b)")
        print(f"figure written to {args.plot}")
    if args.timeline:
        small = trace[:10]
        blocks = pool_blocks(small, bs, 0.3)
        runs = record_timeline(exact, small, bs, blocks, args.seed, swap_space=2**30)
        plot_timeline(runs, args.timeline, f"the first {len(small)} requests, block size {bs}, "
                      f"{blocks} device blocks: engine.stats() after every iteration")
        print(f"timeline written to {args.timeline}")
    if not same:
        print("error: the outputs differ between preemption modes", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    return 0 if same else 1
