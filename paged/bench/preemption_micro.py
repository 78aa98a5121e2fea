"""Figure 19a: one group's swap out and in against its recomputation (paper §4.5, §7.3).

``micro`` makes a ``PreemptingEngine`` compute the prompts of ``num_seqs``
sequences of ``seq_len`` tokens once; then, ``repeats`` times after one
warm-up (medians reported), it times through step05's own code:

- *swap* = ``SwappingKVManager.swap_out`` + the runner's ``execute_memory_ops`` on a
  plan with those ``blocks_to_swap_out`` (``copy_between`` device → host),
  then ``swap_in`` + ``execute_memory_ops`` back (host → device): the block
  moves the engine makes. ``swap_ms`` is the two copies; the allocator
  bookkeeping of ``swap_out`` / ``swap_in`` (a Python loop over the table
  entries) is timed apart. The first round trip is checked: the K/V come
  back bitwise equal.
- *recompute* = ``runner.execute`` of the captured prefill ``StepPlan`` of
  the same tokens (read with an engine observer): one forward pass with
  paged attention, K/V written to their slots, one token sampled per
  sequence — what a recomputed group costs on resume.

On a GPU the clock reads after a synchronize.
"""

from __future__ import annotations

import statistics
import time

import torch

from paged.bench.traces import random_prompts
from paged.step03_attention import StepPlan
from paged.step05_preemption import PreemptingEngine, SamplingParams


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --8<-- [start:micro]
def micro(model, block_size: int, num_seqs: int, seq_len: int, repeats: int, seed: int = 0,
          clock=time.perf_counter) -> dict:
    """Median milliseconds to swap ``num_seqs x seq_len`` tokens out and in, and to recompute them."""
    blocks = num_seqs * -(-seq_len // block_size)
    engine = PreemptingEngine(model, block_size=block_size, num_blocks=blocks, enable_prefix_caching=False,
                              max_num_seqs=num_seqs, max_num_batched_tokens=num_seqs * seq_len,
                              swap_space=blocks * _bytes_per_block(model, block_size), seed=seed)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for i, prompt in enumerate(random_prompts([seq_len] * num_seqs, model.config.vocab_size, seed)):
        engine.add_request(f"seq{i}", prompt, greedy)
    prefill = _first_plan(engine)  # computes the prompts; keeps their plan
    runner, kv, device = engine.runner, engine.kv_cache, engine.kv_cache.device
    seqs = [r.seqs[0] for r in engine.scheduler.running]
    tables = [s.block_table for s in seqs]
    kv_manager = engine.scheduler.kv
    times = {"swap_out": [], "swap_in": [], "bookkeeping": [], "recompute": []}
    for rep in range(repeats + 1):  # the first round is the warm-up (and the check)
        before = kv.data[:, :, [b for t in tables for b in t.blocks]].clone() if rep == 0 else None
        t0 = clock()
        out = kv_manager.swap_out(seqs)
        t1 = clock()
        runner.execute_memory_ops(StepPlan(blocks_to_swap_out=out))
        _sync(device)
        t2 = clock()
        back = kv_manager.swap_in(seqs)
        t3 = clock()
        runner.execute_memory_ops(StepPlan(blocks_to_swap_in=back))
        _sync(device)
        t4 = clock()
        runner.execute(prefill)
        _sync(device)
        t5 = clock()
        if rep == 0:
            after = kv.data[:, :, [b for t in tables for b in t.blocks]]
            if not torch.equal(before, after):
                raise AssertionError(f"block size {block_size}: K/V changed across a swap round trip")
            continue
        for key, secs in (("swap_out", t2 - t1), ("swap_in", t4 - t3), ("bookkeeping", t1 - t0 + t3 - t2),
                          ("recompute", t5 - t4)):
            times[key].append(1e3 * secs)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"block_size": block_size, "blocks": blocks, "swap_out_ms": med["swap_out"],
            "swap_in_ms": med["swap_in"], "swap_ms": med["swap_out"] + med["swap_in"],
            "bookkeeping_ms": med["bookkeeping"], "recompute_ms": med["recompute"]}
# --8<-- [end:micro]


def _bytes_per_block(model, block_size: int) -> int:
    c = model.config
    itemsize = next(model.model.parameters()).element_size()
    return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * itemsize


def _first_plan(engine: PreemptingEngine) -> StepPlan:
    """Run one engine step and return the plan its runner executed."""
    seen = []

    def observe(engine, plan, results):
        seen.append(plan)

    engine.add_observer(observe)
    try:
        engine.step()
    finally:
        engine.remove_observer(observe)
    return seen[0]
