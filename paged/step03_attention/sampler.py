"""Sampling, vectorised over the batch (docs/architecture.md, StepPlan).

One call turns the logits of every sequence that samples this iteration into
one token each. Greedy rows take the argmax; the other rows apply temperature,
top-k and top-p together as tensor operations, and then draw from their own
``torch.Generator``. Each request owns its generator (seeded from
``SamplingParams.seed``), so what a request samples never depends on which
other requests share the batch: the draw for a row uses only that row's
generator, in the same order, whatever the batch.

Drawing: for probabilities ``p`` and independent uniforms ``u``, the index of
``max(p / -log(u))`` is distributed as a categorical draw from ``p`` (the
exponential race). It needs one vector of uniforms per row and no
data-dependent loop.

Log-probabilities, when asked, are those of the model's distribution
(``log_softmax`` of the raw logits), as vLLM returns them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged.step03_attention.sampling_params import SamplingParams


@dataclass
class SampleResult:
    """What one sequence drew this iteration."""

    token_id: int
    logprob: float | None = None  # of token_id under the model's distribution
    top_logprobs: dict[int, float] | None = None  # the k most likely tokens


def num_top_logprobs(p: SamplingParams) -> int | None:
    """How many top log-probabilities a row needs, or None for none at all.

    Beam search needs the 2k best extensions of each beam; best-of-n ranking
    needs the sampled token's log-probability (0 top entries).
    """
    if p.use_beam_search:
        return max(2 * p.best_of, p.logprobs or 0)
    if p.logprobs is not None:
        return p.logprobs
    return 0 if p.best_of > p.n else None


# --8<-- [start:filter]
def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k and top-p on rows of [S, V] logits -> probabilities [S, V]."""
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=dev)
    logits = logits / temps.unsqueeze(1)
    vocab = logits.shape[1]
    top_k = [p.top_k if p.top_k > 0 else vocab for p in params]
    top_p = [p.top_p for p in params]
    if min(top_k) < vocab or min(top_p) < 1.0:
        sorted_logits, order = logits.sort(dim=1, descending=True)  # [S, V]
        rank = torch.arange(vocab, device=dev).unsqueeze(0)  # [1, V]
        drop = rank >= torch.tensor(top_k, device=dev).unsqueeze(1)
        # top-p measures mass within the top k, renormalised (vLLM's and HF's order)
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=1)
        before = probs.cumsum(dim=1) - probs  # mass strictly before each token
        drop |= before >= torch.tensor(top_p, dtype=probs.dtype, device=dev).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    return logits.softmax(dim=1)
# --8<-- [end:filter]


def sample(
    logits: torch.Tensor,  # [S, V]
    params: list[SamplingParams],
    generators: list[torch.Generator],
) -> list[SampleResult]:
    """One token per row. ``generators[i]`` is row i's own generator (CPU)."""
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    tokens = logits.argmax(dim=1)  # greedy rows keep this
    # --8<-- [start:draw]
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        probs = _filtered_probs(logits[rows], [params[i] for i in sampled])  # [S', V]
        u = torch.stack([torch.rand(logits.shape[1], generator=generators[i], dtype=torch.float64)
                         for i in sampled]).to(probs.device)  # [S', V]
        race = probs.double() / (-torch.log(u.clamp_min(1e-300)))
        tokens[rows] = race.argmax(dim=1)
    # --8<-- [end:draw]
    token_list = tokens.tolist()
    want = [i for i, p in enumerate(params) if num_top_logprobs(p) is not None]
    results = [SampleResult(t) for t in token_list]
    if want:
        rows = torch.tensor(want, device=logits.device)
        logp = logits[rows].log_softmax(dim=1)  # [S', V]
        chosen = logp.gather(1, tokens[rows].unsqueeze(1)).squeeze(1).tolist()
        k = max(num_top_logprobs(params[i]) for i in want)
        top_v, top_i = logp.topk(k, dim=1) if k > 0 else (None, None)
        for j, i in enumerate(want):
            results[i].logprob = chosen[j]
            n = num_top_logprobs(params[i])
            results[i].top_logprobs = (
                dict(zip(top_i[j, :n].tolist(), top_v[j, :n].tolist())) if n else {}
            )
    return results
