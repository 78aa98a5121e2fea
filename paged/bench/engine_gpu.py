"""The engine against transformers' continuous batching on a GPU: output tokens/s, KV memory, greedy equality.

Three measurements, each printed as soon as it is done:

1. **Greedy equality** (``greedy_equality``): the demo model in float32, the
   engine's greedy tokens against transformers' ``generate``, token for token.
2. **The engine**: ``paged.LLM`` with its defaults (preemption and prefix
   caching on) on a LLaMA-shaped model whose random weights are drawn on the
   device (``--shape one-b``: 16 layers x 2 048 hidden, 32 query / 8 KV heads,
   MLP 8 192, vocab 32 000: about 1.1 B parameters, LLaMA-3.2-1B's shape),
   saved once and loaded by both systems. ``--num-requests`` requests with the
   synthetic ShareGPT trace's lengths (``paged.bench.traces``; prompt + output
   <= ``--max-len``), random prompt ids, greedy, EOS ignored, ``max_tokens`` =
   the trace's output length, all queued at t = 0; driven through the engine's
   public ``add_request`` / ``step``, after a 4-request warm-up.
3. **transformers' continuous batching** (``init_continuous_batching``: its
   own paged cache and scheduler) on the same weights, requests and KV bytes,
   after a 4-request warm-up; an API that differs or fails is reported and the
   run goes on.

Reported: output tokens / wall second; KV memory: the pool each system was
given (``--kv-gib``; transformers' in its own block size), the engine's peak
in use (``engine.stats()``'s ``blocks_used``, read every 8 iterations, times
the bytes of a block) and the CUDA allocator's peak during each run. Each
throughput run stops at ``--system-timeout-s`` and then reports the tokens it
made ("timed out").

``--device cpu --shape tiny --attention-backend emulated-cuda`` runs the same
code on the CPU through the device emulation, for ``tools/gpu_check.py --dry-run``.

    python -m paged.bench engine_gpu --json
"""

from __future__ import annotations

import gc
import json
import tempfile
import time

import torch

SHAPES = {  # config keywords of paged.models.random_llama.llama_shape
    "one-b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048),
    "tiny": dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
}
WARMUP_REQUESTS = 4  # of 16 tokens, other than the workload's (its prefixes must not be cached)


def add_arguments(parser) -> None:
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shape", choices=list(SHAPES), default="one-b", help="the random model's shape")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--trace", default="sharegpt", choices=["sharegpt", "alpaca"])
    parser.add_argument("--max-len", type=int, default=2048, help="longest prompt + output of a request")
    parser.add_argument("--length-scale", type=int, default=1, help="divide every length by this (rounded up)")
    parser.add_argument("--kv-gib", type=float, default=8.0, help="KV cache of each system (GiB)")
    parser.add_argument("--block-size", type=int, default=16, help="the engine's block size")
    parser.add_argument("--hf-block-size", type=int, default=256, help="transformers' block size (its default)")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="sequences per iteration, both systems")
    parser.add_argument("--max-batched-tokens", type=int, default=2048, help="tokens per iteration, both systems")
    parser.add_argument("--attention-backend", default=None, help="the engine's (default: the device's fastest)")
    parser.add_argument("--system-timeout-s", type=float, default=150.0, help="stop a throughput run after this")
    parser.add_argument("--greedy-prompts", type=int, default=8)
    parser.add_argument("--greedy-tokens", type=int, default=64)
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' continuous batching")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON (last line)")


