"""Dense linear latency: the fixed-order kernel vs the stock GEMM, as batch-invariant mode runs them.

One linear layer at a time, at SmolLM2-135M's shapes by default (hidden 576,
MLP 1 536, 30 layers, vocabulary 49 152), for ``M`` rows of input, side by
side in one process:

* ``stock``: ``layers.gemm`` with ``pad_one_row``: torch's GEMM, a lone row
  multiplied as two (batch-invariant mode without the fixed-order kernel);
* ``fixed``: ``layers.gemm`` with ``fixed_order``: ``paged.kernels.cpu``'s
  ``fixed_order_linear`` (``csrc/cpu/fixed_order_linear.cpp``), every output
  summed in one order whatever ``M``; a lone row goes in as it is;
* ``pairs`` (bfloat16, on a CPU with AVX512_BF16): ``layers.gemm`` with a
  ``pair_weight``: ``pair_order_linear`` (``csrc/cpu/pair_order_linear.cpp``),
  the fixed order such a CPU's layers run.

``stock`` multiplies by a oneDNN-packed weight where the engine would
(``layers.prepack_linears``: bfloat16 on a CPU whose oneDNN packs). Each time is
the median of ``--repeats`` runs after ``--warmup``, the systems taking turns every
round. Reported per case: milliseconds, GFLOP/s (``2 M N K`` per call),
``stock / fixed`` (and ``stock / pairs``), and whether each fixed-order kernel gives
every row the bits it gives that row alone (``rows_alone_bitwise``,
``pairs_rows_alone_bitwise``); the ``model`` rows add the layers up (4 linears x
``--layers`` + the LM head): the linears' time of one forward pass of ``M`` tokens.

    python -m paged.bench linear_kernel [--rows 1 16 64 256] [--dtype bfloat16 float32] [--json]
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time

import torch

from paged.bench.prefill_kernel import DTYPES, headline, machine
from paged.kernels.cpu import load as load_cpu_kernels
from paged.models.layers import Linear, gemm, prepack_linears

# SmolLM2-135M's linears: (name, in K, out N)
SMOLLM2 = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576),
           ("lm_head", 576, 49152))  # fmt: skip


def add_arguments(parser) -> None:
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256], help="rows M of the input")
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=list(DTYPES))
    add_layer_timing_arguments(parser)


def add_layer_timing_arguments(parser) -> None:
    """The options of a per-layer timing at SmolLM2's shapes (this module's and ``quant_kernel``'s)."""
    parser.add_argument("--layers", type=int, default=30, help="decoder layers, for the model rows (SmolLM2: 30)")
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this (tests: tiny shapes)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per system (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON (last line)")


def linear(w: torch.Tensor, path: str) -> Linear:
    """A bias-free ``Linear`` with weight ``w`` on batch-invariant mode's ``path``, as
    ``CausalLM.prepare_for_serving`` would set it: ``"stock"``, padded (and oneDNN-packed where the engine
    packs); ``"fixed"``, the fixed-order kernel; ``"pairs"``, the pair order; any other ``path``: the plain
    GEMM, none of these."""
    layer = Linear(w.shape[1], w.shape[0], bias=False).to(w.dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
    layer.pad_one_row, layer.fixed_order = path == "stock", path in ("fixed", "pairs")
    if path == "stock":
        prepack_linears(layer)  # the engine's rule: bfloat16, where this CPU's oneDNN packs
    if path == "pairs":
        layer.pair_weight = load_cpu_kernels().pair_order_pack(layer.weight.detach())
    return layer


def median_ms(systems: dict, repeats: int, warmup: int) -> dict:
    times = {name: [] for name in systems}
    for r in range(warmup + repeats):
        for name, fn in systems.items():
            start = time.perf_counter()
            fn()
            if r >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def run_case(name: str, k: int, n: int, m: int, dtype_name: str, args, gen) -> dict:
    dtype = DTYPES[dtype_name]
    x = (3 * torch.randn(m, k, generator=gen)).to(dtype)
    w = (0.05 * torch.randn(n, k, generator=gen)).to(dtype)
    paths = ["stock", "fixed"] + (["pairs"] if dtype == torch.bfloat16 and load_cpu_kernels().pair_order_compiled()
                                  else [])
    layers = {path: linear(w, path) for path in paths}
    with torch.inference_mode():
        ms = median_ms({path: functools.partial(gemm, layer, x) for path, layer in layers.items()}, args.repeats,
                       args.warmup)
        alone = {path: rows_alone_bitwise(layers[path], x) for path in paths[1:]}
    flops = 2 * m * n * k
    row = {"layer": name, "k": k, "n": n, "rows": m, "dtype": dtype_name, "stock_ms": ms["stock"],
           "fixed_ms": ms["fixed"], "stock_gflops": flops / ms["stock"] / 1e6, "fixed_gflops": flops / ms["fixed"] / 1e6,
           "stock_over_fixed": ms["stock"] / ms["fixed"], "rows_alone_bitwise": alone["fixed"]}
    if "pairs" in ms:
        row.update(pairs_ms=ms["pairs"], pairs_gflops=flops / ms["pairs"] / 1e6,
                   stock_over_pairs=ms["stock"] / ms["pairs"], pairs_rows_alone_bitwise=alone["pairs"])
    return row


def rows_alone_bitwise(layer: Linear, x: torch.Tensor) -> bool:
    """Whether each of the first 8 rows gets from ``layer`` alone the bits it gets among all of ``x``."""
    out = gemm(layer, x)
    return all(torch.equal(gemm(layer, x[i:i + 1]), out[i:i + 1]) for i in range(min(x.shape[0], 8)))


def run(args) -> int:
    from paged.kernels import cpu

    ext = cpu.load(strict=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    shapes = [(name, max(8, k // args.scale), max(8, n // args.scale)) for name, k, n in SMOLLM2]
    result = {**machine(), "load_before": os.getloadavg(), "avx2_compiled": ext.fixed_order_avx2_compiled(),
              "pairs_compiled": ext.pair_order_compiled(),
              "layers": args.layers, "repeats": args.repeats, "cases": [], "model": []}
    print(f"{headline(result)}, AVX2 loop compiled: {result['avx2_compiled']}, "
          f"AVX512_BF16 pair loop compiled: {result['pairs_compiled']}")
    print(f"{'dtype':9s} {'layer':8s} {'K':>5s} {'N':>6s} {'rows':>5s} {'stock ms':>9s} {'fixed ms':>9s} "
          f"{'stock GF/s':>10s} {'fixed GF/s':>10s} {'stock/fixed':>11s} {'alone=among':>11s}"
          f"{'  pairs ms  pairs GF/s stock/pairs alone=among' if result['pairs_compiled'] else ''}")
    for dt in args.dtype:
        for m in args.rows:
            total = {}
            for name, k, n in shapes:
                row = run_case(name, k, n, m, dt, args, gen)
                result["cases"].append(row)
                times = 1 if name == "lm_head" else args.layers
                for key in ("stock_ms", "fixed_ms", "pairs_ms"):
                    if key in row:
                        total[key] = total.get(key, 0.0) + times * row[key]
                pairs = (f" {row['pairs_ms']:9.3f} {row['pairs_gflops']:10.1f} {row['stock_over_pairs']:11.2f} "
                         f"{str(row['pairs_rows_alone_bitwise']):>11s}" if "pairs_ms" in row else "")
                print(f"{dt:9s} {name:8s} {k:5d} {n:6d} {m:5d} {row['stock_ms']:9.3f} {row['fixed_ms']:9.3f} "
                      f"{row['stock_gflops']:10.1f} {row['fixed_gflops']:10.1f} {row['stock_over_fixed']:11.2f} "
                      f"{str(row['rows_alone_bitwise']):>11s}{pairs}", flush=True)
            model = {"dtype": dt, "rows": m, **total, "stock_over_fixed": total["stock_ms"] / total["fixed_ms"]}
            if "pairs_ms" in total:
                model["stock_over_pairs"] = total["stock_ms"] / total["pairs_ms"]
            result["model"].append(model)
            pairs = (f" {total['pairs_ms']:9.1f} {'':10s} {model['stock_over_pairs']:11.2f}" if "pairs_ms" in total
                     else "")
            print(f"{dt:9s} {'model':8s} {'':5s} {'':6s} {m:5d} {total['stock_ms']:9.1f} {total['fixed_ms']:9.1f} "
                  f"{'':10s} {'':10s} {model['stock_over_fixed']:11.2f} {'':11s}{pairs}"
                  f"   (all {args.layers} layers' linears + LM head)", flush=True)
    result["load_after"] = os.getloadavg()
    print(f"load average after: {result['load_after'][0]:.2f}")
    if args.json:
        print(json.dumps(result))
    return 0
