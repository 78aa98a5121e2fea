"""Same request, same answer, against a running server: repeats, a stream, and 64 at once vs solo.

Run ``make serve`` (the defaults: SmolLM2, bfloat16, prefix cache on), then

    python tools/same_answer_check.py --url http://127.0.0.1:8000 [--json]

1. The chat request "Write a Python function that reverses a list." (``temperature: 0``,
   ``max_tokens: 120``) three times and once streamed: one answer, or the first difference.
2. 64 mixed requests (chat and completions; greedy with logprobs, and seeded sampling; short and
   long prompts; some sharing a system prompt, so some hit the prefix cache) sent all at once,
   then each one again alone, one after the other. Each concurrent answer must equal its solo
   answer: the text, and for the greedy ones each token's logprob, as the JSON floats (bitwise).

Prints one line per part and exits 1 if any answer differs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx

CHAT = {"messages": [{"role": "user", "content": "Write a Python function that reverses a list."}],
        "temperature": 0, "max_tokens": 120}
SYSTEMS = ["You are a careful Python tutor. Answer with code and one sentence of explanation.",
           "You are a terse assistant who answers in one line."]
TOPICS = ["sorts a dict by value", "counts words in a string", "checks if a number is prime",
          "flattens a nested list", "reads a CSV file", "merges two sorted lists", "computes a factorial",
          "removes duplicates from a list"]


def mixed_requests(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    """``n`` requests mixing what the engine batches differently; the same list for one seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        greedy = i % 4 != 3
        sampling = {"temperature": 0} if greedy else {"temperature": 0.8, "seed": 1000 + i}
        max_tokens = rng.choice([8, 24, 48])
        if i % 2 == 0:
            system = SYSTEMS[i % 4 // 2]
            body = {"messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": f"Write a function that {topic}."}],
                    "max_tokens": max_tokens, **sampling}
            if greedy:
                body |= {"logprobs": True, "top_logprobs": 1}
            out.append(("/v1/chat/completions", body))
        else:
            prompt = f"# Python\n# A function that {topic}\n" + "x = 1\n" * rng.choice([0, 20, 60]) + "def f("
            body = {"prompt": prompt, "max_tokens": max_tokens, **sampling}
            if greedy:
                body |= {"logprobs": 1}
            out.append(("/v1/completions", body))
    return out


def answer(path: str, data: dict) -> tuple[str, list[float] | None]:
    """The text and the chosen tokens' logprobs (None when not asked) of a response body."""
    c = data["choices"][0]
    if path == "/v1/chat/completions":
        lp = c.get("logprobs")
        return c["message"]["content"], [t["logprob"] for t in lp["content"]] if lp else None
    lp = c.get("logprobs")
    return c["text"], list(lp["token_logprobs"]) if lp else None


def first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def streamed_chat(client: httpx.Client, model: str) -> str:
    text = []
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "model": model, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    text.append(c["delta"].get("content") or "")
    return "".join(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    report: dict = {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        post = lambda path, body: client.post(path, json={**body, "model": model})  # noqa: E731

        texts = [post("/v1/chat/completions", CHAT).json()["choices"][0]["message"]["content"] for _ in range(3)]
        texts.append(streamed_chat(client, model))
        same = all(t == texts[0] for t in texts)
        report["repeat"] = {"answers": len(texts), "distinct": len(set(texts)), "answer": texts[0]}
        print(f"reverse-list chat, 3 times + streamed: {len(set(texts))} distinct answer(s)")
        for i, t in enumerate(texts[1:], 1):
            if t != texts[0]:
                print(f"  answer {i} differs from answer 0 at character {first_difference(t, texts[0])}")

        requests = mixed_requests(args.num_requests)
        with ThreadPoolExecutor(len(requests)) as pool:
            together = list(pool.map(lambda r: post(*r), requests))
        solo = [post(*r) for r in requests]
        bad = []
        for i, ((path, _), a, b) in enumerate(zip(requests, together, solo)):
            if a.status_code != 200 or b.status_code != 200:
                bad.append((i, f"status {a.status_code} / {b.status_code}"))
            elif answer(path, a.json()) != answer(path, b.json()):
                bad.append((i, f"differs at character {first_difference(answer(path, a.json())[0], answer(path, b.json())[0])}"))
        greedy = sum(1 for _, body in requests if body["temperature"] == 0)
        report["concurrent"] = {"requests": len(requests), "greedy_with_logprobs": greedy,
                                "equal_to_solo": len(requests) - len(bad), "differences": bad}
        print(f"{len(requests)} concurrent vs solo ({greedy} greedy with logprobs, "
              f"{len(requests) - greedy} seeded sampling): {len(requests) - len(bad)} equal, {len(bad)} differ")
        for i, why in bad:
            print(f"  request {i} ({requests[i][0]}): {why}")
    if args.json:
        print(json.dumps(report))
    return 0 if same and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
