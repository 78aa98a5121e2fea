"""The Hugging Face baseline: paged vs ``transformers`` on the same model, workload and KV memory.

One workload (``paged.bench.e2e``: a trace with lengths divided by
``--length-scale``, random prompts, every request present at t = 0, greedy,
``max_tokens`` = the trace's output length, EOS ignored) through three systems,
one after the other in the same process, each timed by ``--clock``:

* **paged** — ``ReservingEngine(memory="paged")`` (the step05 engine) with
  ``--kv-tokens`` of KV cache;
* **hf-static** — ``model.generate`` with static batching and left padding.
  Batches are cut first-come-first-served, as large as the same KV budget
  allows for the padded batch: ``b x (longest prompt + longest output) <=
  kv_tokens`` (generous to the baseline: it knows the output lengths). Every
  row runs to the batch's longest output (``min_new_tokens``); only the
  trace's tokens count as output;
* **hf-continuous** — transformers' own continuous batching
  (``init_continuous_batching`` / ``ContinuousBatchingManager``), given the
  same number of KV tokens (``num_blocks x block_size``), when the installed
  version has it; otherwise (or if it fails) the reason is printed.

Reported: output tokens/s of each, and paged's ratio to each. The goal:
paged >= 3x static ``generate`` at equal memory.

Examples:
    python -m paged.bench hf
    python -m paged.bench hf --num-requests 32 --json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from paged.bench import e2e
from paged.step03_attention import SamplingParams
from paged.bench.reservation import ReservingEngine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    e2e.add_common_arguments(parser, num_requests=64)
    parser.add_argument("--no-continuous", action="store_true", help="skip transformers' continuous batching")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def run_paged(model, jobs, args, clock) -> dict:
    engine = ReservingEngine(model, memory="paged", block_size=args.block_size,
                             num_blocks=args.kv_tokens // args.block_size, max_model_len=e2e.max_model_len(args),
                             seed=args.seed)
    for i, j in enumerate(jobs):
        engine.add_request(str(i), j.prompt, SamplingParams(temperature=0.0, max_tokens=j.output_len,
                                                            ignore_eos=True))
    start = clock()
    while engine.has_unfinished():
        engine.step()
    return {"seconds": clock() - start, "output_tokens": engine.generation_tokens_total}


def static_batches(jobs: list[e2e.Job], kv_tokens: int) -> list[list[e2e.Job]]:
    """FCFS batches whose padded KV, ``b x (longest prompt + longest output)``, fits ``kv_tokens``."""
    batches, cur = [], []
    for j in jobs:
        trial = cur + [j]
        width = max(len(x.prompt) for x in trial) + max(x.output_len for x in trial)
        if cur and len(trial) * width > kv_tokens:
            batches.append(cur)
            trial = [j]
        cur = trial
    return batches + [cur]


# --8<-- [start:static]
def run_static(hf_model, jobs, args, clock) -> dict:
    """``generate`` over left-padded static batches; every row runs to the batch's longest output."""
    batches = static_batches(jobs, args.kv_tokens)
    start = clock()
    for batch in batches:
        width = max(len(j.prompt) for j in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for r, j in enumerate(batch):
            ids[r, width - len(j.prompt):] = torch.tensor(j.prompt)
            mask[r, width - len(j.prompt):] = 1
        new = max(j.output_len for j in batch)
        with torch.inference_mode():
            hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0)
    return {"seconds": clock() - start, "output_tokens": sum(j.output_len for j in jobs),
            "batches": len(batches), "mean_batch": len(jobs) / len(batches)}
# --8<-- [end:static]


def run_continuous(hf_model, jobs, args, clock) -> dict:
    """transformers' continuous batching with the same KV tokens; raises if unavailable."""
    return continuous_batching(hf_model, [j.prompt for j in jobs], [j.output_len for j in jobs],
                               num_blocks=args.kv_tokens // args.block_size, block_size=args.block_size,
                               clock=clock, allow_block_sharing=False)


