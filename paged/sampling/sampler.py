"""Sampling, vectorised over the batch (docs/architecture.md, StepPlan).

One call turns the logits of every sequence that samples this iteration into
one token each. Rows that carry a ``SamplingContext`` first go through the
penalties, biases, bans and grammar masks of ``logits_processors.py``; a batch
without any skips that entirely. Greedy rows take the argmax; the other rows
apply temperature, min-p, top-k and top-p together as tensor operations, and
then draw from their own ``torch.Generator``. Each request owns its generator (seeded from
``SamplingParams.seed``), so what a request samples never depends on which
other requests share the batch: the draw for a row uses only that row's
generator, in the same order, whatever the batch.

Drawing: for probabilities ``p`` and independent uniforms ``u``, the index of
``max(p / -log(u))`` is distributed as a categorical draw from ``p`` (the
exponential race). It needs one vector of uniforms per row and no
data-dependent loop.

Log-probabilities, when asked, are those of the model's distribution
(``log_softmax`` of the raw logits, before any penalty or mask), each with its
rank among all the model's tokens, as vLLM returns them; ``prompt_logprobs``
gives the same for the prompt's tokens.
"""

from __future__ import annotations

import torch

from paged.sampling.logits_processors import SamplingContext, process_logits
from paged.sampling.result import Logprob, SampleResult, num_top_logprobs
from paged.sampling.sampling_params import SamplingParams


# --8<-- [start:filter]
def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, min-p, top-k and top-p on rows of [S, V] logits -> probabilities [S, V]."""
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=dev)
    logits = logits / temps.unsqueeze(1)
    min_p = [p.min_p for p in params]
    if max(min_p) > 0:  # keep tokens at least min_p times as likely as the most likely one
        probs = logits.softmax(dim=1)
        floor = torch.tensor(min_p, dtype=probs.dtype, device=dev).unsqueeze(1) * probs.amax(dim=1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
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


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits in float32 (softmax and sorting need the range); others unchanged."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def sample(
    logits: torch.Tensor,  # [S, V]
    params: list[SamplingParams],
    generators: list[torch.Generator],
    contexts: list[SamplingContext | None] | None = None,
) -> list[SampleResult]:
    """One token per row. ``generators[i]`` is row i's own generator (CPU); ``contexts[i]`` its
    history and grammar when its params process logits (None: no row does)."""
    raw = _upcast(logits)
    errors: dict[int, BaseException] = {}
    logits = raw
    if contexts and any(p.logits_processors for p in params):
        logits, errors = apply_logits_processors(raw, params, contexts)
    logits = process_logits(logits, params, contexts) if contexts else logits
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
        rows = torch.tensor(want, device=raw.device)
        chosen, tops = logprobs_of(raw[rows], tokens[rows], [num_top_logprobs(params[i]) for i in want])
        for j, i in enumerate(want):
            results[i].logprob, results[i].top_logprobs = chosen[j], tops[j]
    for i, err in errors.items():
        results[i].error = err
    return results


def apply_logits_processors(logits: torch.Tensor, params: list[SamplingParams],
                            contexts: list[SamplingContext | None]) -> tuple[torch.Tensor, dict]:
    """Each row's ``SamplingParams.logits_processors``, in order, on a copy of its row ``[V]``.

    Runs before any generator draws, so a processor that raises (or returns
    something that is not a finite-or-masked ``[V]`` tensor) touches nothing
    but its own row: that row keeps its logits and its error is returned
    (``{row: exception}``), the other rows are sampled as if it were not there.
    """
    out, errors = logits.clone(), {}
    for i, p in enumerate(params):
        if not p.logits_processors or contexts[i] is None:
            continue
        row = out[i].clone()
        try:
            for fn in p.logits_processors:
                row = fn(list(contexts[i].output_token_ids), row)
                if not isinstance(row, torch.Tensor) or row.shape != out[i].shape:
                    raise TypeError(f"logits processor {fn!r} returned {type(row).__name__} "
                                    f"{getattr(row, 'shape', '')}, not a tensor of shape {tuple(out[i].shape)}")
            out[i] = row
        except Exception as e:
            errors[i] = e
    return out, errors


def logprobs_of(logits: torch.Tensor, token_ids: torch.Tensor, ks: list[int]) -> tuple[list, list]:
    """Per row of ``logits`` [R, V]: the ``Logprob`` of ``token_ids[r]`` and ``{token: Logprob}`` of its
    ``ks[r]`` most likely tokens (under ``log_softmax(logits)``), each with its rank among all ``V``.

    The top tokens are ranked 1 to k in ``topk``'s order. The chosen token, when it is not among them,
    is ranked as vLLM ranks it: by how many tokens are at least as likely, itself included (so
    past k, even beside a tie)."""
    logp = logits.log_softmax(dim=1)
    chosen_v = logp.gather(1, token_ids.unsqueeze(1))  # [R, 1]
    ranks = (logp >= chosen_v).sum(dim=1).tolist()
    k = max(ks)
    top_v, top_i = logp.topk(k, dim=1) if k > 0 else (None, None)
    tops = [{t: Logprob(v, i + 1) for i, (t, v) in enumerate(zip(top_i[r, :n].tolist(), top_v[r, :n].tolist()))}
            if n else {} for r, n in enumerate(ks)]
    chosen = [top[t] if t in top else Logprob(v, rank) for t, v, rank, top in
              zip(token_ids.tolist(), chosen_v.squeeze(1).tolist(), ranks, tops)]
    return chosen, tops


def prompt_logprob_entries(logits: torch.Tensor, next_token_ids: list[int], k: int) -> list[dict[int, Logprob]]:
    """Prompt logprobs of one chunk: row ``r`` of ``logits`` predicts ``next_token_ids[r]``;
    each entry holds the ``k`` most likely tokens and the prompt's own."""
    targets = torch.tensor(next_token_ids, device=logits.device)
    chosen, tops = logprobs_of(_upcast(logits), targets, [k] * len(next_token_ids))
    return [{**top, tok: lp} for tok, lp, top in zip(next_token_ids, chosen, tops)]
