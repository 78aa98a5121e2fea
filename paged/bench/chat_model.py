"""A real chat model, paged vs transformers: SmolLM2-135M-Instruct from the same GGUF file.

Both systems load the one file ``make install`` fetched (``paged.models.default``):
paged through ``paged.models.load_model``, transformers through
``from_pretrained(dir, gguf_file=...)``; both dequantize to ``--dtype``
(bfloat16 by default, paged's default for GGUF on CPU). Two measurements,
greedy, EOS ignored so every run makes exactly ``--max-tokens`` tokens per
request, timed by the wall clock after one warm-up run of each:

* **single stream**: one chat prompt, decode tokens/s (``max_tokens`` / time);
* **batch**: ``--num-requests`` different chat prompts at once, output
  tokens/s: paged's engine over all of them, transformers' ``generate`` over
  one left-padded batch.

Example:
    python -m paged.bench chat_model --json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

QUESTIONS = ["write a function to reverse a list", "What is the capital of France?",
             "Explain recursion in one sentence.", "Give me three tips for sleeping well.",
             "What is a prime number?", "Write a haiku about the sea.", "How do I sort a dict by value?",
             "Name three planets."]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="GGUF file (default: the fetched SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    parser.add_argument("--num-requests", type=int, default=16, help="requests of the batch run (default 16)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def _timed(fn) -> float:
    fn()  # warm-up: first-call allocations and kernel selection are not the steady state
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _paged(path, dtype, prompts, max_tokens) -> dict:
    from paged import LLM, SamplingParams

    llm = LLM(str(path), dtype=dtype, device="cpu")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    single = _timed(lambda: llm.generate([prompts[0]], params, use_tqdm=False))
    batch = _timed(lambda: llm.generate(prompts, params, use_tqdm=False))
    return {"single_tok_s": max_tokens / single, "batch_tok_s": len(prompts) * max_tokens / batch}


@torch.inference_mode()
def _transformers(path, dtype, prompts, max_tokens) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    kw = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    one = torch.tensor([prompts[0]])
    single = _timed(lambda: model.generate(one, **kw))
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    batch = _timed(lambda: model.generate(ids, attention_mask=mask, **kw))
    return {"single_tok_s": max_tokens / single, "batch_tok_s": len(prompts) * max_tokens / batch}


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from paged.models import load_model
    from paged.models.default import chat_model_path
    from paged.serve.chat_template import ChatRenderer

    path = Path(args.model) if args.model else chat_model_path()
    if not path.is_file():
        raise SystemExit(f"{path}: missing; run `make install` or `python -m paged.models.default`")
    loaded = load_model(path, dtype="float32")
    renderer = ChatRenderer(loaded.tokenizer, loaded.chat_template, loaded.special_tokens)
    questions = [QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" ({i})")
                 for i in range(args.num_requests)]
    prompts = [renderer.encode([{"role": "user", "content": q}])[1] for q in questions]
    del loaded
    dtype = getattr(torch, args.dtype)
    result = {"model": str(path), "dtype": args.dtype, "max_tokens": args.max_tokens,
              "num_requests": args.num_requests, "torch_threads": torch.get_num_threads(),
              "paged": _paged(path, dtype, prompts, args.max_tokens),
              "transformers": _transformers(path, dtype, prompts, args.max_tokens)}
    for key in ("single_tok_s", "batch_tok_s"):
        result[f"ratio_{key}"] = result["paged"][key] / result["transformers"][key]
    print(f"{path.name} ({args.dtype}), {args.max_tokens} tokens per request, {result['torch_threads']} threads")
    print(f"{'':14}{'single stream tok/s':>22}{f'{args.num_requests} requests tok/s':>22}")
    for name in ("paged", "transformers"):
        print(f"{name:14}{result[name]['single_tok_s']:>22.1f}{result[name]['batch_tok_s']:>22.1f}")
    print(f"{'paged / hf':14}{result['ratio_single_tok_s']:>21.2f}x{result['ratio_batch_tok_s']:>21.2f}x")
    if args.json:
        print(json.dumps(result))
    return 0
