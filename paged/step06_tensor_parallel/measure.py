"""Measure step06: what the driver broadcasts each iteration, and what W ranks cost per step.

    python -m paged.step06_tensor_parallel.measure                # plan sizes only
    python -m paged.step06_tensor_parallel.measure --tp 2         # and decode-step times, W = 2 vs 1
    python -m paged.step06_tensor_parallel.measure --tp 2 --model PATH

**Broadcast size.** Each iteration rank 0 pickles one ``StepPlan`` and
broadcasts it (``TPGroup.broadcast_object``: an 8-byte length, then the
bytes). ``plan_bytes`` measures exactly that payload for plans shaped like
the engine's: a decode iteration of S sequences with contexts of C tokens (one
token, one slot, one block table of ``ceil(C / B)`` ids each), and a prefill
iteration of S prompts of P tokens. The plan carries every sequence's
``SamplingParams`` whole, so it grows with S, not with the model.

**Step time** (``--tp W``). The same greedy batch runs on a W = 1 engine and
on a W-rank engine in this process, over ``--model`` or else a random LLaMA
of the demo model's shape (the time depends on the shape, not the weights);
the mean time of a decode step is reported for both
and as a ratio. On a CPU with small models, W ranks are slower (every layer
waits for two all-reduces between processes); tensor parallelism pays when
one device cannot hold the model or its KV cache, or computes too slowly.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time

from paged.step03_attention import SamplingParams
from paged.step03_attention.plan import StepPlan


def plan_bytes(plan) -> int:
    """Bytes of the pickled plan: the payload broadcast to every worker."""
    return len(pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL))


def decode_plan(num_seqs: int, context: int, block_size: int = 16) -> StepPlan:
    """A decode iteration: ``num_seqs`` sequences at ``context`` tokens, one new token each."""
    plan, blocks = StepPlan(), -(-context // block_size)
    for s in range(num_seqs):
        table = list(range(s * blocks, (s + 1) * blocks))
        slot = table[-1] * block_size + (context - 1) % block_size
        plan.add(s, [1000 + s], context - 1, [slot], context, table, True,
                 SamplingParams(temperature=0.8, top_p=0.95, max_tokens=256), 12345 + s)
    return plan


def prefill_plan(num_seqs: int, prompt_len: int, block_size: int = 16) -> StepPlan:
    """A prefill iteration: ``num_seqs`` prompts of ``prompt_len`` tokens."""
    plan, blocks = StepPlan(), -(-prompt_len // block_size)
    for s in range(num_seqs):
        table = list(range(s * blocks, (s + 1) * blocks))
        slots = [table[i // block_size] * block_size + i % block_size for i in range(prompt_len)]
        plan.add(s, list(range(prompt_len)), 0, slots, prompt_len, table, True,
                 SamplingParams(temperature=0.8, top_p=0.95, max_tokens=256), 12345 + s)
    return plan


def step_times(model: str, world: int, num_seqs: int, max_tokens: int, dtype: str) -> dict:
    """Mean decode-step seconds on W = 1 and on W = ``world`` for the same greedy batch."""
    from paged.models import load_model
    from paged.step06_tensor_parallel import TensorParallelEngine, load_sharded

    out = {}
    for w in (1, world):
        loaded = load_model(model, dtype=dtype) if w == 1 else load_sharded(model, dtype, "cpu", w)
        engine = TensorParallelEngine(loaded, tensor_parallel_size=w, num_blocks=256, block_size=16)
        for i in range(num_seqs):
            engine.add_request(str(i), [1 + (7 * i + j) % 50 for j in range(16)],
                               SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        engine.step()  # the prefill
        times = []
        while engine.has_unfinished():
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        engine.close()
        out[w] = sum(times) / len(times)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m paged.step06_tensor_parallel.measure",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=int, default=None, help="also time decode steps at W ranks against one")
    p.add_argument("--model", help="checkpoint for the timing (default: a random LLaMA of the demo model's shape)")
    p.add_argument("--num-seqs", type=int, default=8, help="sequences in the timed batch")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args(argv)
    result = {"plan_bytes": {}}
    print(f"{'iteration':<34}{'pickled StepPlan':>18}{'per sequence':>14}")
    for name, plan, s in [("decode, 1 seq, ctx 512", decode_plan(1, 512), 1),
                          ("decode, 32 seqs, ctx 512", decode_plan(32, 512), 32),
                          ("decode, 256 seqs, ctx 512", decode_plan(256, 512), 256),
                          ("prefill, 8 prompts x 512 tokens", prefill_plan(8, 512), 8)]:
        n = plan_bytes(plan)
        result["plan_bytes"][name] = n
        print(f"{name:<34}{n:>16,} B{n / s:>12,.0f} B")
    if args.tp:
        import tempfile

        from paged.models.random_llama import demo_shaped_llama

        with tempfile.TemporaryDirectory() as tmp:
            folder, which = (args.model, f"model: {args.model}") if args.model else demo_shaped_llama(tmp)
            print(which)
            t = step_times(str(folder), args.tp, args.num_seqs, args.max_tokens, args.dtype)
        result["step_seconds"] = {str(k): v for k, v in t.items()}
        result["ratio"] = t[args.tp] / t[1]
        print(f"decode step, {args.num_seqs} seqs: W=1 {t[1] * 1e3:.2f} ms, W={args.tp} {t[args.tp] * 1e3:.2f} ms, "
              f"ratio {result['ratio']:.2f}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
