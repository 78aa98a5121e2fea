"""Decode attention latency: paged kernels vs contiguous SDPA (paper Figure 18a, 18b's kernel half).

The paper's CUDA kernel paid 20-26% over FasterTransformer's contiguous kernel
for the indirection through block tables (§7.1). Here, for one decode step of
``batch`` sequences that all have ``context`` tokens, side by side in one run:

* ``contiguous``: ``scaled_dot_product_attention`` of ``[S, H, 1, D]`` queries
  over ``[S, H_kv, C, D]`` keys and values that are already contiguous;
* ``reference``: the paged reference path (gather through the block table, SDPA);
* ``blockwise``: the paper's per-block equation in PyTorch (small cases only:
  ``batch * context <= --blockwise-max-tokens``, otherwise ``null``);
* ``cpu_kernel``: the C++ kernel of ``csrc/cpu`` (``paged.kernels.cpu``).

Physical blocks are a random permutation, so no sequence's blocks are in order.
Each time is the median of ``--repeats`` runs after warm-up, the systems taking
turns within every round so background load hits all of them alike. A
block-size sweep times the kernel at every ``--sweep-block-sizes`` for the
largest batch. ``--gap-ms`` idles before each timed call, as a decode step runs
Python between its kernels: by then an idle thread has gone back to sleep
(``OMP_WAIT_POLICY=passive``, paged's default), so a call on two threads pays
for waking it, as it does in the engine; without a gap the threads have just
run and the kernel's threads rule cannot be judged. On a GPU, ``python -m
paged.bench kernel_gpu`` times the CUDA kernels instead (CUDA events, flash
SDPA, FlexAttention, the copy bandwidth).

    python -m paged.bench kernel --plot docs/figures/step03_kernel.png
"""

from __future__ import annotations

import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_arguments(parser) -> None:
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--context", type=int, nargs="+", default=[64, 128, 256, 1024, 2048])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    parser.add_argument("--block-size", type=int, default=16, help="block size of the main grid")
    parser.add_argument("--sweep-block-sizes", type=int, nargs="*", default=[8, 16, 32, 64, 128],
                        help="block sizes of the kernel sweep (none: no sweep)")
    parser.add_argument("--heads", type=int, default=16, help="query heads H")
    parser.add_argument("--kv-heads", type=int, default=16, help="KV heads H_kv")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim D")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per system (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    parser.add_argument("--blockwise-max-tokens", type=int, default=2048,
                        help="time the block-wise path only when batch * context is at most this")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cpu only: the GPU benchmark is python -m paged.bench kernel_gpu")
    parser.add_argument("--threads", type=int, help="torch threads for every system (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="idle milliseconds before each timed call (a decode step's Python between kernels); "
                             "default 0")
    parser.add_argument("--plot", metavar="PATH", help="write the figure (PNG)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON (last line)")


def make_case(batch, context, heads, kv_heads, head_dim, block_size, dtype, device, gen):
    """Contiguous K/V and the same K/V scattered over shuffled physical blocks.

    The numbers are drawn where ``gen`` lives (a GPU's generator draws gigabytes in milliseconds)."""
    def draw(*shape):
        return torch.randn(*shape, generator=gen, device=gen.device).to(device, dtype)

    q = draw(batch, heads, head_dim)  # [S, H, D]
    k = draw(batch, kv_heads, context, head_dim)  # [S, H_kv, C, D]
    v = draw(batch, kv_heads, context, head_dim)
    per_seq = -(-context // block_size)
    tables = torch.randperm(batch * per_seq, generator=gen, device=gen.device).view(batch, per_seq)  # [S, M]
    key_cache = torch.zeros(batch * per_seq, block_size, kv_heads, head_dim, dtype=dtype, device=device)
    value_cache = torch.zeros_like(key_cache)
    pad = per_seq * block_size - context
    for cache, x in ((key_cache, k), (value_cache, v)):
        rows = F.pad(x.transpose(1, 2), (0, 0, 0, 0, 0, pad))  # [S, M * B, H_kv, D]
        cache[tables.to(device).flatten()] = rows.reshape(batch * per_seq, block_size, kv_heads, head_dim)
    tables = tables.to(device=device, dtype=torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return q, k, v, key_cache, value_cache, tables, lens


def median_ms(systems: dict, repeats: int, warmup: int, sync, gap_s: float = 0.0) -> dict:
    """Median wall time (ms) of each callable; they take turns every round, each after ``gap_s`` idle."""
    times = {name: [] for name in systems}
    for r in range(warmup + repeats):
        for name, fn in systems.items():
            if gap_s > 0:
                time.sleep(gap_s)
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if r >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(x) for x in values) / len(values))


def systems_for(args, q, k, v, key_cache, value_cache, tables, lens, scale):
    """The callables to time, and the output each should match (SDPA's)."""
    from paged.step03_attention.blockwise import blockwise_attention
    from paged.step03_attention.reference import reference_attention

    gqa = k.shape[1] != q.shape[1]
    systems = {
        "contiguous": lambda: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale, enable_gqa=gqa),
        "reference": lambda: reference_attention(q, key_cache, value_cache, tables, lens, None, scale),
    }
    if q.shape[0] * k.shape[2] <= args.blockwise_max_tokens:
        systems["blockwise"] = lambda: blockwise_attention(q, key_cache, value_cache, tables, lens, None, scale)
    from paged.kernels import cpu

    module = cpu.load(strict=True)
    out = torch.empty_like(q)
    systems["cpu_kernel"] = lambda: module.decode(q, key_cache, value_cache, tables, lens, scale, out)
    return systems


