"""Shared prefix, prefix caching on vs off: prefill computed, blocks held, throughput (paper §6.4, Figure 16).

The paper's workload is few-shot translation: every request starts with the
same instruction and examples, 80 tokens for one shot and 341 for five, then
its own sentence. Here a tiny random LLaMA (``paged.models.random_llama``,
as in ``paged.bench sharing``) serves ``--requests`` requests of ``prefix + a distinct suffix``
(``--suffix-len`` random tokens each) with ``--max-tokens`` greedy output
tokens, through ``SharingEngine(enable_prefix_caching=True)`` and ``=False``
— the same requests, side by side in one process, alternating which goes
first over ``--repeats`` rounds. As in the paper, the prefix is registered
ahead of time: each engine first serves the bare prefix once (untimed, not
counted), which fills the cache of the caching engine and changes nothing for
the other.

Reported per prefix length: prompt tokens computed (``engine.scheduler.prompt_tokens_total``),
blocks in use (mean and peak over iterations), wall time and throughput
(median over rounds), and whether the greedy outputs of the two engines are
identical token for token.

The paper compares vLLM sharing the prefix against Orca (Oracle) on LLaMA-13B
and an A100 and reports 1.67x (1-shot) and 3.58x (5-shot) throughput; here the
baseline is the same engine with caching off, so the ratio isolates the
prefix mechanism, on a model so small that per-iteration overheads weigh
more than on a GPU.

Examples:
    From a shell:

        python -m paged.bench prefix
        python -m paged.bench prefix --requests 16 --repeats 1 --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

from paged.bench._threads import torch_threads
from paged.bench.sharing import blocks_in_plan, measure_engine
from paged.models.random_llama import load_random_llama
from paged.step04_sharing import SamplingParams, SharingEngine

PREFIXES = {"1-shot": 80, "5-shot": 341}
PAPER_SPEEDUP = {80: 1.67, 341: 3.58}  # vLLM vs Orca (Oracle), Figure 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=48, help="requests per prefix (default 48)")
    parser.add_argument("--suffix-len", type=int, default=16, help="distinct tokens after the prefix (default 16)")
    parser.add_argument("--max-tokens", type=int, default=8, help="greedy tokens generated (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of both engines (default 3)")
    parser.add_argument("--block-size", type=int, default=16, help="block size B (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    parser.add_argument("--attention-backend", default=None,
                        help="reference | blockwise | cpu (default: the fastest available)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--plot", metavar="PATH", help="write a bar chart like Figure 16 (PNG)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


# --8<-- [start:serve]
def serve(model, prefix: list[int], prompts: list[list[int]], caching: bool, args) -> dict:
    """One engine serving the bare prefix (warm-up), then every prompt at once, timed."""
    num_blocks = (len(prompts) + 1) * -(-(len(prompts[0]) + args.max_tokens) // args.block_size)
    engine = SharingEngine(model, block_size=args.block_size, num_blocks=num_blocks,
                           enable_prefix_caching=caching, attention_backend=args.attention_backend)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engine.add_request("prefix", prefix, SamplingParams(temperature=0.0, max_tokens=1))
    measure_engine(engine)  # the provider registers the prefix: untimed, not counted
    computed_before = engine.scheduler.prompt_tokens_total
    outputs: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, greedy)
    t0 = time.perf_counter()
    usage = []

    def observe(engine, plan, results):  # the blocks the forward pass held
        usage.append(blocks_in_plan(plan)[0])

    engine.add_observer(observe)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    seconds = time.perf_counter() - t0
    engine.remove_observer(observe)
    return {
        "prefill_tokens": engine.scheduler.prompt_tokens_total - computed_before,
        "blocks_mean": sum(usage) / len(usage),
        "blocks_peak": max(usage),
        "seconds": seconds,
        "outputs": [outputs[f"r{i}"] for i in range(len(prompts))],
    }
# --8<-- [end:serve]


def measure(model, prefix_len: int, args) -> dict:
    """Both engines on the same requests, ``args.repeats`` rounds; medians of the times."""
    rng = random.Random(args.seed + prefix_len)
    vocab = model.config.vocab_size
    prefix = [rng.randrange(3, vocab) for _ in range(prefix_len)]
    prompts = [prefix + [rng.randrange(3, vocab) for _ in range(args.suffix_len)] for _ in range(args.requests)]
    runs = {False: [], True: []}
    for r in range(args.repeats):
        for caching in ((False, True) if r % 2 == 0 else (True, False)):
            runs[caching].append(serve(model, prefix, prompts, caching, args))
    out = {}
    for caching, rs in runs.items():
        seconds = statistics.median(x["seconds"] for x in rs)
        out["on" if caching else "off"] = {
            "prefill_tokens": rs[0]["prefill_tokens"], "blocks_mean": rs[0]["blocks_mean"],
            "blocks_peak": rs[0]["blocks_peak"], "seconds": seconds,
            "requests_per_s": args.requests / seconds, "outputs": rs[0]["outputs"],
        }
    on, off = out["on"], out["off"]
    return {
        "prefix_tokens": prefix_len,
        "speedup": on["requests_per_s"] / off["requests_per_s"],
        "prefill_tokens_ratio": on["prefill_tokens"] / off["prefill_tokens"],
        "identical": sum(a == b for a, b in zip(on.pop("outputs"), off.pop("outputs"))),
        "on": on,
        "off": off,
    }


def plot(cases: list[dict], path: str) -> None:
    """Per prefix: prefill tokens, mean blocks and throughput with caching, relative to without."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.6))  # no pyplot: the caller's backend is left alone
    ax = fig.subplots()
    metrics = [("prefill tokens computed", lambda c: c["prefill_tokens_ratio"]),
               ("blocks held (mean)", lambda c: c["on"]["blocks_mean"] / c["off"]["blocks_mean"]),
               ("throughput", lambda c: c["speedup"])]
    colors = ["#4c72b0", "#55a868", "#dd8452"]
    for g, case in enumerate(cases):
        for i, ((label, f), color) in enumerate(zip(metrics, colors)):
            v = f(case)
            ax.bar(g * 4 + i, v, color=color, width=0.8, label=label if g == 0 else None)
            ax.text(g * 4 + i, v + 0.05, f"{v:.2f}×", ha="center", fontsize=8)
        ax.plot([g * 4 + 1.6, g * 4 + 2.4], [PAPER_SPEEDUP[case["prefix_tokens"]]] * 2, color="black", lw=2,
                label="paper's throughput gain (vs Orca)" if g == 0 else None)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks([g * 4 + 1 for g in range(len(cases))])
    ax.set_xticklabels([f"{c['prefix_tokens']}-token prefix" for c in cases])
    ax.set_ylabel("with caching / without")
    ax.set_title("Figure 16 · shared prefix, prefix caching on vs off", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    ax.set_ylim(0, max(4.0, 1.2 * max(c["speedup"] for c in cases)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args: argparse.Namespace) -> int:
    if min(args.requests, args.suffix_len, args.max_tokens, args.repeats, args.block_size, args.threads) < 1:
        print("python -m paged.bench prefix: error: every count must be >= 1", file=sys.stderr)
        return 2
    with torch_threads(args.threads):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    model = load_random_llama()
    c = model.config
    print(f"tiny random LLaMA ({c.num_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}, float32); "
          f"{args.requests} requests of prefix + {args.suffix_len} distinct tokens, {args.max_tokens} greedy "
          f"tokens each; block size {args.block_size}; median of {args.repeats} rounds")
    cases = [measure(model, n, args) for n in PREFIXES.values()]
    head = (f"{'prefix':<14}{'caching':>8}{'prefill tokens':>16}{'blocks mean':>13}{'peak':>6}"
            f"{'seconds':>9}{'req/s':>8}")
    print(head)
    print("-" * len(head))
    for case in cases:
        for key in ("off", "on"):
            m = case[key]
            print(f"{case['prefix_tokens']:>4} tokens    {key:>8}{m['prefill_tokens']:>16}"
                  f"{m['blocks_mean']:>13.1f}"
                  f"{m['blocks_peak']:>6}{m['seconds']:>9.2f}{m['requests_per_s']:>8.1f}")
        print(f"{'':<14}{'ratio':>8}{case['prefill_tokens_ratio']:>16.3f}"
              f"{case['on']['blocks_mean'] / case['off']['blocks_mean']:>13.3f}"
              f"{case['on']['blocks_peak'] / case['off']['blocks_peak']:>6.2f}"
              f"{case['on']['seconds'] / case['off']['seconds']:>9.3f}{case['speedup']:>8.2f}"
              f"   (paper: {PAPER_SPEEDUP[case['prefix_tokens']]}x vs Orca)")
        print(f"{'':<14}greedy outputs identical with and without caching: "
              f"{case['identical']} of {args.requests} requests")
    if args.plot:
        plot(cases, args.plot)
        print(f"figure written to {args.plot}")
    if args.json:
        print(json.dumps({"cases": [{"prefix_tokens": c["prefix_tokens"], "speedup": c["speedup"],
                                     "prefill_tokens_ratio": c["prefill_tokens_ratio"]} for c in cases]}))
    return 0
