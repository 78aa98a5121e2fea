"""Quantized linear latency: each implementation of ``quant_linear`` against the dense GEMM it replaces.

One linear layer at a time, at SmolLM2-135M's shapes by default (hidden 576,
MLP 1 536, 30 layers, vocabulary 49 152), its weight in one GGUF block type
(``--type``; the K-quants only on the layers whose K is a multiple of 256),
for ``M`` rows of input, side by side in one process:

* ``scalar``, ``avx2``, ``avx512``: ``paged.kernels.cpu``'s ``quant_linear``
  with that ``impl`` (``csrc/cpu/quant_linear.cpp``), those compiled in here
  (``--impls`` to choose);
* ``lanes``: ``quant_linear_lanes`` over the blocks laid out with one output
  column per vector lane (``csrc/cpu/quant_linear_lanes.h``, its VNNI loop
  where that is built, else its AVX2 one): what a served model runs;
  ``lanes-avx2``, where VNNI is built: the same layout read by the AVX2 loop;
* ``dense``: ``layers.gemm`` on the weight dequantized once into ``--dtype``
  (torch's GEMM, as ``QuantizedLinear`` hands batches to its dense layer).

Each time is the median of ``--repeats`` runs after ``--warmup``, the systems
taking turns every round. Reported per case: milliseconds per system and
``dense / fastest kernel``; the ``model`` rows add the layers up (4 linears x
``--layers`` + the LM head, those the type applies to).

By default one layer's weight is read again and again, so it comes from the
caches; a decode step reads every layer once, from memory. ``--cold`` gives each
system copies of its weight, at least 64 MiB of them, and each call reads the
next copy: the weights come from memory, as in a step.

    python -m paged.bench quant_kernel [--type Q4_1 Q8_0] [--rows 1 16 64] [--dtype bfloat16] [--cold] [--json]
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import torch

from paged.bench.linear_kernel import SMOLLM2, add_layer_timing_arguments, linear, median_ms
from paged.bench.prefill_kernel import DTYPES, headline, machine
from paged.models.layers import gemm

TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
K_QUANT_BYTES = {12: (144, (0, 2)), 14: (210, (208,))}  # super-block bytes, offsets of its float16 factors
COLD_BYTES = 64 << 20  # --cold: at least this many bytes of copies per system, more than a last-level cache
LANE_LOOPS = {"lanes": "auto", "lanes-avx2": "avx2"}  # the lanes systems: quant_linear_lanes' impl for each


def cycling(call, make, nbytes: int, cold: bool):
    """A call of ``call(w)`` to time, ``w`` made by ``make()`` (``nbytes`` of weights): the same ``w`` each time,
    or (``cold``) the next of enough copies that none is still in a cache when its turn comes again."""
    copies = itertools.cycle([make() for _ in range(-(-COLD_BYTES // nbytes) if cold else 1)])
    return lambda: call(next(copies))


def add_arguments(parser) -> None:
    parser.add_argument("--type", nargs="+", default=["Q4_1", "Q8_0"], choices=list(TYPES),
                        help="GGUF block types of the weights")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64], help="rows M of the input")
    parser.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["bfloat16", "float32"])
    parser.add_argument("--impls", nargs="+", choices=["scalar", "avx2", "avx512", "lanes", "lanes-avx2"],
                        help="implementations to time (default: every one compiled in)")
    parser.add_argument("--cold", action="store_true",
                        help="each call reads another copy of the weight (64 MiB of copies): from memory")
    add_layer_timing_arguments(parser)


def random_blocks(kind: int, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """An ``[n, k]`` weight of block type ``kind`` as ``quant_linear`` reads it: ``gguf``'s quantizer on
    a random matrix for the 32-weight blocks (regrouped by ``pack_blocks``), random bytes with float16
    factors in ``[0.002, 0.05]`` for the K-quants (any byte is valid there; ``gguf`` has no quantizer)."""
    if kind in K_QUANT_BYTES:
        size, halves = K_QUANT_BYTES[kind]
        raw = rng.integers(0, 256, (n * k // 256, size), dtype=np.uint8)
        for at in halves:
            raw[:, at:at + 2] = rng.uniform(0.002, 0.05, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        return torch.from_numpy(raw.reshape(-1).copy())
    import gguf

    from paged.models.quantized import pack_blocks

    w = (0.05 * rng.standard_normal((n, k))).astype(np.float32)
    raw = np.ascontiguousarray(gguf.quants.quantize(w, gguf.GGMLQuantizationType(kind)))
    return pack_blocks(raw.reshape(-1).view(np.uint8), kind, n, k)


def run_case(ext, name: str, type_name: str, k: int, n: int, m: int, dtype_name: str, impls: list, args, rng) -> dict:
    from paged.models.quantized import dequantize_blocks

    dtype, kind = DTYPES[dtype_name], TYPES[type_name]
    blocks = random_blocks(kind, n, k, rng)
    weight = dequantize_blocks(blocks, kind, n, k).to(dtype)
    x = (3 * torch.randn(m, k, generator=torch.Generator().manual_seed(int(rng.integers(2**31))))).to(dtype)
    systems = {impl: cycling(lambda w, impl=impl: ext.quant_linear(x, w, kind, n, k, impl=impl), blocks.clone,
                             blocks.numel(), args.cold) for impl in impls if impl not in LANE_LOOPS}
    lane_impls = [impl for impl in impls if impl in LANE_LOOPS]
    if lane_impls:
        lanes = ext.quant_pack_lanes(blocks, kind, n, k)
        for impl in lane_impls:
            systems[impl] = cycling(lambda w, loop=LANE_LOOPS[impl]: ext.quant_linear_lanes(x, w, kind, n, k, loop),
                                    lanes.clone, lanes.numel(), args.cold)
    systems["dense"] = cycling(lambda layer: gemm(layer, x), lambda: linear(weight, "plain"),
                               weight.numel() * weight.element_size(), args.cold)
    with torch.inference_mode():
        ms = median_ms(systems, args.repeats, args.warmup)
    fastest = min(ms[impl] for impl in impls)
    return {"layer": name, "type": type_name, "k": k, "n": n, "rows": m, "dtype": dtype_name,
            **{f"{s}_ms": t for s, t in ms.items()}, "dense_over_fastest": ms["dense"] / fastest}


def run(args) -> int:
    from paged.kernels import cpu

    ext = cpu.load(strict=True)
    avx2, vnni = ext.quant_avx2_compiled(), ext.quant_vnni_compiled()
    compiled = ["scalar"] + ["avx2"] * avx2 + ["avx512"] * vnni + ["lanes"] * avx2 + ["lanes-avx2"] * vnni
    impls = args.impls or compiled
    missing = [impl for impl in impls if impl not in compiled]
    if missing:
        raise SystemExit(f"--impls {' '.join(missing)}: not compiled in here (compiled: {', '.join(compiled)})")
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    result = {**machine(), "load_before": os.getloadavg(), "compiled": compiled, "layers": args.layers,
              "repeats": args.repeats, "cold": args.cold, "cases": [], "model": []}
    print(f"{headline(result)}, compiled: {', '.join(compiled)}")
    columns = [*impls, "dense"]
    print(f"{'dtype':9s} {'type':5s} {'layer':8s} {'K':>5s} {'N':>6s} {'rows':>5s} "
          + " ".join(f"{c + ' ms':>10s}" for c in columns) + f" {'dense/best':>10s}")
    for dt in args.dtype:
        for type_name in args.type:
            unit = 256 if TYPES[type_name] in K_QUANT_BYTES else 32
            shapes = [(name, max(unit, k // args.scale // unit * unit), max(8, n // args.scale))
                      for name, k, n in SMOLLM2 if k % unit == 0]
            for m in args.rows:
                total = dict.fromkeys(columns, 0.0)
                for name, k, n in shapes:
                    row = run_case(ext, name, type_name, k, n, m, dt, impls, args, rng)
                    result["cases"].append(row)
                    for c in columns:
                        total[c] += (1 if name == "lm_head" else args.layers) * row[f"{c}_ms"]
                    print(f"{dt:9s} {type_name:5s} {name:8s} {k:5d} {n:6d} {m:5d} "
                          + " ".join(f"{row[f'{c}_ms']:10.3f}" for c in columns)
                          + f" {row['dense_over_fastest']:10.2f}", flush=True)
                model = {"dtype": dt, "type": type_name, "rows": m, "layers_included": [s[0] for s in shapes],
                         **{f"{c}_ms": total[c] for c in columns},
                         "dense_over_fastest": total["dense"] / min(total[i] for i in impls)}
                result["model"].append(model)
                print(f"{dt:9s} {type_name:5s} {'model':8s} {'':5s} {'':6s} {m:5d} "
                      + " ".join(f"{total[c]:10.1f}" for c in columns)
                      + f" {model['dense_over_fastest']:10.2f}   ({', '.join(model['layers_included'])})", flush=True)
    result["load_after"] = os.getloadavg()
    print(f"load average after: {result['load_after'][0]:.2f}")
    if args.json:
        print(json.dumps(result))
    return 0
