"""Figure 19b: a starved ShareGPT-like workload under swap, recompute and auto (paper §7.3).

A synthetic ShareGPT-like trace (``paged.bench.traces``) with every length
divided by a scale (rounded up) so it runs in about a minute on two cores.
All requests arrive at once (t = 0), greedy, EOS ignored, ``max_tokens`` =
the trace's output length. The KV pool holds a fraction of the blocks all
requests would need at their full length (at least the longest request plus
one block), which forces many preemptions; the host pool is ample.

``run_workload`` reports the paper's normalized latency (mean over requests
of finish time / output tokens), throughput (output tokens / makespan),
preemptions by kind, tokens through the model (recomputation adds some) and
blocks moved to and from the host (both counted by an engine observer from
the plans executed), iterations, and a digest of the outputs, which must be
identical in every mode (float64 model: recomputation gives the same values
as the first pass, so greedy tokens cannot flip). ``end_to_end`` runs each
mode on fresh engines, interleaved; ``record_timeline`` keeps
``engine.stats()`` after every iteration for the timeline figure.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time

from paged.bench.traces import random_prompts, synthetic_trace
from paged.step01_allocator.waste import TraceRequest
from paged.step05_preemption import PREEMPTION_MODES, PreemptingEngine, SamplingParams

MAX_LEN = 2048  # the trace's longest prompt + output


def scaled_trace(num_requests: int, seed: int, length_scale: int) -> list[TraceRequest]:
    """The synthetic ShareGPT trace with every length divided by ``length_scale`` (rounded up)."""
    trace = synthetic_trace("sharegpt", num_requests, seed, MAX_LEN)
    return [TraceRequest(-(-r.prompt_len // length_scale), -(-r.output_len // length_scale)) for r in trace]


def pool_blocks(trace: list[TraceRequest], block_size: int, fraction: float) -> int:
    """``fraction`` of the blocks every request needs at full length; at least the longest + 1."""
    need = [-(-r.total_len // block_size) for r in trace]
    return max(max(need) + 1, round(fraction * sum(need)))


# --8<-- [start:workload]
def run_workload(engine: PreemptingEngine, trace: list[TraceRequest], seed: int,
                 timeline: list | None = None, clock=time.perf_counter) -> dict:
    """All of ``trace`` at t = 0, greedy, until done; appends ``engine.stats()`` per step to ``timeline``."""
    prompts = random_prompts([r.prompt_len for r in trace], engine.model.config.vocab_size, seed)
    for i, (r, prompt) in enumerate(zip(trace, prompts)):
        engine.add_request(f"req{i}", prompt, SamplingParams(temperature=0, max_tokens=r.output_len,
                                                             ignore_eos=True))
    outputs, finish, steps, work = {}, {}, 0, {"tokens": 0, "blocks": 0}

    def count(engine, plan, results):  # what the runner was asked to do: tokens through the model, blocks moved
        work["tokens"] += plan.num_tokens
        work["blocks"] += len(plan.blocks_to_swap_out) + len(plan.blocks_to_swap_in)

    engine.add_observer(count)
    start = clock()
    try:
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    finish[out.request_id] = clock() - start
                    outputs[out.request_id] = out.outputs[0].token_ids
            steps += 1
            if timeline is not None:
                timeline.append(engine.stats())
    finally:
        engine.remove_observer(count)
    elapsed = clock() - start
    kv = engine.scheduler.kv
    assert kv.allocator.num_used == 0 and kv.host.num_used == 0, "blocks leaked"
    tokens = sum(len(t) for t in outputs.values())
    digest = hashlib.sha256(json.dumps([outputs[f"req{i}"] for i in range(len(trace))]).encode()).hexdigest()
    return {
        "normalized_latency_s": statistics.mean(finish[k] / len(outputs[k]) for k in outputs),
        "throughput_tok_s": tokens / elapsed,
        "output_tokens": tokens,
        "time_s": elapsed,
        "iterations": steps,
        "preemptions": dict(engine.scheduler.preemptions),
        "tokens_computed": work["tokens"],
        "blocks_moved": work["blocks"],
        "outputs_sha256": digest[:16],
    }
# --8<-- [end:workload]


def end_to_end(model, trace, block_size: int, num_blocks: int, seed: int, rounds: int = 1,
               clock=time.perf_counter) -> dict:
    """``run_workload`` under each mode on fresh engines, modes interleaved, ``rounds`` times.

    Times are the medians over rounds; the schedule does not depend on time, so
    the counts are the same in every round. ``outputs_identical``: every run of
    every mode produced the same tokens.
    """
    runs: dict = {mode: [] for mode in PREEMPTION_MODES}
    for _ in range(rounds):
        for mode in PREEMPTION_MODES:
            engine = PreemptingEngine(model, block_size=block_size, num_blocks=num_blocks, preemption_mode=mode,
                                      enable_prefix_caching=False, seed=seed)
            runs[mode].append(run_workload(engine, trace, seed, clock=clock))
    digests = {r["outputs_sha256"] for rs in runs.values() for r in rs}
    result = {}
    for mode, rs in runs.items():
        result[mode] = {**rs[0], **{k: statistics.median(r[k] for r in rs)
                                    for k in ("normalized_latency_s", "throughput_tok_s", "time_s")},
                        "rounds": rounds, "outputs_identical": len(digests) == 1}
    return result


def record_timeline(model, trace, block_size: int, num_blocks: int, seed: int, swap_space: int) -> dict:
    """``engine.stats()`` after every step of a swap run and of a recompute run of ``trace``."""
    runs = {}
    for mode in ("swap", "recompute"):
        engine = PreemptingEngine(model, block_size=block_size, num_blocks=num_blocks, preemption_mode=mode,
                                  enable_prefix_caching=False, swap_space=swap_space, seed=seed)
        rows: list = []
        run_workload(engine, trace, seed, timeline=rows)
        runs[mode] = rows
    return runs
