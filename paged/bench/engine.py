"""Offline engine throughput on a checkpoint: the workload other CPU engines are compared on.

``n`` requests whose prompts are a BOS token and uniformly random token ids,
prompt lengths uniform in ``[mean - spread, mean + spread]``, output lengths
uniform in ``[min_output, max_output]``, generated greedily with
``ignore_eos`` (so every request makes exactly its output length). The
requests come from ``random.Random(seed)`` in a fixed order of draws, so any
engine given the same seed sees the same token ids (the defaults: 64
requests, 6 594 prompt and 6 294 output tokens). Prefix caching is off, so
repeated runs do not hit it.

It prints one JSON line: the median of ``--repeats`` timed runs after one
short warm-up — output and total tokens per second, wall time — plus load
time (checkpoint and engine), the first request's latency after load (the
warm-up, which includes building or loading the C++ kernels), peak resident
memory of the process and what it holds after the runs (``rss_gib``: the
load's transient copies gone), and the cores the engine kept busy (CPU seconds /
wall seconds over the timed runs).

    python -m paged.bench engine --model path/to/checkpoint --dtype bfloat16
    python -m paged.bench engine --model model.gguf --workload one-stream --quantization gguf
    python -m paged.bench engine --model model.gguf --workload one-stream --compare-unrolled

``--compare-unrolled`` times each run twice in turn, through the modules and through the
unrolled forward pass (``paged/models/unrolled.py``), in one process on the same weights:
the machine's spread between processes (where the weights land in memory) does not enter
the ratio.

``--workload`` sets the request options to one of the engine table's workloads
(docs/benchmarks.md): ``batch`` (the default above), ``prefill`` (32 requests,
prompts U[400,800], outputs U[32,64]), ``one-stream`` (one request, a
100-token prompt, 256 outputs) and ``long`` (8 requests, prompts U[1800,2200],
128 outputs). The line carries the peer scripts' keys too
(``peer``, ``engine_cores_used``, ``peak_rss_gib_tree``).
"""

from __future__ import annotations

import json
import os
import platform
import random
import resource
import statistics
import time

import torch

from paged.kernels.cpu import FUSED_OPS

BOS_ID, FIRST_ID = 1, 3  # prompts: BOS, then ids from FIRST_ID (skips <unk>, <s>, </s>)
# The workloads of docs/benchmarks.md's engine table: name -> (what, the request options it sets)
WORKLOADS = {
    "batch": ("64 requests, prompts U[50,150], outputs U[64,128] (the default; workloads A and C)",
              dict(num_requests=64, prompt_mean=100, prompt_spread=50, min_output=64, max_output=128)),
    "prefill": ("32 requests, prompts U[400,800], outputs U[32,64] (workload B)",
                dict(num_requests=32, prompt_mean=600, prompt_spread=200, min_output=32, max_output=64)),
    "one-stream": ("1 request, a 100-token prompt, 256 outputs (workload D)",
                   dict(num_requests=1, prompt_mean=100, prompt_spread=0, min_output=256, max_output=256)),
    "long": ("8 requests, prompts U[1800,2200], 128 outputs (the long-context workload)",
             dict(num_requests=8, prompt_mean=2000, prompt_spread=200, min_output=128, max_output=128)),
}


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face checkpoint folder or GGUF file")
    parser.add_argument("--dtype", default="bfloat16", help="float32, bfloat16, ... or auto")
    parser.add_argument("--quantization", choices=["gguf"], default=None,
                        help="gguf: a GGUF file's linears multiply by its quantized blocks (default: dense weights)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=None,
                        help="a preset of the request options below: " +
                             "; ".join(f"{k}: {v[0]}" for k, v in sorted(WORKLOADS.items())))
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, one per core)")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0, help="KV cache budget")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median)")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--prompt-mean", type=int, default=100)
    parser.add_argument("--prompt-spread", type=int, default=50)
    parser.add_argument("--min-output", type=int, default=64)
    parser.add_argument("--max-output", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-invariant", type=int, choices=(0, 1), default=None,
                        help="batch-invariant mode on (1) or off (0); default: the engine's")
    parser.add_argument("--long-prefill-token-threshold", type=int, default=None,
                        help="most prompt tokens a sequence computes in an iteration; default: the engine's")
    parser.add_argument("--compare-unrolled", action="store_true",
                        help="alternate the timed runs with and without the unrolled forward pass "
                             "(paged/models/unrolled.py), in this process on the same weights; the line adds "
                             "the runs through the modules (modules_*) and the ratio")


