"""Preemption is invisible, as a property: any workload, any pool that can finish it.

Hypothesis draws a whole workload — how many requests, their prompt and
output lengths (0/1 and block size +-1 included), parallel sampling, beam
search, a prompt prefix shared between requests, stop token ids, logprobs —
and an engine setting: block size, preemption mode (swap / recompute / auto),
the token budget of an iteration (small budgets mean chunked prefill) and a
KV pool from the smallest that can hold the largest request up to a roomy one.

The same requests then run on an unconstrained engine of the same kind (a
pool that never preempts, the default budget). Every request's tokens must be
**equal** and every logprob equal **up to ``FLOAT64``**: the model runs in
float64 on the reference attention path, so a recomputed or chunked prefill
computes the same values, but a chunk is a GEMM of another shape, whose BLAS
blocking may sum in another order (a few ulps). The tokens are compared
exactly because a few ulps cannot flip an argmax or a seeded draw here (the
model's logits are far apart relative to 1e-12). After the run no device or
host block may be used.

The model is a 2-layer random LLaMA (hidden 64, vocab 160): a counterexample
shrinks to a few short requests, readable as they are printed.
"""

import math
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings, strategies as st

from paged.models import load_model
from paged.step02_block_table import KVCache
from paged.step05_preemption import PreemptingEngine, SamplingParams
from tests.engine_loop import drain
from tests.hf_models import build_hf_model, save_checkpoint
from tests.tolerances import FLOAT64

VOCAB = 160
MAX_LEN = 128  # the tiny model's context


@pytest.fixture(scope="module")
def model():
    return load_model(save_checkpoint(build_hf_model("llama"), tempfile.mkdtemp()), dtype=torch.float64)


@st.composite
def requests(draw, block_size: int):
    """A list of ``(request_id, prompt, SamplingParams keywords)``; lengths hug the block boundaries.

    Keywords rather than ``SamplingParams`` objects, so a counterexample prints only what was set.
    """
    near_block = st.sampled_from([1, block_size - 1, block_size, block_size + 1, 2 * block_size + 1])
    length = st.one_of(near_block, st.integers(1, 3 * block_size))
    prefix = draw(st.lists(st.integers(3, VOCAB - 1), min_size=block_size, max_size=2 * block_size))
    out = []
    for i in range(draw(st.integers(2, 4))):
        size = draw(length)
        prompt = draw(st.lists(st.integers(3, VOCAB - 1), min_size=size, max_size=size))
        if draw(st.booleans()):  # shares a prefix with the other requests that drew True
            prompt = prefix + prompt
        kind = draw(st.sampled_from(["greedy", "seeded", "parallel", "beam"]))
        common = dict(max_tokens=draw(st.one_of(st.integers(6, 16), near_block, st.integers(1, 3))),
                      logprobs=draw(st.sampled_from([None, 0, 2])))
        if draw(st.booleans()):
            common["stop_token_ids"] = draw(st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=3))
        else:
            common["ignore_eos"] = True
        if kind == "greedy":
            params = dict(temperature=0, **common)
        elif kind == "seeded":
            params = dict(temperature=1.0, top_p=0.9, seed=draw(st.integers(0, 99)), **common)
        elif kind == "parallel":
            params = dict(n=draw(st.integers(2, 3)), temperature=1.0, seed=draw(st.integers(0, 99)), **common)
        else:
            width = draw(st.integers(2, 3))
            params = dict(n=draw(st.integers(1, width)), best_of=width, use_beam_search=True,
                          temperature=0, **{**common, "logprobs": None})
        if params["logprobs"] is None:
            del params["logprobs"]
        out.append((f"r{i}-{kind}", prompt[: MAX_LEN - common["max_tokens"] - 1], params))
    return out


def smallest_pool(prompt, params: dict, block_size: int) -> int:
    """A pool in which the request alone is sure to finish, by the engine's own accounting.

    Each of its sequences may hold all of its blocks alone (a recomputed group is prefilled
    sequence by sequence, without sharing), and an iteration reserves one more block per
    sequence for its next token (a new block, or the copy of a shared one).
    """
    seqs = params.get("best_of", params.get("n", 1))
    return seqs * (math.ceil((len(prompt) + params["max_tokens"]) / block_size) + 1)


