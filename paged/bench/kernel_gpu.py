"""Decode attention on a GPU at the paper's Figure 18a shapes: paged v1 / v2 vs flash SDPA and FlexAttention.

The paper's Figure 18a times its paged kernel against FasterTransformer's
contiguous one for LLaMA-13B-like heads (40 heads of 128 dims), contexts 64 to
4 096 and batches 8 to 64, and finds the block-table indirection costs 20-26 %.
Here, for every dtype, batch, context and block size B, one decode step of
``batch`` sequences that all hold ``context`` tokens (physical blocks shuffled):

* ``flash``: ``scaled_dot_product_attention`` with only the flash backend
  allowed, on the same K/V laid out contiguously ``[S, H_kv, C, D]``;
* ``v1`` / ``v2``: ``paged.kernels.cuda`` (csrc/cuda) on the paged cache;
  ``auto`` is the one ``select_version`` picks, which is what the engine runs;
* ``flex``: FlexAttention compiled, the block table as a block mask
  (``flex_paged``); timed after the others, within what is left of
  ``--budget-s``, for ``--flex-dtypes`` x ``--flex-block-sizes`` (each new dtype
  or block size compiles for tens of seconds), or skipped saying why.

Times: CUDA events, ``--warmup`` runs, then the median of ``--repeats`` rounds
in which the systems take turns, L2 flushed before each run (``gpu_timing``).
Each system's output is compared with flash's first (``AGREE``): a system
that disagrees or raises is reported, not timed. Bandwidth: the bytes a decode
step must move (K and V of every context, the query, the output, the block
table) / the median time, against the device's copy bandwidth measured in the
same run.

Sizing (an H200, about 4 TB/s): the default grid is 2 dtypes x 4 batches x 7
contexts x 3 block sizes = 168 cases, 40 GB of K/V per pass over it; 30 runs
of 3 systems each move 3.6 TB, about a second of memory time, so the sweep is
bounded by launches and set-up: well under a minute. Flex adds its compiles.

``--device cpu`` runs the same code on the CPU through the device emulation
(``paged.kernels.cuda_emulated``), the wall clock and uncompiled flex: tiny
shapes only, for ``tools/gpu_check.py --dry-run``.

    python -m paged.bench kernel_gpu --json
"""

from __future__ import annotations

import itertools
import json
import time

import torch
import torch.nn.functional as F

from paged.bench import flex_paged, gpu_timing
from paged.bench.kernel import DTYPES, geomean, make_case

# Outputs agree when every element is within this of flash's (atol and rtol): the CUDA tests hold each
# kernel within 1e-5 / 2e-3 / 1.6e-2 (float32 / float16 / bfloat16) of the exact result, and flash
# rounds its probabilities to the dtype before multiplying by V, so twice that, rounded up.
AGREE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3.2e-2}


