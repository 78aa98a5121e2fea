"""Prefill attention latency: the CPU prefill kernel vs SDPA and vs per-token decode.

One layer's attention for one prompt of ``n`` new tokens (causal), at
SmolLM2-135M's shapes by default (9 query heads, 3 KV heads, head dim 64,
blocks of 16, 30 layers), side by side in one process:

* ``prefill``: ``paged.kernels.cpu.paged_attention_prefill`` over the paged
  cache: the CPU backend's path in batch-invariant mode (the default);
* ``per_token``: the path it replaced: every prompt token a decode query of
  its own (``paged_attention_decode`` over per-token tables, never split),
  which reads the prompt's K/V about n^2 / 2 times;
* ``sdpa``: ``F.scaled_dot_product_attention(is_causal=True)`` over contiguous
  K/V in the same dtype (grouped-query heads as they are): the prompt path
  without the mode.

Physical blocks are a random permutation. Each time is the median of
``--repeats`` runs after ``--warmup``, the systems taking turns every round so
background load hits all of them alike; ratios are taken between the medians
of one process, of wall time and of CPU time (all the process's threads: on a
busy machine the steadier of the two). The record names the CPU, the date, the
threads and the load average before and after. Every case also checks the prefill's output
bitwise against per-token decode (``prefill_equals_per_token``) and its
largest difference from SDPA.

    python -m paged.bench prefill_kernel [--prompt-lens 512 2048 8000] [--json]
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SYSTEMS = ("prefill", "per_token", "sdpa")


def add_arguments(parser) -> None:
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[512, 2048, 8000])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=list(DTYPES))
    parser.add_argument("--heads", type=int, default=9, help="query heads H (SmolLM2-135M: 9)")
    parser.add_argument("--kv-heads", type=int, default=3, help="KV heads H_kv (SmolLM2-135M: 3)")
    parser.add_argument("--head-dim", type=int, default=64, help="head dim D (SmolLM2-135M: 64)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=30, help="layers, for the per-prompt column (SmolLM2-135M: 30)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per system (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--per-token-max", type=int, default=8000,
                        help="time per-token decode only for prompts up to this length (else null)")
    parser.add_argument("--query-tile", type=int, default=32, help="query tokens per work item of the prefill kernel")
    parser.add_argument("--impl", default="auto", choices=["auto", "scalar", "avx2", "avx512"],
                        help="the kernels' implementation, for the prefill and the per-token decode (default auto: "
                             "the one the engine runs here)")
    parser.add_argument("--threads", type=int, help="torch threads for every system (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON (last line)")


def machine() -> dict:
    """CPU model, date and load: the context every figure needs."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        fields = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in info.splitlines()[:30]
                  if ":" in line}
        family = f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    except (OSError, StopIteration):
        model, family = platform.processor() or platform.machine(), "?"
    return {"cpu": model, "cpu_family_model": family,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "threads": torch.get_num_threads(), "cores": os.cpu_count()}


def headline(result: dict) -> str:
    """The first line of a kernel benchmark's table: the CPU, threads, date and load (``machine()``'s)."""
    return (f"{result['cpu']} ({result['cpu_family_model']}), {result['threads']} threads, {result['date']}, "
            f"load {result['load_before'][0]:.2f}")


def make_case(n, args, dtype, gen):
    """A prompt of n tokens written into a paged cache over a shuffled free list."""
    b, h, h_kv, d = args.block_size, args.heads, args.kv_heads, args.head_dim
    blocks = -(-n // b)
    order = torch.randperm(blocks + 1, generator=gen)  # one spare block, never read
    key_cache = torch.randn(blocks + 1, b, h_kv, d, generator=gen).to(dtype)
    value_cache = torch.randn(blocks + 1, b, h_kv, d, generator=gen).to(dtype)
    table = order[:blocks].to(torch.int32)[None]  # [1, M]
    k = key_cache[order[:blocks]].flatten(0, 1)[:n]  # [n, H_kv, D] contiguous copies
    v = value_cache[order[:blocks]].flatten(0, 1)[:n]
    q = torch.randn(n, h, d, generator=gen).to(dtype)
    return q, k, v, key_cache, value_cache, table


def systems_for(n, args, q, k, v, key_cache, value_cache, table, scale):
    from paged.kernels import cpu

    lens = torch.tensor([n], dtype=torch.int32)
    token_tables = table.expand(n, -1).contiguous()  # [n, M]
    token_lens = torch.arange(1, n + 1, dtype=torch.int32)  # token i sees i + 1 keys
    q4, k4, v4 = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if args.impl == "auto":  # the public entry points, as the engine calls them
        prefill = lambda: cpu.paged_attention_prefill(q, key_cache, value_cache, table, lens, lens, scale,  # noqa: E731
                                                      query_tile=args.query_tile)
        per_token = lambda: cpu.paged_attention_decode(q, key_cache, value_cache, token_tables,  # noqa: E731
                                                       token_lens, scale, partition_blocks=0)
    else:  # the extension itself, told which implementation to run
        ext = cpu.load(strict=True)
        prefill = lambda: ext.prefill(q, key_cache, value_cache, table, lens, lens, scale, None,  # noqa: E731
                                      args.impl, args.query_tile)
        per_token = lambda: ext.decode(q, key_cache, value_cache, token_tables, token_lens, scale,  # noqa: E731
                                       None, args.impl, 0)
    systems = {
        "prefill": prefill,
        "per_token": per_token,
        "sdpa": lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale,
                                                       enable_gqa=args.heads != args.kv_heads)[0].transpose(0, 1),
    }
    if n > args.per_token_max:
        del systems["per_token"]
    return systems