def make_workload(num_requests, prompt_mean, prompt_spread, min_output, max_output, vocab, seed):
    """``[(prompt token ids, output length)]``, drawn in a fixed order from one seeded generator."""
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt_len = rng.randint(max(1, prompt_mean - prompt_spread), prompt_mean + prompt_spread)
        body = [rng.randrange(FIRST_ID, vocab) for _ in range(prompt_len - 1)]
        requests.append(([BOS_ID] + body, rng.randint(min_output, max_output)))
    return requests


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _resident_gib() -> float | None:
    """The memory this process holds now (resident set, from /proc; None where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30, 3)
    except (OSError, ValueError, IndexError):
        return None


def timed_generate(llm, requests) -> dict:
    """One run over every request: wall seconds, CPU seconds, tokens in and out."""
    from paged import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in requests]
    cpu, start = _cpu_seconds(), time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params, use_tqdm=False)
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "cores_used": (_cpu_seconds() - cpu) / wall,
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
    }


def run(args) -> int:
    from paged import LLM

    if args.workload:
        for key, value in WORKLOADS[args.workload][1].items():
            setattr(args, key, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    extra = {} if args.long_prefill_token_threshold is None else {
        "long_prefill_token_threshold": args.long_prefill_token_threshold}
    llm = LLM(model=args.model, dtype=args.dtype, quantization=args.quantization, block_size=args.block_size,
              kv_cache_memory=int(args.kv_cache_gib * 2**30), enable_prefix_caching=False,
              batch_invariant=None if args.batch_invariant is None else bool(args.batch_invariant), **extra)
    load_s = time.perf_counter() - start
    requests = make_workload(args.num_requests, args.prompt_mean, args.prompt_spread, args.min_output,
                             args.max_output, llm.model.config.vocab_size, args.seed)
    first = timed_generate(llm, [(requests[0][0], 8)])  # warm-up: the first request after load
    model, modules = llm.model.model, []
    if args.compare_unrolled and model.unrolled is None:
        raise SystemExit("--compare-unrolled: this model is not unrolled here (paged/models/unrolled.py says where "
                         "it applies; PAGED_UNROLLED=0 turns it off)")
    runs = []
    for _ in range(args.repeats):
        if args.compare_unrolled:  # a run through the modules, then one through the loop: the same memory
            loop, model.unrolled = model.unrolled, None
            modules.append(timed_generate(llm, requests))
            model.unrolled = loop
        runs.append(timed_generate(llm, requests))
    median = statistics.median(r["wall_s"] for r in runs)
    run0 = runs[0]
    rss = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    cores = [round(r["cores_used"], 2) for r in runs]
    result = {
        "engine": "paged",
        "peer": "paged",  # the peer scripts' keys, so their tables read this line too
        "model": args.model,
        "dtype": args.dtype,
        "quantization": args.quantization,
        "workload": args.workload,
        "requests": len(requests),
        "vocab_size": llm.model.config.vocab_size,
        "prompt_tokens": run0["prompt_tokens"],
        "output_tokens": run0["output_tokens"],
        "wall_s": round(median, 3),
        "wall_s_all": [round(r["wall_s"], 3) for r in runs],
        "output_tok_per_s": round(run0["output_tokens"] / median, 1),
        "total_tok_per_s": round((run0["output_tokens"] + run0["prompt_tokens"]) / median, 1),
        "load_s": round(load_s, 2),
        "first_request_s": round(first["wall_s"], 2),
        "peak_rss_gib": rss,
        "peak_rss_gib_tree": rss,  # one process: the tree is this process
        "rss_gib": _resident_gib(),  # after the timed runs: what serving holds, the load's peak gone
        "cores_used": cores,
        "engine_cores_used": cores,
        "threads": torch.get_num_threads(),
        "attention_backend": llm.engine.backend,
        "batch_invariant": llm.engine.batch_invariant,
        "long_prefill_token_threshold": getattr(llm.engine, "long_prefill_token_threshold", None),
        "fused_ops": FUSED_OPS,
        "unrolled": model.unrolled is not None,  # the forward pass as one loop (paged/models/unrolled.py)
        "cpu": _cpu_model(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }
    if modules:
        plain = statistics.median(r["wall_s"] for r in modules)
        result["modules_wall_s_all"] = [round(r["wall_s"], 3) for r in modules]
        result["modules_output_tok_per_s"] = round(run0["output_tokens"] / plain, 1)
        result["unrolled_speedup"] = round(plain / median, 3)  # modules' median time / the loop's
    print(json.dumps(result), flush=True)
    return 0
