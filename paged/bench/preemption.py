"""Swap or recompute: the cost of preemption (paper §4.5, §7.3, Figure 19).

Two measurements, both through step05's own code:

* **micro** (Figure 19a) — ``--num-seqs`` sequences of ``--seq-len`` tokens
  each, for every block size of ``--block-sizes``. A ``PreemptingEngine``
  computes their prompts once; then, ``--repeats`` times after one warm-up
  (medians reported):

  - *swap* = ``SwapSpace.swap_out`` + the runner's ``execute_memory_ops`` on a
    plan with those ``blocks_to_swap_out`` (``copy_between`` device → host),
    then ``swap_in`` + ``execute_memory_ops`` back (host → device): the block
    moves the engine makes. ``swap_ms`` is the two copies; the allocator
    bookkeeping of ``swap_out`` / ``swap_in`` (a Python loop over the table
    entries) is timed apart and printed. The first round trip is checked:
    the K/V come back bitwise equal.
  - *recompute* = ``runner.execute`` of the captured prefill ``StepPlan`` of
    the same tokens: one forward pass with paged attention, K/V written to
    their slots, one token sampled per sequence — what a recomputed group
    costs on resume.

* **end to end** (Figure 19b) — a synthetic ShareGPT-like trace
  (``paged.bench.traces``) with every length divided by ``--length-scale``
  (rounded up), so it runs in about a minute on two cores. All requests
  arrive at once (t = 0), greedy, EOS ignored, ``max_tokens`` = the trace's
  output length. The KV pool holds ``--pool-fraction`` of the blocks all
  requests would need at their full length (at least the longest request
  plus one block), which forces many preemptions; the host pool is ample.
  The same requests run under ``swap``, ``recompute`` and ``auto``, interleaved,
  ``--rounds`` times (medians); reported:
  normalized latency (mean over requests of finish time / output tokens, the
  paper's metric), throughput (output tokens / makespan), preemptions by
  kind, tokens through the model (recomputation adds some), blocks moved
  to and from the host, iterations, and a digest of the outputs, which must be identical in
  the three modes (float64 model: recomputation gives the same values as
  the first pass, so greedy tokens cannot flip).

The model: ``--model`` if given; else the bundled demo model
(``paged.demo.DEFAULT_MODEL_PATH``) if it exists; else a random LLaMA of the
demo model's shape (6 layers, hidden 256, 8 query / 2 KV heads, MLP 688,
vocab 4096) written in-process with ``transformers`` and loaded with
``paged.models.load_model``. The micro benchmark runs it in float32, the end
to end one in float64 (see above).

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
    python -m paged.bench preemption
    python -m paged.bench preemption --plot fig19.png --timeline timeline.png --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from paged.bench.traces import synthetic_trace
from paged.step01_allocator.waste import TraceRequest
from paged.step03_attention import StepPlan
from paged.step03_attention.backends import resolve_backend
from paged.step05_preemption import PREEMPTION_MODES, PreemptingEngine, SamplingParams

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEMO_SHAPE = dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=2)
MAX_LEN = 2048


# -- the model -------------------------------------------------------------------
def random_llama(path: str | Path, seed: int = 0, **shape) -> Path:
    """Write a random LLaMA (``DEMO_SHAPE`` unless overridden) with ``save_pretrained``."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    config = transformers.LlamaConfig(**{**DEMO_SHAPE, **shape}, max_position_embeddings=MAX_LEN,
                                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return Path(path)


def model_folder(requested: str | None, tmp: str) -> tuple[Path, str]:
    """The checkpoint to use and a line saying which it is."""
    if requested:
        return Path(requested), f"model: {requested}"
    from paged.demo import DEFAULT_MODEL_PATH

    if (DEFAULT_MODEL_PATH / "config.json").exists():
        return DEFAULT_MODEL_PATH, f"model: the bundled demo model ({DEFAULT_MODEL_PATH})"
    s = DEMO_SHAPE
    return random_llama(tmp), (
        f"model: random LLaMA of the demo model's shape ({s['num_hidden_layers']} layers, hidden "
        f"{s['hidden_size']}, {s['num_attention_heads']}/{s['num_key_value_heads']} heads, MLP "
        f"{s['intermediate_size']}, vocab {s['vocab_size']}), built in-process")


