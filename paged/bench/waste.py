"""KV cache waste of paged vs contiguous allocation: the paper's Figure 2.

Runs one length trace through an iteration-level FCFS schedule four times, on
the same KV capacity: paged blocks of B slots (vLLM) and contiguous chunks from
a buddy allocator under the three Orca reservation policies (Max, Pow2,
Oracle). For each it prints the time-averaged share of allocated-or-unusable
memory that holds token states, reservation, internal and external
fragmentation (definitions: ``paged.step01_allocator.waste``).

Examples:
    From a shell:

        python -m paged.bench waste
        python -m paged.bench waste --trace alpaca --plot alpaca.png
        python -m paged.bench waste --trace my_trace.jsonl --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paged.bench.traces import SYNTHETIC, TraceFormatError, clip_to_max_len, load_jsonl, synthetic_trace
from paged.step01_allocator.orca import POLICIES, simulate_orca
from paged.step01_allocator.paging import simulate_paged
from paged.step01_allocator.waste import CATEGORIES, InvalidTraceError, TraceRequest

SYSTEMS = ["paged"] + [f"orca_{p}" for p in POLICIES]
LABELS = {
    "paged": "vLLM (paged)",
    "orca_max": "Orca (Max)",
    "orca_pow2": "Orca (Pow2)",
    "orca_oracle": "Orca (Oracle)",
}
COLUMNS = {
    "token_states": "token states",
    "reservation": "reservation",
    "internal_fragmentation": "internal frag.",
    "external_fragmentation": "external frag.",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", default="sharegpt",
                        help="sharegpt | alpaca (synthetic, seeded) or PATH to a JSONL trace "
                             "of {\"prompt_len\": int, \"output_len\": int} rows")
    parser.add_argument("--num-requests", type=int, default=1000,
                        help="requests in a synthetic trace (default 1000)")
    parser.add_argument("--block-size", type=int, default=16, help="paged block size B (default 16)")
    parser.add_argument("--kv-slots", type=int, default=15700,
                        help="KV capacity in token slots (default 15700: OPT-13B on one A100-40GB)")
    parser.add_argument("--max-len", type=int, default=2048,
                        help="model's maximum sequence length, Orca (Max)'s reservation (default 2048)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic trace")
    parser.add_argument("--plot", metavar="PATH", help="write a stacked bar chart (PNG) like Figure 2")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def load_trace(args: argparse.Namespace) -> list[TraceRequest]:
    """The trace named by ``--trace``: synthetic by name, else a JSONL path."""
    if args.trace in SYNTHETIC:
        return synthetic_trace(args.trace, args.num_requests, args.seed, args.max_len)
    path = Path(args.trace)
    if not path.is_file():
        raise TraceFormatError(
            f"--trace {args.trace!r} is neither {' nor '.join(sorted(SYNTHETIC))} nor a file"
        )
    trace, dropped, clipped = clip_to_max_len(load_jsonl(path), args.max_len)
    if dropped or clipped:
        print(f"note: {dropped} prompts of >= {args.max_len} tokens dropped, "
              f"{clipped} outputs stopped at {args.max_len} tokens")
    return trace


# --8<-- [start:measure]
def measure(trace: list[TraceRequest], kv_slots: int, block_size: int, max_len: int) -> dict:
    """Every system on one trace, same schedule and capacity: ``{system: WasteReport}``."""
    reports = [simulate_paged(trace, kv_slots, block_size, max_len)]
    reports += [simulate_orca(trace, kv_slots, policy, max_len) for policy in POLICIES]
    return {r.system: r for r in reports}
# --8<-- [end:measure]


def format_table(systems: dict) -> str:
    """A fixed-width table: one row per system, one column per state (in %)."""
    head = f"{'system':<15}" + "".join(f"{COLUMNS[c]:>16}" for c in CATEGORIES)
    rows = [head, "-" * len(head)]
    for name, shares in systems.items():
        rows.append(f"{LABELS[name]:<15}" + "".join(f"{100 * shares[c]:>15.1f}%" for c in CATEGORIES))
    return "\n".join(rows)


def plot(systems: dict, title: str, path: str) -> None:
    """Stacked bars, one per system, bottom to top in ``CATEGORIES`` order.

    Draws on a bare ``Figure`` (no pyplot): a library must not switch its
    user's matplotlib backend, or a notebook's later plots stay empty.
    """
    from matplotlib.figure import Figure

    colors = ["#4c72b0", "#dd8452", "#c44e52", "#8c8c8c"]
    names = [n for n in ["orca_max", "orca_pow2", "orca_oracle", "paged"] if n in systems]
    fig = Figure(figsize=(6.4, 4.0))
    ax = fig.subplots()
    bottom = [0.0] * len(names)
    for cat, color in zip(CATEGORIES, colors):
        values = [100 * systems[n][cat] for n in names]
        ax.bar([LABELS[n] for n in names], values, bottom=bottom, color=color, label=COLUMNS[cat])
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, n in enumerate(names):  # the number that matters: useful memory
        share = 100 * systems[n]["token_states"]
        ax.text(i, share / 2, f"{share:.1f}%", ha="center", va="center", color="white", fontsize=9)
    ax.set_ylabel("KV cache usage (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args)
        reports = measure(trace, args.kv_slots, args.block_size, args.max_len)
    except (TraceFormatError, InvalidTraceError, OSError, ValueError) as e:
        print(f"python -m paged.bench waste: error: {e}", file=sys.stderr)
        return 2
    systems = {name: reports[name].shares() for name in SYSTEMS}
    name = args.trace if args.trace in SYNTHETIC else str(args.trace)
    print(f"trace {name}: {len(trace)} requests, mean prompt "
          f"{sum(r.prompt_len for r in trace) / len(trace):.1f}, mean output "
          f"{sum(r.output_len for r in trace) / len(trace):.1f}; KV capacity {args.kv_slots} "
          f"slots, block size {args.block_size}, max len {args.max_len}")
    print(format_table(systems))
    print("iterations: " + ", ".join(f"{LABELS[n]} {reports[n].iterations}" for n in SYSTEMS)
          + f"; paged preemptions (recompute): {reports['paged'].preemptions}")
    if args.plot:
        plot(systems, f"KV cache usage, {name} trace (B={args.block_size}, "
                      f"{args.kv_slots} slots)", args.plot)
        print(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps({"trace": name, "block_size": args.block_size, "systems": systems}))
    return 0