def continuous_batching(hf_model, prompts: list[list[int]], output_lens: list[int], *, num_blocks: int,
                        block_size: int, clock, max_batch_tokens: int = 2048, timeout_s: float | None = None,
                        warmup: list[list[int]] = (), **config) -> dict:
    """Generate ``output_lens[i]`` tokens (EOS off, greedy) for every prompt through transformers'
    ``ContinuousBatchingManager``, all requests queued at once; raises if the API is missing or fails.

    Args:
        num_blocks, block_size: its paged KV cache (``ContinuousBatchingConfig``).
        timeout_s: stop waiting after this long: the result then has ``"timed_out": True`` and
            counts the tokens of the requests that finished.
        warmup: prompts to run first, untimed, 8 new tokens each, after the manager's own warm-up
            (its CUDA graphs); other than the workload's, so that no prefix of it is cached.
        **config: more ``ContinuousBatchingConfig`` fields.

    Returns:
        ``{"seconds", "output_tokens", "finished", "timed_out"}``.
    """
    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    cfg = ContinuousBatchingConfig(num_blocks=num_blocks, block_size=block_size, max_batch_tokens=max_batch_tokens,
                                   **config)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(output_lens), eos_token_id=None)
    manager = hf_model.init_continuous_batching(generation_config=gen, continuous_batching_config=cfg)
    if warmup and hasattr(manager, "warmup"):
        manager.warmup()  # CUDA graphs captured before the clock starts, as generate_batch does
    manager.start()
    try:
        for i, prompt in enumerate(warmup):
            manager.add_request(prompt, request_id=f"warmup-{i}", max_new_tokens=8)
        _collect(manager, len(warmup), clock, None)
        start = clock()
        for i, (prompt, n) in enumerate(zip(prompts, output_lens)):
            manager.add_request(prompt, request_id=str(i), max_new_tokens=n)
        done, tokens = _collect(manager, len(prompts), clock, None if timeout_s is None else start + timeout_s)
        seconds = clock() - start
    finally:  # hard: a run stopped at its time limit fails what is still queued instead of finishing it
        manager.stop(block=True, timeout=60, hard_stop=True)
    return {"seconds": seconds, "output_tokens": tokens, "finished": done, "timed_out": done < len(prompts)}


def _collect(manager, count: int, clock, deadline: float | None) -> tuple[int, int]:
    """Wait for ``count`` finished requests (or the deadline): (finished, generated tokens)."""
    done, tokens = 0, 0
    while done < count:
        wait = 60.0 if deadline is None else min(60.0, deadline - clock())
        if wait <= 0:
            break
        result = manager.get_result(timeout=wait)
        if result is None:
            if deadline is not None and clock() >= deadline:
                break
            raise RuntimeError("no result within 60 s" if manager.is_running() else "its thread stopped")
        if result.is_finished():
            if result.error is not None:
                raise RuntimeError(f"request {result.request_id} failed: {result.error}")
            done += 1
            tokens += len(result.generated_tokens)
    return done, tokens


def run(args: argparse.Namespace) -> int:
    prog = "python -m paged.bench hf"
    try:
        torch.set_num_threads(1)
        model, path, line = e2e.load(args)
        jobs = e2e.workload(args, model.config.vocab_size)
        import transformers

        transformers.logging.set_verbosity_error()
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    except (ValueError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    # the CB manager runs in its own thread: time it by the wall clock whatever --clock says
    clock = e2e.CLOCKS[args.clock]
    print(line)
    print(f"trace {args.trace} (lengths / {args.length_scale}): {e2e.describe(jobs)}, all at t=0, greedy, "
          f"EOS ignored; KV budget {args.kv_tokens} tokens; clock {args.clock}; transformers "
          f"{transformers.__version__}")
    run_paged(model, jobs[:4], args, clock)  # warm-up
    systems = {"paged": run_paged(model, jobs, args, clock), "hf_static": run_static(hf_model, jobs, args, clock)}
    notes = {"hf_static": f"{systems['hf_static']['batches']} static batches, "
                          f"mean {systems['hf_static']['mean_batch']:.1f} requests"}
    if args.no_continuous:
        notes["hf_continuous"] = "skipped (--no-continuous)"
    elif not hasattr(hf_model, "init_continuous_batching"):
        notes["hf_continuous"] = f"not in transformers {transformers.__version__}"
    else:
        try:
            systems["hf_continuous"] = run_continuous(hf_model, jobs, args, e2e.CLOCKS["wall"])
            notes["hf_continuous"] = "wall clock (its own thread)"
        except Exception as e:  # an experimental API: report, do not crash the comparison
            notes["hf_continuous"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    for m in systems.values():
        m["tokens_per_s"] = m["output_tokens"] / m["seconds"]
    paged = systems["paged"]["tokens_per_s"]
    print(f"{'system':<15}{'seconds':>9}{'out tokens':>12}{'tok/s':>9}{'paged / x':>11}")
    for name, m in systems.items():
        print(f"{name:<15}{m['seconds']:>9.2f}{m['output_tokens']:>12d}{m['tokens_per_s']:>9.0f}"
              f"{paged / m['tokens_per_s']:>11.2f}  {notes.get(name, '')}")
    for name, note in notes.items():
        if name not in systems:
            print(f"{name:<15}{note}")
    if args.json:
        print(json.dumps({"trace": args.trace, "kv_tokens": args.kv_tokens, "systems": {
            n: {"tokens_per_s": m["tokens_per_s"], "seconds": m["seconds"], "output_tokens": m["output_tokens"]}
            for n, m in systems.items()},
            "ratios": {f"paged_over_{n}": paged / m["tokens_per_s"] for n, m in systems.items() if n != "paged"},
            "notes": notes}))
    return 0
