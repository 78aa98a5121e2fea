"""A stand-in for the model: what a ``ModelRunner`` returns for a plan, drawn from a hash, in no time.

The scheduler decides, the runner obeys (docs/architecture.md); to test or
replay the deciding half no model is needed. ``StandInRunner.execute(plan)``
returns seq id -> ``SampleResult`` for every sequence the plan samples, as a
``ModelRunner`` does, without any tensor:

* the token a sequence draws is a hash of its sampling seed and position
  (so the same request draws the same tokens whatever the batch, as the real
  engine's per-request generators do);
* when the request needs scores (beam search, best-of ranking, logprobs), a
  log-probability from the same hash, ranked as a model's would be; beam search gets its ``2 x width``
  proposals, distinct tokens with decreasing log-probabilities drawn from a
  hash of (seed, sequence, position), so beams fork and die as in a real search;
* a prompt that forks its parallel samples in this plan (``plan.fanout``,
  step04) gives each child its own draw.

Tokens are ``3 .. VOCAB - 1``: clear of BOS 1 and EOS 2, so a request ends by
its ``max_tokens`` unless the stand-in is told an ``eos`` to draw sometimes.
"""

from __future__ import annotations

import math

from paged.sampling.result import Logprob, SampleResult, num_top_logprobs

VOCAB = 32000  # token ids drawn by the stand-in: 3 .. VOCAB - 1 (clear of BOS 1 and EOS 2)
_MASK = 2**64 - 1


def mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): the stand-in's deterministic random source."""
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


class StandInRunner:
    """A ``ModelRunner`` stand-in: results from a hash (module docstring).

    Args:
        eos: a token id drawn instead, with probability ``eos_rate``, so that requests also stop early.
        eos_rate: in [0, 1]; 0 (default): never.
    """

    serving = None  # a ModelRunner's ServingTraits: no model here was made ready to serve

    def __init__(self, eos: int | None = None, eos_rate: float = 0.0) -> None:
        self.eos, self.eos_rate = eos, eos_rate
        self.iterations = 0

    def execute(self, plan) -> dict[int, SampleResult]:
        self.iterations += 1
        rows = [(s, plan.seeds[i], plan.context_lens[i], plan.sampling_params[i])
                for i, s in enumerate(plan.seq_ids) if plan.sample[i]]
        if plan.fanout:
            by_seq = {r[0]: r for r in rows}
            rows += [(child, seed, by_seq[parent][2], by_seq[parent][3]) for parent, child, seed in plan.fanout]
        return {seq_id: self.draw(seq_id, seed, position, params) for seq_id, seed, position, params in rows}

    def draw(self, seq_id: int, seed: int, position: int, params) -> SampleResult:
        k = num_top_logprobs(params)
        if params.use_beam_search:  # distinct proposals, best first: the beams' search tree
            tops, lp, x = {}, 0.0, mix(seed, seq_id, position)
            for _ in range(k):  # a linear congruential stream from the hash: cheap, deterministic
                x = (x * 6364136223846793005 + 1442695040888963407) & _MASK
                lp += math.log1p(-0.999 * (x >> 32) / 2**32)  # exponential gaps between ranks
                tok = 3 + ((x >> 8) & 0xFFFFFF) % (VOCAB - 3)
                while tok in tops:
                    tok = 3 + (tok - 2) % (VOCAB - 3)
                tops[tok] = Logprob(lp, len(tops) + 1)
            best = next(iter(tops))
            return SampleResult(best, tops[best], tops)
        token = token_for(seed, position)
        if self.eos is not None and (mix(seed, position, 7) >> 11) / 2**53 < self.eos_rate:
            token = self.eos
        if k is None:
            return SampleResult(token)
        made = {token_for(seed, position, 2 + j): logprob_for(seed, position, 2 + j) for j in range(k)}
        tops = {t: Logprob(made[t], i + 1) for i, t in enumerate(sorted(made, key=made.get, reverse=True))}
        # ranked as a model's would be: the top ones 1.., the drawn one, when not among them, next, and no likelier
        lp = tops[token] if token in tops else Logprob(min([logprob_for(seed, position, 1), *made.values()]), k + 1)
        return SampleResult(token, lp, tops if k else None)