def run_case(args, batch, context, dtype_name, block_size, gen, only=None):
    tensors = make_case(batch, context, args.heads, args.kv_heads, args.head_dim, block_size,
                        DTYPES[dtype_name], torch.device("cpu"), gen)
    scale = args.head_dim**-0.5
    systems = systems_for(args, *tensors, scale)
    if only is not None:
        systems = {name: systems[name] for name in only}
    ms = median_ms(systems, args.repeats, args.warmup, lambda: None, args.gap_ms / 1e3)
    row = {"batch": batch, "context": context, "dtype": dtype_name, "block_size": block_size}
    row.update({f"{name}_ms": ms[name] for name in systems})
    if only is None:
        row.setdefault("blockwise_ms", None)
        want = systems["contiguous"]().squeeze(2).float()
        kernels = [n for n in systems if n not in ("contiguous", "reference", "blockwise")]
        row["max_abs_diff"] = max((systems[n]().float() - want).abs().max().item() for n in kernels)
    kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * tensors[1].element_size()
    row["kv_mb"] = kv_bytes / 1e6
    return row


def plot(result: dict, path: str, kernel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({c["dtype"] for c in result["cases"]}, key=list(DTYPES).index)
    batches = sorted({c["batch"] for c in result["cases"]})
    cols = len(batches) + (1 if result["block_size_sweep"] else 0)
    fig, axes = plt.subplots(len(dtypes), cols, figsize=(4.2 * cols, 3.3 * len(dtypes)), squeeze=False)
    styles = {"contiguous": "k-o", "reference": "C1--s", "blockwise": "C2:^", kernel: "C0-D"}
    for i, dt in enumerate(dtypes):
        for j, b in enumerate(batches):
            ax = axes[i][j]
            cases = [c for c in result["cases"] if c["dtype"] == dt and c["batch"] == b]
            for name, style in styles.items():
                pts = [(c["context"], c.get(f"{name}_ms")) for c in cases if c.get(f"{name}_ms") is not None]
                if pts:
                    ax.plot(*zip(*pts), style, label=name.replace("_", " "), markersize=4)
            ax.set(xscale="log", yscale="log", xlabel="context length", ylabel="latency (ms)",
                   title=f"batch {b}, {dt}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        if result["block_size_sweep"]:
            ax = axes[i][-1]
            rows = [r for r in result["block_size_sweep"] if r["dtype"] == dt]
            for ctx in sorted({r["context"] for r in rows}):
                pts = sorted((r["block_size"], r[f"{kernel}_ms"]) for r in rows if r["context"] == ctx)
                ax.plot(*zip(*pts), "-o", markersize=4, label=f"context {ctx}")
            ax.set(xscale="log", yscale="log", xlabel="block size", ylabel="latency (ms)",
                   title=f"{kernel.replace('_', ' ')}, batch {rows[0]['batch']}, {dt}" if rows else "")
            ax.set_xticks(sorted({r["block_size"] for r in rows}), [str(x) for x in sorted({r["block_size"] for r in rows})])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"Paged decode attention vs contiguous SDPA (H={result['heads']}, H_kv={result['kv_heads']}, "
                 f"D={result['head_dim']}, B={result['block_size']}, {_threads(result['threads'])}, {result['device']})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    if args.device == "cuda":
        raise SystemExit("python -m paged.bench kernel times the CPU paths; on a GPU run python -m paged.bench "
                         "kernel_gpu (Figure 18a with CUDA events, flash SDPA, FlexAttention, the copy bandwidth)")
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    kernel = "cpu_kernel"
    cases = []
    header = f"{'dtype':9s} {'batch':>5s} {'ctx':>5s} {'contig ms':>10s} {'ref ms':>9s} {'blockw ms':>9s} {kernel + ' ms':>14s} {'k/contig':>8s}"
    print(header)
    for dt in args.dtype:
        for b in args.batch:
            for c in args.context:
                row = run_case(args, b, c, dt, args.block_size, gen)
                cases.append(row)
                bw = "-" if row["blockwise_ms"] is None else f"{row['blockwise_ms']:.3f}"
                print(f"{dt:9s} {b:5d} {c:5d} {row['contiguous_ms']:10.3f} {row['reference_ms']:9.3f} {bw:>9s} "
                      f"{row[kernel + '_ms']:14.3f} {row[kernel + '_ms'] / row['contiguous_ms']:8.2f}", flush=True)
    sweep = []
    if args.sweep_block_sizes:
        print(f"\nblock-size sweep of {kernel}, batch {max(args.batch)} (ms)")
        print(f"{'dtype':9s} {'ctx':>5s} " + " ".join(f"{'B=' + str(bs):>8s}" for bs in args.sweep_block_sizes))
        for dt in args.dtype:
            for c in args.context:
                rows = [run_case(args, max(args.batch), c, dt, bs, gen, only=[kernel]) for bs in args.sweep_block_sizes]
                sweep.extend(rows)
                print(f"{dt:9s} {c:5d} " + " ".join(f"{r[kernel + '_ms']:8.3f}" for r in rows), flush=True)
    result = {
        "device": args.device, "threads": torch.get_num_threads(), "heads": args.heads,
        "kv_heads": args.kv_heads, "head_dim": args.head_dim, "block_size": args.block_size,
        "repeats": args.repeats, "gap_ms": args.gap_ms, "cases": cases, "block_size_sweep": sweep,
        f"geomean_{kernel}_over_contiguous": geomean(r[f"{kernel}_ms"] / r["contiguous_ms"] for r in cases),
        "geomean_reference_over_contiguous": geomean(r["reference_ms"] / r["contiguous_ms"] for r in cases),
    }
    print(f"\ngeomean {kernel} / contiguous = {result[f'geomean_{kernel}_over_contiguous']:.3f}, "
          f"reference / contiguous = {result['geomean_reference_over_contiguous']:.3f} "
          f"({_threads(result['threads'])})")
    if args.plot:
        plot(result, args.plot, kernel)
        print(f"wrote {args.plot}")
    if args.json:
        print(json.dumps(result))
    return 0