def run(model, workload, **engine_kwargs):
    """Every request to the end; (tokens, logprobs) per completion, and the engine."""
    cfg, blocks = model.config, engine_kwargs["num_blocks"]
    per_block = KVCache.bytes_per_block(cfg.num_layers, engine_kwargs["block_size"], cfg.num_kv_heads,
                                        cfg.head_dim, torch.float64)
    engine = PreemptingEngine(model, attention_backend="reference", swap_space=blocks * per_block,
                              **engine_kwargs)  # a host pool as large as the device pool, not 256 MiB
    finished = drain(engine, [(rid, prompt, SamplingParams(**params)) for rid, prompt, params in workload],
                     max_steps=3000)  # fails on a hang or a leaked device block
    assert engine.scheduler.kv.host.num_used == 0, "host blocks leaked"
    assert sorted(finished) == sorted(rid for rid, _, _ in workload), "a request never finished"
    done = {rid: [(o.token_ids, o.logprobs) for o in out.outputs] for rid, out in finished.items()}
    return done, engine


def _logprob_values(logprobs):
    """``(token, logprob)`` of every position of one completion, each position's tokens sorted."""
    return [item for position in logprobs or [] for item in sorted(position.items())]


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_workload_under_any_sufficient_pool_matches_an_unconstrained_run(model, data):
    block_size = data.draw(st.sampled_from([2, 4, 8]), label="block_size")
    workload = data.draw(requests(block_size), label="workload")
    mode = data.draw(st.sampled_from(["swap", "recompute", "auto"]), label="preemption_mode")
    smallest = max(smallest_pool(p, sp, block_size) for _, p, sp in workload)
    num_blocks = smallest + data.draw(st.sampled_from([0, 1, 2]), label="blocks above the smallest pool")
    budget = data.draw(st.sampled_from([block_size, 3 * block_size, 2048]), label="max_num_batched_tokens")
    roomy = sum(smallest_pool(p, sp, block_size) for _, p, sp in workload)

    expected, _ = run(model, workload, block_size=block_size, num_blocks=roomy)
    got, engine = run(model, workload, block_size=block_size, num_blocks=num_blocks,
                      preemption_mode=mode, max_num_batched_tokens=budget)
    preempted = engine.stats()["preemptions"]
    note(f"preemptions: {preempted}")
    event("preempted" if sum(preempted.values()) else "not preempted")
    for rid in expected:
        assert [t for t, _ in got[rid]] == [t for t, _ in expected[rid]], rid
        for (_, lp_got), (_, lp_exp) in zip(got[rid], expected[rid]):
            a, b = _logprob_values(lp_got), _logprob_values(lp_exp)
            assert [t for t, _ in a] == [t for t, _ in b], rid
            if a:
                torch.testing.assert_close(torch.tensor([v for _, v in a], dtype=torch.float64),
                                           torch.tensor([v for _, v in b], dtype=torch.float64), **FLOAT64)


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_pool_that_holds_the_prompts_finishes_every_request_and_frees_every_block(model, data):
    """Liveness below the sufficient pool: nothing hangs, every request ends, no block leaks.

    The pool may be too small for a group to grow to its full length; the engine then ends that
    group early (``finish_reason="length"``) instead of waiting for room that never comes.
    """
    block_size = data.draw(st.sampled_from([2, 4, 8]), label="block_size")
    workload = data.draw(requests(block_size), label="workload")
    fewest = max(math.ceil(len(p) / block_size) for _, p, _ in workload)
    most = max(smallest_pool(p, sp, block_size) for _, p, sp in workload)
    num_blocks = data.draw(st.integers(fewest, most), label="num_blocks")
    mode = data.draw(st.sampled_from(["swap", "recompute", "auto"]), label="preemption_mode")
    budget = data.draw(st.sampled_from([block_size, 3 * block_size, 2048]), label="max_num_batched_tokens")
    run(model, workload, block_size=block_size, num_blocks=num_blocks, preemption_mode=mode,
        max_num_batched_tokens=budget)