def check_args(args) -> None:
    """Raise ``ValueError`` naming the first bad argument."""
    for name in ("num_requests", "length_scale", "block_size", "hf_block_size", "max_num_seqs",
                 "max_batched_tokens", "greedy_prompts", "greedy_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.kv_gib > 0 or not args.system_timeout_s > 0:
        raise ValueError(f"--kv-gib and --system-timeout-s must be > 0, got {args.kv_gib} and {args.system_timeout_s}")
    if not 2 <= args.max_len <= SHAPES[args.shape]["max_position_embeddings"]:
        raise ValueError(f"--max-len must be in [2, {SHAPES[args.shape]['max_position_embeddings']}] "
                         f"(the {args.shape} model's context), got {args.max_len}")


def workload(args, vocab_size: int) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """(prompts, output lengths, warm-up prompts): the trace's lengths, scaled, with seeded random prompt ids."""
    from paged.bench.traces import random_prompts, synthetic_trace

    s = args.length_scale
    trace = synthetic_trace(args.trace, args.num_requests, args.seed, args.max_len)
    lengths = [(-(-r.prompt_len // s), -(-r.output_len // s)) for r in trace]
    warmup = random_prompts([16] * WARMUP_REQUESTS, vocab_size, args.seed + 1)
    return random_prompts([p for p, _ in lengths], vocab_size, args.seed), [o for _, o in lengths], warmup


def random_model(args, path: str):
    """A ``transformers`` LLaMA of ``--shape`` drawn on the device (seeded), cast to ``--dtype``, saved to ``path``."""
    import transformers

    from paged.models.random_llama import llama_shape, quiet_transformers

    quiet_transformers()
    config = transformers.LlamaConfig(**llama_shape(**SHAPES[args.shape]))
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM(config)
    model = model.to(getattr(torch, args.dtype)).eval()
    model.save_pretrained(path)
    return model


def _peak_and_reset(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return peak


def run_engine(args, path: str, prompts, outputs, warmup, kv_bytes: int) -> dict:
    """The engine on the workload through ``add_request`` / ``step``; stops at ``--system-timeout-s``."""
    from paged import LLM, SamplingParams

    device = torch.device(args.device)
    llm = LLM(model=path, dtype=args.dtype, device=args.device, attention_backend=args.attention_backend,
              kv_cache_memory=kv_bytes, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_batched_tokens, max_model_len=args.max_len)
    engine = llm.engine
    cfg = llm.model.config
    block_bytes = 2 * cfg.num_layers * args.block_size * cfg.num_kv_heads * cfg.head_dim * torch.finfo(
        getattr(torch, args.dtype)).bits // 8
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in outputs]
    llm.generate(warmup, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    peak_blocks, iterations = [0], [0]

    def watch(engine, plan, results):
        iterations[0] += 1
        if iterations[0] % 8 == 1:
            peak_blocks[0] = max(peak_blocks[0], engine.stats()["blocks_used"])

    engine.add_observer(watch)
    _peak_and_reset(device)
    before = engine.stats()["generation_tokens_total"]
    unfinished = set()
    start = time.perf_counter()
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(f"r{i}", p, sp)
        unfinished.add(f"r{i}")
    timed_out = False
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                unfinished.discard(out.request_id)
        if time.perf_counter() - start > args.system_timeout_s:
            timed_out = True
            for rid in sorted(unfinished):
                engine.abort(rid)
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    stats = engine.stats()
    engine.remove_observer(watch)
    result = {"seconds": seconds, "output_tokens": stats["generation_tokens_total"] - before,
              "finished": len(prompts) - len(unfinished), "timed_out": timed_out, "iterations": iterations[0],
              "kv_pool_bytes": stats["blocks_total"] * block_bytes, "kv_peak_used_bytes": peak_blocks[0] * block_bytes,
              "cuda_peak_allocated_bytes": _peak_and_reset(device), "preemptions": stats.get("preemptions"),
              "prefix_cache_hit_rate": stats.get("prefix_cache_hit_rate")}
    del llm, engine, watch
    gc.collect()  # the engine's KV cache goes back before transformers allocates its own
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def run_hf(args, model, prompts, outputs, warmup, kv_bytes: int) -> dict:
    """transformers' continuous batching with the same KV bytes, in its own block size."""
    from paged.bench.hf import continuous_batching

    device = torch.device(args.device)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    token_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * model.dtype.itemsize
    num_blocks = kv_bytes // (token_bytes * args.hf_block_size)
    _peak_and_reset(device)
    result = continuous_batching(model, prompts, outputs, num_blocks=num_blocks, block_size=args.hf_block_size,
                                 clock=time.perf_counter, max_batch_tokens=args.max_batched_tokens,
                                 timeout_s=args.system_timeout_s, warmup=warmup,
                                 max_requests_per_batch=args.max_num_seqs)
    result.update(kv_pool_bytes=num_blocks * args.hf_block_size * token_bytes,
                  cuda_peak_allocated_bytes=_peak_and_reset(device))
    return result


def _line(name: str, r: dict) -> str:
    gib = 2**30
    used = f"{r['kv_peak_used_bytes'] / gib:6.2f}" if r.get("kv_peak_used_bytes") is not None else f"{'-':>6s}"
    peak = f"{r['cuda_peak_allocated_bytes'] / gib:7.2f}" if r.get("cuda_peak_allocated_bytes") else f"{'-':>7s}"
    return (f"{name:<14s}{r['seconds']:9.2f}{r['output_tokens']:>10d}{r['tokens_per_s']:>10.0f}"
            f"{r['kv_pool_bytes'] / gib:>8.2f}{used}{peak}" + ("  timed out" if r["timed_out"] else ""))


def run(args) -> int:
    prog = "python -m paged.bench engine_gpu"
    try:
        check_args(args)
    except ValueError as e:
        raise SystemExit(f"{prog}: error: {e}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"{prog}: --device cuda needs a CUDA GPU; none is visible to torch")
    import transformers

    from paged.bench import greedy_equality

    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"{name}; torch {torch.__version__}; transformers {transformers.__version__}", flush=True)
    result = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__, "notes": {}}
    result["greedy"] = greedy_equality.compare(args.device, args.greedy_prompts, args.greedy_tokens, args.seed,
                                               args.attention_backend)
    g = result["greedy"]
    print(f"greedy, demo model, float32: {g['prompts']} prompts, {g['tokens']} tokens, equal to transformers: "
          f"{g['equal']}" + ("" if g["equal"] else f" (first difference: {g['first_difference']})"), flush=True)
    kv_bytes = int(args.kv_gib * 2**30)
    with tempfile.TemporaryDirectory(prefix="paged-engine-gpu-") as path:
        model = random_model(args, path)
        prompts, outputs, warmup = workload(args, model.config.vocab_size)
        result["workload"] = {"requests": len(prompts), "prompt_tokens": sum(map(len, prompts)),
                              "output_tokens": sum(outputs), "max_output": max(outputs), "trace": args.trace}
        result["model"] = {"shape": args.shape, "dtype": args.dtype, **SHAPES[args.shape],
                           "parameters": sum(p.numel() for p in model.parameters())}
        print(f"model: random LLaMA '{args.shape}', {result['model']['parameters'] / 1e9:.2f} B parameters, "
              f"{args.dtype}; workload: {result['workload']}", flush=True)
        systems = {"paged": run_engine(args, path, prompts, outputs, warmup, kv_bytes)}
        if args.no_hf:
            result["notes"]["hf_continuous"] = "skipped (--no-hf)"
        else:
            try:
                systems["hf_continuous"] = run_hf(args, model, prompts, outputs, warmup, kv_bytes)
            except Exception as e:  # an experimental API that changes between versions: report, go on
                result["notes"]["hf_continuous"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
    for r in systems.values():
        r["tokens_per_s"] = r["output_tokens"] / r["seconds"]
    result["systems"] = systems
    if "hf_continuous" in systems:
        result["paged_over_hf"] = systems["paged"]["tokens_per_s"] / systems["hf_continuous"]["tokens_per_s"]
    print(f"{'system':<14s}{'seconds':>9s}{'out tok':>10s}{'tok/s':>10s}{'KV GiB':>8s}{'used':>6s}{'peak':>7s}")
    for n, r in systems.items():
        print(_line(n, r))
    for n, note in result["notes"].items():
        print(f"{n}: {note}")
    if args.json:
        print(json.dumps(result))
    return 0
