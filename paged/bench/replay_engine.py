"""The engine of the replay: step05's scheduler unchanged, a stand-in for the model.

``ReplayEngine`` is the throughput bench's engine (``ReservingEngine``: the
step05 ``PreemptingEngine`` with ``memory="paged" | "orca-..."``) with one
class attribute changed, ``runner_class = ReplayRunner``. Everything that
decides what an iteration does — FCFS admission, block allocation, forks and
copy-on-write, prefix caching, gang preemption by swap or recompute, chunked
prefill, the Orca reservations — is the same code a real run executes; the
tests check that a replayed trace produces the same ``StepPlan``s as a run of
a real model.

``ReplayRunner`` takes a plan and returns what a ``ModelRunner`` returns (seq
id -> ``SampleResult``) without computing anything:

* the token a sequence draws is a hash of its sampling seed and position
  (``ignore_eos`` runs: the tokens' values change nothing downstream);
* when the request needs scores (beam search, best-of ranking, logprobs), a
  log-probability from the same hash; beam search gets its ``2 x width``
  proposals, distinct tokens with decreasing log-probabilities drawn from a
  hash of (seed, sequence, position), so beams fork and die as in a real search;
* it advances its ``elapsed`` seconds by the ``CostModel`` of the plan.

The stand-in "model" (``stand_in_model``) has one layer, one KV head of one
dimension and a tiny parameter, so the KV cache tensor the engine allocates
for the paper's thousand blocks is a few kilobytes; nothing reads it.

Preemption uses the engine's ``"auto"`` rule unchanged. It ranks recompute
against swap by the model's parameter count, and the stand-in has one
parameter, so a single sequence is always recomputed and a group (parallel
samples, beams) swapped while the host pool has room: vLLM's own default
policy. The clock charges each choice as the paper's hardware would: the
recomputed tokens as prefill, the swapped blocks over PCIe.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from paged.bench.reservation import ReservingEngine
from paged.models.config import ModelConfig
from paged.models.loader import LoadedModel
from paged.step02_block_table import KVCache
from paged.step03_attention.sampler import SampleResult, num_top_logprobs

VOCAB = 32000  # token ids drawn by the stand-in: 3 .. VOCAB - 1 (clear of BOS 1 and EOS 2)
_MASK = 2**64 - 1


def mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): the replay's deterministic random source."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = (x ^ (v & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
        x ^= x >> 31
    return x


def token_for(seed: int, position: int, salt: int = 0) -> int:
    return 3 + mix(seed, position, salt) % (VOCAB - 3)


def logprob_for(*key: int) -> float:
    """A log-probability in (-6, 0]: log of a uniform number in (e^-6, 1] from the hash of ``key``."""
    u = (mix(*key) >> 11) / 2**53  # [0, 1)
    return -6.0 * u


def stand_in_model(max_len: int = 2048, eos: int = 2) -> LoadedModel:
    """A ``LoadedModel`` the engine accepts: 1 layer, 1 KV head of dimension 1, float16, no tokenizer."""
    config = ModelConfig(architecture="llama", model_type="llama", vocab_size=VOCAB, hidden_size=1, num_layers=1,
                         num_heads=1, num_kv_heads=1, head_dim=1, intermediate_size=1,
                         max_position_embeddings=max_len, eos_token_ids=(eos,))
    module = torch.nn.Linear(1, 1, bias=False).to(torch.float16)
    return LoadedModel(module, config, None, [eos], Path("stand-in"))


class ReplayRunner:
    """A ``ModelRunner`` stand-in: results from a hash, time from a cost model (module docstring)."""

    swap_cache = None  # the host KVCache the engine hands every runner; the replay moves no data
    cost = None  # a replay_cost.CostModel, set by ReplayEngine; None: the clock stands still

    def __init__(self, model, kv_cache, backend, batch_invariant: bool = False) -> None:
        self.kv_cache, self.backend = kv_cache, backend
        self.elapsed = 0.0  # seconds of the modelled hardware, all iterations so far
        self.iterations = 0

    def execute(self, plan) -> dict[int, SampleResult]:
        if self.cost is not None:
            self.elapsed += self.cost.plan_time(plan)
        self.iterations += 1
        out = {}
        rows = [(s, plan.seeds[i], plan.context_lens[i], plan.sampling_params[i])
                for i, s in enumerate(plan.seq_ids) if plan.sample[i]]
        fanout = getattr(plan, "fanout", [])
        if fanout:
            by_seq = {r[0]: r for r in rows}
            rows += [(child, seed, by_seq[parent][2], by_seq[parent][3]) for parent, child, seed in fanout]
        for seq_id, seed, position, params in rows:
            out[seq_id] = self._draw(seq_id, seed, position, params)
        return out

    @staticmethod
    def _draw(seq_id: int, seed: int, position: int, params) -> SampleResult:
        k = num_top_logprobs(params)
        if params.use_beam_search:  # distinct proposals, best first: the beams' search tree
            tops, lp, x = {}, 0.0, mix(seed, seq_id, position)
            for _ in range(k):  # a linear congruential stream from the hash: cheap, deterministic
                x = (x * 6364136223846793005 + 1442695040888963407) & _MASK
                lp += math.log1p(-0.999 * (x >> 32) / 2**32)  # exponential gaps between ranks
                tok = 3 + ((x >> 8) & 0xFFFFFF) % (VOCAB - 3)
                while tok in tops:
                    tok = 3 + (tok - 2) % (VOCAB - 3)
                tops[tok] = lp
            best = next(iter(tops))
            return SampleResult(best, tops[best], tops)
        token = token_for(seed, position)
        if k is None:
            return SampleResult(token)
        lp = logprob_for(seed, position, 1)
        tops = {token_for(seed, position, 2 + j): logprob_for(seed, position, 2 + j) for j in range(k)} if k else None
        return SampleResult(token, lp, tops)


class ReplayEngine(ReservingEngine):
    """The throughput bench's engine with ``ReplayRunner``; ``cost`` sets the runner's clock.

    Args:
        cost: a ``replay_cost.CostModel``, or None (a clock that stands still: tests of scheduling).
        swap_blocks: host blocks for swapped-out sequences (the engine's ``swap_space`` counts
            bytes, and a stand-in block is a few bytes).
        **kwargs: as ``ReservingEngine`` (``memory=``, ``block_size``, ``num_blocks``, ...).
    """

    runner_class = ReplayRunner

    def __init__(self, model, *, cost=None, swap_blocks: int = 0, **kwargs) -> None:
        if "swap_space" in kwargs:
            raise TypeError("ReplayEngine takes swap_blocks (host blocks), not swap_space (bytes)")
        c = model.config
        per_block = KVCache.bytes_per_block(c.num_layers, kwargs.get("block_size", 16), c.num_kv_heads,
                                            c.head_dim, next(model.model.parameters()).dtype)
        kwargs.setdefault("attention_backend", "reference")  # nothing runs attention: build no kernel
        super().__init__(model, swap_space=swap_blocks * per_block, **kwargs)
        self.runner.cost = cost

    @property
    def elapsed(self) -> float:
        """Seconds of modelled hardware time so far."""
        return self.runner.elapsed
