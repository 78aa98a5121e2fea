"""The answer set: 30 questions a small chat model should get right, graded by keywords.

Facts, arithmetic, short code and instructions, asked through the model's own chat
template, answered greedily, each answer graded by regular expressions (every group must
match; a group lists alternatives). It measures what a person asking the model would see,
on any ``LLM(...)`` configuration: the model file, ``quantization``, ``dtype``:

    python tools/answer_set.py --model ~/.cache/paged/gemma-3-270m-q4_k_m.gguf [--quantization gguf]
        [--dtype bfloat16] [--json]
    python tools/answer_set.py --candidates    # every candidate, one process each: the table of docs/models.md

Beside the score: load time (``LLM(...)`` built, cold conversion cache or not as found), the
process's peak memory, and one-stream decode speed (64 greedy tokens of one request). It
chooses the default model (``docs/models.md``) and decides whether GGUF files run on their
quantized blocks by default; ``tests/test_answer_set.py`` holds the default at its floor.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MAX_TOKENS = 96


@dataclass(frozen=True)
class Question:
    """A prompt and what its answer must contain: every group of ``expect`` matches (a group: regular
    expressions, any of which will do; case-insensitive unless ``case``)."""

    kind: str
    prompt: str
    expect: tuple[tuple[str, ...], ...]
    case: bool = False

    def passes(self, answer: str) -> bool:
        flags = 0 if self.case else re.IGNORECASE
        return all(any(re.search(p, answer, flags) for p in group) for group in self.expect)


def _q(kind: str, prompt: str, *groups, case: bool = False) -> Question:
    return Question(kind, prompt, tuple(tuple(g) if isinstance(g, (list, tuple)) else (g,) for g in groups), case)


QUESTIONS = (
    _q("fact", "What is the capital of France?", r"\bparis\b"),
    _q("fact", "What is the largest planet in our solar system?", r"\bjupiter\b"),
    _q("fact", "Who wrote the play Romeo and Juliet?", r"shakespeare"),
    _q("fact", "What is the chemical symbol for gold?", r"\bAu\b", case=True),
    _q("fact", "At what temperature in degrees Celsius does water boil at sea level?", r"\b100\b"),
    _q("fact", "How many continents are there on Earth?", (r"\b7\b", r"\bseven\b")),
    _q("fact", "What is the fastest land animal?", r"cheetah"),
    _q("fact", "Who was the first person to walk on the Moon?", r"armstrong"),
    _q("fact", "Which gas do plants take in from the air for photosynthesis?", (r"carbon dioxide", r"\bCO2\b", r"CO₂")),
    _q("fact", "What is the currency of Japan?", r"\byen\b"),
    _q("arithmetic", "What is 12 times 7?", r"\b84\b"),
    _q("arithmetic", "What is 15 plus 27?", r"\b42\b"),
    _q("arithmetic", "What is 100 minus 37?", r"\b63\b"),
    _q("arithmetic", "What is 144 divided by 12?", r"(?:is|=|equals)\s*\**12\b"),  # not the 12 of the question
    _q("arithmetic", "What is 9 squared?", r"\b81\b"),
    _q("arithmetic", "What is half of 50?", r"\b25\b"),
    _q("arithmetic", "What is 3 + 4 * 2? Remember the order of operations.", r"\b11\b"),
    _q("arithmetic", "What is 25% of 80?", r"\b20\b"),
    _q("code", "Write a Python function that reverses a list.", r"\bdef\b", (r"\[::-1\]", r"revers")),
    _q("code", "Write a Python function that adds two numbers.", r"\bdef\b", r"\breturn\b", r"\+"),
    _q("code", "Write a Python function that checks whether a number is even.", r"\bdef\b", r"%\s*2"),
    _q("code", "Write a Python program that prints Hello, World!", r"print\(", r"hello,? world"),
    _q("code", "Write a Python function that computes the factorial of n.", r"\bdef\b", r"\*"),
    _q("code", "Write an SQL query that selects all rows from the table users.", r"select\s+\*\s+from\s+users"),
    _q("instruction", "Reply with only the word yes.", r"^\W*yes\b"),
    _q("instruction", "Translate 'thank you' into French.", r"merci"),
    _q("instruction", "What is the opposite of the word hot?", r"\bcold\b"),
    _q("instruction", "Write the word banana in capital letters.", r"BANANA", case=True),
    _q("instruction", "Count from 1 to 5, separated by commas.", r"1,\s*2,\s*3,\s*4,\s*5"),
    _q("instruction", "Name a color of the rainbow. Answer with one word.",
       (r"\bred\b", r"\borange\b", r"\byellow\b", r"\bgreen\b", r"\bblue\b", r"\bindigo\b", r"\bviolet\b")),
)


def chat_prompts(llm) -> tuple[list[list[int]], list[int]]:
    """Each question as prompt ids through the model's chat template, and the template's end-of-turn ids."""
    from paged.serve.chat_template import ChatRenderer

    model = llm.model
    if model.chat_template is None:
        raise SystemExit(f"{llm.model_path}: no chat template; the answer set asks chat questions")
    renderer = ChatRenderer(model.tokenizer, model.chat_template, model.special_tokens)
    prompts = [renderer.encode([{"role": "user", "content": q.prompt}])[1] for q in QUESTIONS]
    return prompts, sorted(renderer.end_of_turn_ids)


def run(model: str, dtype: str = "auto", quantization: str | None = None) -> dict:
    """Score one configuration in this process: answers, score, load time, peak memory, one-stream speed."""
    from paged import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=model, dtype=dtype, quantization=quantization)
    load_s = time.perf_counter() - start
    prompts, stops = chat_prompts(llm)
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=stops)
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    answers = [llm.tokenizer.decode(o.outputs[0].token_ids, skip_special_tokens=True).strip() for o in outputs]
    passed = [q.passes(a) for q, a in zip(QUESTIONS, answers)]
    one = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm up
    start = time.perf_counter()
    out = llm.generate([prompts[0]], one, use_tqdm=False)[0]
    decode_s = time.perf_counter() - start
    by_kind = {}
    for q, ok in zip(QUESTIONS, passed):
        by_kind.setdefault(q.kind, []).append(ok)
    return {
        "model": str(model), "dtype": str(next(llm.model.model.parameters()).dtype).removeprefix("torch."),
        "quantization": quantization, "score": sum(passed), "of": len(QUESTIONS),
        "by_kind": {k: f"{sum(v)}/{len(v)}" for k, v in by_kind.items()},
        "load_s": round(load_s, 1), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "one_stream_tok_s": round(len(out.outputs[0].token_ids) / decode_s, 1),
        "answers": [{"prompt": q.prompt, "answer": a, "pass": ok} for q, a, ok in zip(QUESTIONS, answers, passed)],
    }


def candidates() -> list[tuple[str, str, str | None]]:
    """``(model, dtype, quantization)`` of every candidate the package registries ship that is here."""
    from paged.models.default import chat_model_path, gemma3_path

    found = []
    for path in (chat_model_path(), gemma3_path()):
        if path is not None and Path(path).is_file():
            found += [(str(path), "bfloat16", None), (str(path), "bfloat16", "gguf")]
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a GGUF file or checkpoint folder (default: the default model)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None, choices=[None, "gguf"])
    p.add_argument("--candidates", action="store_true", help="score every candidate, one process each")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args(argv)
    if args.candidates:
        rows = []
        for model, dtype, quant in candidates():
            cmd = [sys.executable, __file__, "--model", model, "--dtype", dtype, "--json"]
            cmd += ["--quantization", quant] if quant else []
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print("| model | dtype | quantization | score | facts | arithmetic | code | instructions | load s | peak MB "
              "| one-stream tok/s |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            k = r["by_kind"]
            print(f"| {Path(r['model']).name} | {r['dtype']} | {r['quantization'] or 'dense'} | {r['score']}/{r['of']} "
                  f"| {k['fact']} | {k['arithmetic']} | {k['code']} | {k['instruction']} | {r['load_s']} "
                  f"| {r['peak_rss_mb']} | {r['one_stream_tok_s']} |")
        if args.json:
            print(json.dumps(rows))
        return 0
    from paged.models.default import default_model

    result = run(args.model or default_model()[0], args.dtype, args.quantization)
    if args.json:
        print(json.dumps(result))
    else:
        for a in result["answers"]:
            print(f"[{'pass' if a['pass'] else 'FAIL'}] {a['prompt']}\n    {a['answer'][:200]!r}")
        print(f"score {result['score']}/{result['of']} {result['by_kind']}; load {result['load_s']} s, "
              f"peak {result['peak_rss_mb']} MB, one stream {result['one_stream_tok_s']} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
