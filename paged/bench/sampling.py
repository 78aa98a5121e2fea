"""Throughput with and without logit processing: one batch, plain, with penalties, with a JSON schema.

The same requests (``--num-requests`` random prompts of ``--prompt-len``
tokens, ``--max-tokens`` each, temperature 1 with a seed per request) run
through a fresh step05 engine in three settings:

* ``plain`` — no penalty, bias, ban or grammar: the sampler's plain path;
* ``penalties`` — ``repetition_penalty=1.1``, ``frequency_penalty=0.5``,
  ``presence_penalty=0.5``, a ``logit_bias`` entry and ``min_p=0.05``: every
  row carries its history and is processed (vectorised over the batch);
* ``json`` — a JSON schema (an object with an enum, an integer and a short
  string): a grammar mask per row and step. Its outputs end when the JSON is
  complete, so it generates fewer tokens; tokens/s is what compares.

The settings alternate for ``--rounds`` rounds (plain, penalties, json,
plain, ...) so a change of machine load hits all of them alike; reported:
output tokens/s (median over rounds) and each setting's ratio to ``plain``.

Example:
    python -m paged.bench sampling --num-requests 32 --max-tokens 64 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from paged.sampling.structured import GuidedDecodingParams
from paged.step05_preemption import PreemptingEngine, SamplingParams

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["kind", "size", "name"],
          "properties": {"kind": {"enum": ["a", "b", "c"]}, "size": {"type": "integer", "minimum": 0},
                         "name": {"type": "string", "maxLength": 8}}}


def settings() -> dict[str, dict]:
    """The three settings' request options; built when run, because a grammar needs ``llguidance``, which
    ``python -m paged.bench`` must not need to list or run the other benchmarks."""
    return {
        "plain": dict(ignore_eos=True),
        "penalties": dict(ignore_eos=True, repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5,
                          logit_bias={7: 2.0}, min_p=0.05),
        "json": dict(guided_decoding=GuidedDecodingParams(json=SCHEMA)),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-requests", type=int, default=32, help="requests in the batch (default 32)")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request (default 32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the bundled demo model)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def run_once(model, prompts: list[list[int]], setting: dict, max_tokens: int) -> tuple[int, float]:
    """(output tokens, seconds) of one batch through a fresh engine (engine setup not timed)."""
    engine = PreemptingEngine(model, block_size=16, enable_prefix_caching=False, seed=0)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=max_tokens, **setting))
    tokens, t0 = 0, time.perf_counter()
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                tokens += sum(len(c.token_ids) for c in out.outputs)
    return tokens, time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    from paged.models import load_model
    from paged.step03_attention.llm import default_model_path

    model = load_model(args.model or default_model_path(), dtype=torch.float32)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
    options = settings()
    run_once(model, prompts[:2], options["penalties"], 4)  # warm-up: kernels, grammar tokenizer
    rates: dict[str, list[float]] = {name: [] for name in options}
    for _ in range(args.rounds):
        for name, setting in options.items():
            tokens, seconds = run_once(model, prompts, setting, args.max_tokens)
            rates[name].append(tokens / seconds)
    summary = {name: {"tokens_per_s": statistics.median(r), "ratio_to_plain":
                      statistics.median(r) / statistics.median(rates["plain"]), "rounds": r}
               for name, r in rates.items()}
    print(f"{args.num_requests} requests x {args.max_tokens} tokens, {args.rounds} rounds, "
          f"torch threads {torch.get_num_threads()}")
    for name, s in summary.items():
        print(f"  {name:10s} {s['tokens_per_s']:8.1f} tokens/s   x{s['ratio_to_plain']:.3f} of plain")
    if args.json:
        print(json.dumps(summary))
    return 0