def add_arguments(parser) -> None:
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float16"], choices=list(DTYPES))
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--heads", type=int, default=40, help="query heads H (LLaMA-13B: 40)")
    parser.add_argument("--kv-heads", type=int, default=40, help="KV heads H_kv")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim D")
    parser.add_argument("--repeats", type=int, default=25, help="timed rounds (median)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first")
    parser.add_argument("--copy-mib", type=int, default=1024, help="size of the copy-bandwidth buffer (MiB)")
    parser.add_argument("--flex-dtypes", nargs="*", default=["bfloat16"], choices=list(DTYPES))
    parser.add_argument("--flex-block-sizes", type=int, nargs="*", default=[16, 32, 8],
                        help="block sizes flex is timed at, in this order (none: no flex)")
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="seconds for the whole run: flex stops starting cases past it")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: the device emulation and the wall clock (a dry run, tiny shapes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON (last line)")


def check_args(args) -> None:
    """Raise ``ValueError`` naming the first bad argument."""
    for name in ("batch", "context", "block_sizes"):
        bad = [x for x in getattr(args, name) if x < 1]
        if bad:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {bad}")
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    if args.heads % args.kv_heads:
        raise ValueError(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")


def _kernels(device: torch.device):
    if device.type == "cuda":
        from paged.kernels import cuda as module
    else:
        from paged.kernels import cuda_emulated as module
    module.load()  # a failed build raises here, with the compiler's output
    return module


def step_bytes(batch, context, heads, kv_heads, head_dim, block_size, element_size) -> int:
    """Bytes one decode step must move: K and V of every token, the query, the output, the table."""
    kv = 2 * batch * context * kv_heads * head_dim * element_size
    table = batch * -(-context // block_size) * 4 + batch * 4  # int32 block table and lengths
    return kv + 2 * batch * heads * head_dim * element_size + table


def _flash(q, k, v, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gqa = k.shape[1] != q.shape[1]

    def run():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale, enable_gqa=gqa).squeeze(2)
    return run


def time_case(args, kernels, gen, device, dtype_name, batch, context, block_size, with_flex: bool) -> dict:
    """One case: outputs checked against flash, then timed. Returns its row."""
    dtype = DTYPES[dtype_name]
    q, k, v, key_cache, value_cache, tables, lens = make_case(
        batch, context, args.heads, args.kv_heads, args.head_dim, block_size, dtype, device, gen)
    scale = args.head_dim**-0.5
    candidates = {
        "v1": lambda: kernels.paged_attention_v1(q, key_cache, value_cache, tables, lens, scale),
        "v2": lambda: kernels.paged_attention_v2(q, key_cache, value_cache, tables, lens, scale),
    }
    row = {"dtype": dtype_name, "batch": batch, "context": context, "block_size": block_size, "errors": {}}
    systems = {"flash": _flash(q, k, v, scale)}
    try:
        want = systems["flash"]().float()
    except Exception as e:  # no flash kernel for this dtype / device: nothing to compare with
        row["errors"]["flash"] = f"{type(e).__name__}: {e}"[:300]
        return row
    if with_flex:  # flash and flex only: v1 and v2 were timed in the main sweep
        try:  # the mask and the layout, built once per case
            candidates = {"flex": flex_paged.flex_decode(q, key_cache, value_cache, tables, lens, scale,
                                                         compiled=device.type == "cuda")}
        except Exception as e:
            row["errors"]["flex"] = f"{type(e).__name__}: {e}"[:300]
            candidates = {}
    for name, fn in candidates.items():
        start = time.perf_counter()  # the first call: flex compiles here
        try:
            diff = (fn().float() - want).abs()
        except Exception as e:  # e.g. flex cannot compile this block size
            row["errors"][name] = f"{type(e).__name__}: {e}"[:300]
            continue
        row[f"{name}_first_call_s"] = time.perf_counter() - start
        row[f"{name}_max_abs_diff"] = diff.max().item()
        tol = AGREE[dtype_name]
        if not bool((diff <= tol + tol * want.abs()).all()):
            row["errors"][name] = f"disagrees with flash: max |diff| {row[f'{name}_max_abs_diff']:.3g} > {tol:.3g}"
            continue
        systems[name] = fn
    try:
        times = gpu_timing.time_systems(systems, args.repeats, args.warmup, device)
    except Exception as e:  # a system that ran once but fails when repeated: the case is lost, not the run
        row["errors"]["timing"] = f"{type(e).__name__}: {e}"[:300]
        return row
    nbytes = step_bytes(batch, context, args.heads, args.kv_heads, args.head_dim, block_size, q.element_size())
    row["bytes"] = nbytes
    for name, ms in times.items():
        row[f"{name}_ms"] = gpu_timing.median(ms)
        row[f"{name}_gbps"] = nbytes / (row[f"{name}_ms"] * 1e-3) / 1e9
    if "v1_ms" in row and "v2_ms" in row:
        from paged.kernels.cuda import select_version

        row["auto"] = select_version(batch, args.heads, tables.shape[1] * block_size)
        row["auto_ms"] = row[f"{row['auto']}_ms"]
        row["auto_over_flash"] = row["auto_ms"] / row["flash_ms"]
    if "flex_ms" in row:
        row["flex_over_flash"] = row["flex_ms"] / row["flash_ms"]
    return row


def _print_row(row: dict, copy_gbps: float) -> None:
    def ms(name):
        return f"{row[name + '_ms']:9.4f}" if name + "_ms" in row else f"{'-':>9s}"

    frac = {n: f"{row[n + '_gbps'] / copy_gbps:5.2f}" if n + "_gbps" in row else "    -" for n in ("v1", "v2")}
    ratio = f"{row['auto_over_flash']:6.2f}" if "auto_over_flash" in row else "     -"
    print(f"{row['dtype']:9s} {row['batch']:5d} {row['context']:5d} {row['block_size']:3d} {ms('flash')} "
          f"{ms('v1')} {ms('v2')} {ms('flex')} {frac['v1']} {frac['v2']} {ratio}"
          + (f"  errors: {row['errors']}" if row["errors"] else ""), flush=True)


def summarize(rows: list[dict], copy_gbps: float) -> dict:
    """The figures the goals are about: v2's bandwidth at the longest context, paged / flash overall."""
    timed = [r for r in rows if "auto_over_flash" in r]
    longest = max((r["context"] for r in timed), default=None)
    return {
        "geomean_auto_over_flash": geomean(r["auto_over_flash"] for r in timed) if timed else None,
        "max_auto_over_flash": max((r["auto_over_flash"] for r in timed), default=None),
        "longest_context": longest,
        "v2_copy_fraction_at_longest": {f"{r['dtype']} batch {r['batch']} B={r['block_size']}":
                                        r["v2_gbps"] / copy_gbps for r in timed if r["context"] == longest},
        "cases_with_errors": sum(1 for r in rows if r["errors"]),
    }


def flex_sweep(args, kernels, gen, device, copy_gbps: float, started: float) -> tuple[list[dict], str | None]:
    """FlexAttention's cases (flash timed beside it), until ``--budget-s`` is spent: (rows, why it stopped)."""
    note = flex_paged.availability()
    if note is None and not (args.flex_dtypes and args.flex_block_sizes):
        note = "not asked for (--flex-dtypes / --flex-block-sizes empty)"
    if note is not None:
        print(f"\nFlexAttention skipped: {note}")
        return [], note
    print("\nFlexAttention (compiled; the first call of each dtype / block size compiles)")
    rows, failed = [], set()
    for bs, dt, b, c in itertools.product(args.flex_block_sizes, args.flex_dtypes, args.batch, args.context):
        if time.perf_counter() - started > args.budget_s:
            return rows, f"stopped at --budget-s {args.budget_s:.0f} s: {len(rows)} cases timed"
        if (dt, bs) in failed:  # it would fail again, and compile again first
            continue
        rows.append(time_case(args, kernels, gen, device, dt, b, c, bs, with_flex=True))
        _print_row(rows[-1], copy_gbps)
        if "flex" in rows[-1]["errors"]:
            failed.add((dt, bs))
    return rows, None


def run(args) -> int:
    started = time.perf_counter()
    try:
        check_args(args)
    except ValueError as e:
        raise SystemExit(f"python -m paged.bench kernel_gpu: error: {e}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("python -m paged.bench kernel_gpu: --device cuda needs a CUDA GPU; none is visible to torch")
    kernels = _kernels(device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (device emulation)"
    copy = gpu_timing.copy_bandwidth(device, args.copy_mib, args.repeats, args.warmup)
    print(f"{name}; torch {torch.__version__} (CUDA {torch.version.cuda}); H={args.heads}, H_kv={args.kv_heads}, "
          f"D={args.head_dim}; median of {args.repeats} after {args.warmup} warm-up runs")
    print(f"copy bandwidth: {copy['gbps']:.0f} GB/s (read + write, {copy['mib']} MiB)")
    print(f"{'dtype':9s} {'batch':>5s} {'ctx':>5s} {'B':>3s} {'flash ms':>9s} {'v1 ms':>9s} {'v2 ms':>9s} "
          f"{'flex ms':>9s} {'v1/cp':>5s} {'v2/cp':>5s} {'auto/fl':>6s}")
    rows = []
    for dt in args.dtype:
        for b in args.batch:
            for c in args.context:
                for bs in args.block_sizes:
                    rows.append(time_case(args, kernels, gen, device, dt, b, c, bs, with_flex=False))
                    _print_row(rows[-1], copy["gbps"])
    flex_rows, flex_note = flex_sweep(args, kernels, gen, device, copy["gbps"], started)
    result = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "heads": args.heads,
              "kv_heads": args.kv_heads, "head_dim": args.head_dim, "repeats": args.repeats, "warmup": args.warmup,
              "copy": copy, "cases": rows, "flex_cases": flex_rows, "flex_note": flex_note,
              "summary": summarize(rows, copy["gbps"]), "seconds": time.perf_counter() - started}
    s = result["summary"]
    if s["geomean_auto_over_flash"] is not None:
        print(f"\npaged (auto) / flash: geomean {s['geomean_auto_over_flash']:.3f}, worst {s['max_auto_over_flash']:.3f}")
    if args.json:
        print(json.dumps(result))
    return 0