def random_prompts(lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    """Token ids 3.. (clear of BOS / EOS) of the given lengths."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in lengths]


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}  # see --clock


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- (a) micro: one group's swap out + in against its recomputation ---------------
# --8<-- [start:micro]
def micro(model, block_size: int, num_seqs: int, seq_len: int, repeats: int, seed: int = 0,
          clock=time.perf_counter) -> dict:
    """Median milliseconds to swap ``num_seqs x seq_len`` tokens out and in, and to recompute them."""
    blocks = num_seqs * -(-seq_len // block_size)
    engine = PreemptingEngine(model, block_size=block_size, num_blocks=blocks, enable_prefix_caching=False,
                              max_num_seqs=num_seqs, max_num_batched_tokens=num_seqs * seq_len,
                              swap_space=blocks * _bytes_per_block(model, block_size), seed=seed)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(random_prompts([seq_len] * num_seqs, model.config.vocab_size, seed)):
        engine.add_request(f"seq{i}", prompt, greedy)
    prefill = _first_plan(engine)  # computes the prompts; keeps their plan
    runner, kv, device = engine.runner, engine.kv_cache, engine.kv_cache.device
    tables = [r.seqs[0].block_table for r in engine.running]
    times = {"swap_out": [], "swap_in": [], "bookkeeping": [], "recompute": []}
    for rep in range(repeats + 1):  # the first round is the warm-up (and the check)
        before = kv.data[:, :, [b for t in tables for b in t.blocks]].clone() if rep == 0 else None
        t0 = clock()
        out = engine.swap.swap_out(tables, engine.allocator)
        t1 = clock()
        runner.execute_memory_ops(StepPlan(blocks_to_swap_out=out))
        _sync(device)
        t2 = clock()
        back = engine.swap.swap_in(tables, engine.allocator)
        t3 = clock()
        runner.execute_memory_ops(StepPlan(blocks_to_swap_in=back))
        _sync(device)
        t4 = clock()
        runner.execute(prefill)
        _sync(device)
        t5 = clock()
        if rep == 0:
            after = kv.data[:, :, [b for t in tables for b in t.blocks]]
            if not torch.equal(before, after):
                raise AssertionError(f"block size {block_size}: K/V changed across a swap round trip")
            continue
        for key, secs in (("swap_out", t2 - t1), ("swap_in", t4 - t3), ("bookkeeping", t1 - t0 + t3 - t2),
                          ("recompute", t5 - t4)):
            times[key].append(1e3 * secs)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"block_size": block_size, "blocks": blocks, "swap_out_ms": med["swap_out"],
            "swap_in_ms": med["swap_in"], "swap_ms": med["swap_out"] + med["swap_in"],
            "bookkeeping_ms": med["bookkeeping"], "recompute_ms": med["recompute"]}
# --8<-- [end:micro]


def _bytes_per_block(model, block_size: int) -> int:
    c = model.config
    itemsize = next(model.model.parameters()).element_size()
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * itemsize


def _first_plan(engine: PreemptingEngine) -> StepPlan:
    """Run one engine step and return the plan its runner executed."""
    seen, execute = [], engine.runner.execute

    def hooked(plan):
        seen.append(plan)
        return execute(plan)

    engine.runner.execute = hooked
    try:
        engine.step()
    finally:
        engine.runner.execute = execute
    return seen[0]


# -- (b) end to end: a starved ShareGPT-like workload in each mode -----------------
def scaled_trace(num_requests: int, seed: int, length_scale: int) -> list[TraceRequest]:
    """The synthetic ShareGPT trace with every length divided by ``length_scale`` (rounded up)."""
    trace = synthetic_trace("sharegpt", num_requests, seed, MAX_LEN)
    return [TraceRequest(-(-r.prompt_len // length_scale), -(-r.output_len // length_scale)) for r in trace]


def pool_blocks(trace: list[TraceRequest], block_size: int, fraction: float) -> int:
    """``fraction`` of the blocks every request needs at full length; at least the longest + 1."""
    need = [-(-r.total_len // block_size) for r in trace]
    return max(max(need) + 1, round(fraction * sum(need)))


# --8<-- [start:workload]
def run_workload(engine: PreemptingEngine, trace: list[TraceRequest], seed: int,
                 timeline: list | None = None, clock=time.perf_counter) -> dict:
    """All of ``trace`` at t = 0, greedy, until done; appends ``engine.stats()`` per step to ``timeline``."""
    prompts = random_prompts([r.prompt_len for r in trace], engine.model.config.vocab_size, seed)
    for i, (r, prompt) in enumerate(zip(trace, prompts)):
        engine.add_request(f"req{i}", prompt, SamplingParams(temperature=0, max_tokens=r.output_len,
                                                             ignore_eos=True))
    outputs, finish, steps, work = {}, {}, 0, {"tokens": 0, "blocks": 0}
    execute = engine.runner.execute

    def counted(plan):  # what the runner is asked to do: tokens through the model, blocks moved
        work["tokens"] += plan.num_tokens
        work["blocks"] += len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)
        return execute(plan)

    engine.runner.execute = counted
    start = clock()
    try:
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    finish[out.request_id] = clock() - start
                    outputs[out.request_id] = out.outputs[0].token_ids
            steps += 1
            if timeline is not None:
                timeline.append(engine.stats())
    finally:
        engine.runner.execute = execute
    elapsed = clock() - start
    assert engine.allocator.num_used == 0 and engine.swap.allocator.num_used == 0, "blocks leaked"
    tokens = sum(len(t) for t in outputs.values())
    digest = hashlib.sha256(json.dumps([outputs[f"req{i}"] for i in range(len(trace))]).encode()).hexdigest()
    return {
        "normalized_latency_s": statistics.mean(finish[k] / len(outputs[k]) for k in outputs),
        "throughput_tok_s": tokens / elapsed,
        "output_tokens": tokens,
        "time_s": elapsed,
        "iterations": steps,
        "preemptions": dict(engine.preemptions),
        "tokens_computed": work["tokens"],
        "blocks_moved": work["blocks"],
        "outputs_sha256": digest[:16],
    }
# --8<-- [end:workload]


def end_to_end(model, trace, block_size: int, num_blocks: int, seed: int, rounds: int = 1,
               clock=time.perf_counter) -> dict:
    """``run_workload`` under each mode on fresh engines, modes interleaved, ``rounds`` times.

    Times are the medians over rounds; the schedule does not depend on time, so
    the counts are the same in every round. ``outputs_identical``: every run of
    every mode produced the same tokens.
    """
    runs: dict = {mode: [] for mode in PREEMPTION_MODES}
    for _ in range(rounds):
        for mode in PREEMPTION_MODES:
            engine = PreemptingEngine(model, block_size=block_size, num_blocks=num_blocks, preemption_mode=mode,
                                      enable_prefix_caching=False, seed=seed)
            runs[mode].append(run_workload(engine, trace, seed, clock=clock))
    digests = {r["outputs_sha256"] for rs in runs.values() for r in rs}
    result = {}
    for mode, rs in runs.items():
        result[mode] = {**rs[0], **{k: statistics.median(r[k] for r in rs)
                                    for k in ("normalized_latency_s", "throughput_tok_s", "time_s")},
                        "rounds": rounds, "outputs_identical": len(digests) == 1}
    return result


# -- the timeline of a small starved run --------------------------------------------
def record_timeline(model, trace, block_size: int, num_blocks: int, seed: int, swap_space: int) -> dict:
    """``engine.stats()`` after every step of a swap run and of a recompute run of ``trace``."""
    runs = {}
    for mode in ("swap", "recompute"):
        engine = PreemptingEngine(model, block_size=block_size, num_blocks=num_blocks, preemption_mode=mode,
                                  enable_prefix_caching=False, swap_space=swap_space, seed=seed)
        rows: list = []
        run_workload(engine, trace, seed, timeline=rows)
        runs[mode] = rows
    return runs


def plot_timeline(runs: dict, path: str, title: str) -> None:
    """Queues (waiting / running / swapped) and blocks in use (device, host) per iteration, per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(runs), figsize=(4.2 * len(runs), 4.6), sharex="col", squeeze=False)
    for col, (mode, rows) in enumerate(runs.items()):
        x = range(1, len(rows) + 1)
        q, b = axes[0][col], axes[1][col]
        for key, color in (("waiting", "#8c8c8c"), ("running", "#4c72b0"), ("swapped", "#dd8452")):
            q.step(x, [r[key] for r in rows], where="post", color=color, label=key)
        done = rows[-1]["preemptions"]
        q.set_title(f"{mode}: {done['swap']} swap-outs, {done['recompute']} recomputes", fontsize=9)
        q.set_ylabel("requests")
        q.legend(fontsize=7, frameon=False, loc="upper right")
        b.fill_between(x, [r["blocks_used"] for r in rows], step="post", color="#4c72b0", alpha=0.6,
                       label="device blocks used")
        b.step(x, [r["swap_blocks_used"] for r in rows], where="post", color="#dd8452", label="host blocks used")
        b.axhline(rows[0]["blocks_total"], color="black", lw=0.8, ls="--", label="device pool")
        b.set_xlabel("iteration")
        b.set_ylabel("blocks")
        b.legend(fontsize=7, frameon=False, loc="upper right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_figure19(result: dict, path: str, title: str) -> None:
    """(a) swap out / in / both and recompute per block size; (b) normalized latency per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9.6, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    rows = result["micro"]
    xs = [r["block_size"] for r in rows]
    a.plot(xs, [r["recompute_ms"] for r in rows], "o-", color="#55a868", label="recompute")
    a.plot(xs, [r["swap_out_ms"] for r in rows], "v--", color="#dd8452", lw=0.8, label="swap out")
    a.plot(xs, [r["swap_in_ms"] for r in rows], "^--", color="#c44e52", lw=0.8, label="swap in")
    a.plot(xs, [r["swap_ms"] for r in rows], "s-", color="#8172b2", label="swap out + in")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xticks(xs)
    a.set_xticklabels([str(x) for x in xs])
    a.set_xlabel("block size")
    a.set_ylabel("latency (ms)")
    a.set_title("(a) swap vs recompute, one group", fontsize=9)
    a.legend(fontsize=7, frameon=False)
    e2e = result["e2e"]
    modes = list(e2e)
    values = [e2e[m]["normalized_latency_s"] for m in modes]
    bars = b.bar(modes, values, color=["#8172b2", "#55a868", "#4c72b0"][: len(modes)])
    for bar, m in zip(bars, modes):
        p = e2e[m]["preemptions"]
        b.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
               f"{e2e[m]['throughput_tok_s']:.0f} tok/s\n{p['swap']} sw / {p['recompute']} rc",
               ha="center", va="bottom", fontsize=7)
    b.set_ylim(0, max(values) * 1.3)
    b.set_ylabel("normalized latency (s/token)")
    b.set_title("(b) starved ShareGPT-like workload", fontsize=9)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