def median_ms(systems: dict, repeats: int, warmup: int) -> tuple[dict, dict, dict]:
    """Median wall time and CPU time (ms, all threads of the process) of each callable, taking
    turns every round; and each one's last output. On a busy machine the CPU time is the steadier."""
    wall, cpu, outs = {name: [] for name in systems}, {name: [] for name in systems}, {}
    for r in range(warmup + repeats):
        for name, fn in systems.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            outs[name] = fn()
            if r >= warmup:
                wall[name].append((time.perf_counter() - start) * 1e3)
                cpu[name].append((time.process_time() - start_cpu) * 1e3)
    median = lambda times: {name: statistics.median(t) for name, t in times.items()}  # noqa: E731
    return median(wall), median(cpu), outs


def run_case(n, dtype_name, args, gen) -> dict:
    q, k, v, key_cache, value_cache, table = make_case(n, args, DTYPES[dtype_name], gen)
    systems = systems_for(n, args, q, k, v, key_cache, value_cache, table, args.head_dim**-0.5)
    ms, cpu_ms, outs = median_ms(systems, args.repeats, args.warmup)
    row = {"prompt_len": n, "dtype": dtype_name, **{f"{s}_ms": ms.get(s) for s in SYSTEMS},
           **{f"{s}_cpu_ms": cpu_ms.get(s) for s in SYSTEMS}}
    row["prefill_s_all_layers"] = ms["prefill"] * args.layers / 1e3
    row["sdpa_over_prefill"] = ms["sdpa"] / ms["prefill"]
    row["per_token_over_prefill"] = ms["per_token"] / ms["prefill"] if "per_token" in ms else None
    row["sdpa_over_prefill_cpu"] = cpu_ms["sdpa"] / cpu_ms["prefill"]
    row["per_token_over_prefill_cpu"] = cpu_ms["per_token"] / cpu_ms["prefill"] if "per_token" in cpu_ms else None
    row["prefill_equals_per_token"] = (bool(torch.equal(outs["prefill"], outs["per_token"]))
                                       if "per_token" in outs else None)
    row["max_abs_diff_vs_sdpa"] = (outs["prefill"].float() - outs["sdpa"].float()).abs().max().item()
    return row


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    result = {**machine(), "load_before": os.getloadavg(), "heads": args.heads, "kv_heads": args.kv_heads,
              "head_dim": args.head_dim, "block_size": args.block_size, "layers": args.layers,
              "repeats": args.repeats, "query_tile": args.query_tile, "impl": args.impl, "cases": []}
    print(headline(result))
    print(f"{'dtype':9s} {'prompt':>6s} {'prefill ms':>11s} {'per-token ms':>13s} {'sdpa ms':>9s} "
          f"{'per-tok/pf':>10s} {'sdpa/pf':>8s} {f'pf x{args.layers} s':>9s} {'bitwise':>7s}  (cpu-time ratios)")
    for dt in args.dtype:
        for n in args.prompt_lens:
            row = run_case(n, dt, args, gen)
            result["cases"].append(row)
            print(f"{dt:9s} {n:6d} {row['prefill_ms']:11.1f} {_fmt(row['per_token_ms'], '13.1f')} "
                  f"{row['sdpa_ms']:9.1f} {_fmt(row['per_token_over_prefill'], '10.2f')} "
                  f"{row['sdpa_over_prefill']:8.2f} {row['prefill_s_all_layers']:9.2f} "
                  f"{_fmt(row['prefill_equals_per_token'], '>7')}  ({_fmt(row['per_token_over_prefill_cpu'], '.2f')}, "
                  f"{row['sdpa_over_prefill_cpu']:.2f})", flush=True)
    result["load_after"] = os.getloadavg()
    print(f"load average after: {result['load_after'][0]:.2f}")
    if args.json:
        print(json.dumps(result))
    return 0
