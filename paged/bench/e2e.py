"""Shared pieces of the end-to-end benchmarks (``throughput``, ``hf``): model, workload, clock.

Not a benchmark itself (no ``run``): the dispatcher skips it.

* **The model**: ``--model PATH`` if given; else the bundled demo model
  (``paged.demo.DEFAULT_MODEL_PATH``) if its ``config.json`` exists; else a
  small random LLaMA (2 layers, hidden 128, 4 query / 2 KV heads, MLP 256,
  vocab 4096: per-iteration overhead dominates, as decode on a GPU is
  memory-bound), written in-process with ``transformers``
  (``paged.models.random_llama``) and loaded with ``paged.models.load_model``.
* **The workload**: a length trace (``paged.bench.traces``) with every length
  divided by ``--length-scale`` (rounded up), so that the paper's proportions
  hold at a small KV budget: OPT-13B on an A100-40GB holds about 15.7K tokens
  of KV with a 2,048-token context (7.7 contexts); here about 2,000 tokens
  with a 256-token context (ShareGPT / 8). Prompts are random token ids
  (3.., clear of BOS / EOS), EOS is ignored and ``max_tokens`` is the trace's
  output length, so every system generates exactly the same tokens.
* **The clock**: ``cpu`` (default) is this process's CPU time with one torch
  thread — on an idle machine it equals elapsed time, and on a shared one it
  leaves out the time the OS gives to other processes; ``wall`` is elapsed time.
"""

from __future__ import annotations

import argparse
import atexit
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from paged.bench.traces import SYNTHETIC, TraceFormatError, clip_to_max_len, load_jsonl, synthetic_trace

PAPER_MAX_LEN = 2048  # OPT's context: the synthetic traces are drawn within it, then scaled
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
RANDOM_SHAPE = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2)


@dataclass(frozen=True)
class Job:
    """One request of the workload: its prompt ids and how many tokens it generates."""

    prompt: list[int]
    output_len: int


def add_common_arguments(parser: argparse.ArgumentParser, num_requests: int) -> None:
    parser.add_argument("--trace", default="sharegpt",
                        help="sharegpt | alpaca (synthetic, seeded) or PATH to a JSONL trace")
    parser.add_argument("--num-requests", type=int, default=num_requests,
                        help=f"requests in the workload (default {num_requests})")
    parser.add_argument("--length-scale", type=int, default=8,
                        help="divide every prompt and output length by this (rounded up; default 8)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context of the engine: Orca (Max)'s reservation (default 2048 / length scale)")
    parser.add_argument("--kv-tokens", type=int, default=2000,
                        help="KV cache budget in tokens (default 2000): num_blocks = kv_tokens // block size")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    parser.add_argument("--model", default=None,
                        help="checkpoint folder (default: the demo model if present, else a random LLaMA)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: this process's CPU time, one torch thread (default); wall: elapsed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trace, prompts and arrivals")


def max_model_len(args) -> int:
    return args.max_model_len or PAPER_MAX_LEN // args.length_scale


def workload(args, vocab_size: int) -> list[Job]:
    """The scaled trace as jobs that fit ``max_model_len`` (prompts seeded by ``--seed``)."""
    if args.length_scale < 1 or args.num_requests < 1:
        raise ValueError("--length-scale and --num-requests must be >= 1")
    if args.trace in SYNTHETIC:
        trace = synthetic_trace(args.trace, args.num_requests, args.seed, PAPER_MAX_LEN)
    elif Path(args.trace).is_file():
        trace = load_jsonl(args.trace)[: args.num_requests]
    else:
        raise TraceFormatError(f"--trace {args.trace!r} is neither {' nor '.join(sorted(SYNTHETIC))} nor a file")
    s = args.length_scale
    scaled = [type(r)(-(-r.prompt_len // s), -(-r.output_len // s)) for r in trace]
    kept, dropped, clipped = clip_to_max_len(scaled, max_model_len(args))
    if dropped or clipped:
        print(f"note: {dropped} prompts dropped, {clipped} outputs clipped to max_model_len")
    rng = random.Random(args.seed)
    return [Job([rng.randrange(3, vocab_size) for _ in range(r.prompt_len)], r.output_len) for r in kept]


def describe(jobs: list[Job]) -> str:
    n = len(jobs)
    return (f"{n} requests, mean prompt {sum(len(j.prompt) for j in jobs) / n:.1f}, "
            f"mean output {sum(j.output_len for j in jobs) / n:.1f} tokens")


def model_folder(requested: str | None, tmp: str, context: int) -> tuple[Path, str]:
    """The checkpoint to use and a line saying which it is."""
    if requested:
        return Path(requested), f"model: {requested}"
    from paged.demo import DEFAULT_MODEL_PATH

    if (DEFAULT_MODEL_PATH / "config.json").exists():
        return DEFAULT_MODEL_PATH, f"model: the bundled demo model ({DEFAULT_MODEL_PATH})"
    from paged.models.random_llama import random_llama

    s = RANDOM_SHAPE
    return random_llama(tmp, max_position_embeddings=max(context, 2), **s), (
        f"model: random LLaMA built in-process (the demo model is not there): {s['num_hidden_layers']} layers, "
        f"hidden {s['hidden_size']}, 4/2 heads, vocab {s['vocab_size']}, float32")


def load(args) -> tuple[object, str, str]:
    """``(paged LoadedModel, checkpoint folder, line)``; a built folder lives until the process exits."""
    from paged.models import load_model

    tmp = tempfile.mkdtemp(prefix="paged-bench-")
    atexit.register(shutil.rmtree, tmp, True)
    path, line = model_folder(args.model, tmp, max_model_len(args))
    return load_model(path, dtype="float32"), str(path), line
