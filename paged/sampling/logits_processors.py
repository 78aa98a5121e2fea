"""Logit processing before the draw: penalties, biases, bans and grammar masks, vectorised over rows.

These options need more than a row's logits: the tokens the sequence has
generated (and its prompt, for the repetition penalty), or its grammar's
state. The engine, which owns that history, puts a ``SamplingContext`` into
the plan for every sequence whose ``SamplingParams.processes_logits``; rows
without one are not touched, and a batch without any takes the sampler's
plain path.

The order is vLLM's, all on the raw logits ``l`` of the rows concerned:

1. ``logit_bias``: ``l[t] += bias[t]``.
2. ``repetition_penalty`` ``r`` (Keskar et al. 2019), for every token ``t``
   of the prompt or the output: ``l[t] / r`` if ``l[t] > 0`` else ``l[t] * r``.
3. ``frequency_penalty`` ``f`` and ``presence_penalty`` ``p`` (OpenAI), with
   ``c[t]`` the times ``t`` was generated: ``l[t] -= f * c[t] + p * (c[t] > 0)``.
4. Banned tokens (``min_tokens``' stop tokens, ``bad_words``): ``-inf``.
5. The grammar mask (``structured.py``): every token it does not allow, ``-inf``.
   Should 4 have banned every token the grammar allows, the grammar wins: that
   row keeps the grammar's tokens with their step-1 to step-3 logits, so the
   output still parses.

Temperature, ``min_p``, top-k and top-p follow in ``sampler.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paged.sampling.sampling_params import SamplingParams


# --8<-- [start:context]
@dataclass
class SamplingContext:
    """What one sequence's row needs beyond its logits and params: plain data, carried by the plan.

    Attributes:
        prompt_token_ids: the prompt (for ``repetition_penalty`` and prompt
            logprobs; empty when neither is asked).
        output_token_ids: the tokens generated so far.
        banned_token_ids: tokens that must not come next (``min_tokens`` not
            yet reached: the stop tokens; ``bad_words``: each word's last token
            when the output ends with the rest of it).
        allowed_bitmask: the grammar's allowed tokens (``GrammarMatcher.bitmask``), or None.
        prompt_logprobs: this iteration's prompt tokens return their log-probabilities.
    """

    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    banned_token_ids: list[int] = field(default_factory=list)
    allowed_bitmask: bytes | None = None
    prompt_logprobs: bool = False
# --8<-- [end:context]


def process_logits(logits: torch.Tensor, params: list[SamplingParams],
                   contexts: list[SamplingContext | None]) -> torch.Tensor:
    """Steps 1-5 on the rows that have a context; returns new logits ``[S, V]`` (the input is kept)."""
    rows = [i for i, c in enumerate(contexts) if c is not None]
    if not rows:
        return logits
    out = logits.clone()
    _add_logit_bias(out, [(i, params[i].logit_bias) for i in rows if params[i].logit_bias])
    _penalise(out, [(i, params[i], contexts[i]) for i in rows if _has_penalty(params[i])])
    grammar_rows = [i for i in rows if contexts[i].allowed_bitmask is not None]
    if not grammar_rows:
        _ban(out, [(i, contexts[i].banned_token_ids) for i in rows if contexts[i].banned_token_ids])
        return out
    idx = torch.tensor(grammar_rows, device=out.device)
    allowed = unpack_bitmask([contexts[i].allowed_bitmask for i in grammar_rows], out.shape[1]).to(out.device)
    masked = out[idx].masked_fill(~allowed, float("-inf"))  # step 5 (before 4: both only add -inf)
    out[idx] = masked
    _ban(out, [(i, contexts[i].banned_token_ids) for i in rows if contexts[i].banned_token_ids])
    dead = ~torch.isfinite(out[idx]).any(dim=1)  # the bans took every token the grammar allows
    if dead.any():
        out[idx[dead]] = masked[dead]
    return out


def _has_penalty(p: SamplingParams) -> bool:
    return bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0)


def _add_logit_bias(logits: torch.Tensor, biases: list[tuple[int, dict[int, float]]]) -> None:
    """``logits[i, t] += b`` for every ``{t: b}`` of every row ``i`` (one indexed add)."""
    if not biases:
        return
    rows = [i for i, bias in biases for _ in bias]
    toks = [t for _, bias in biases for t in bias]
    vals = [float(b) for _, bias in biases for b in bias.values()]
    dev = logits.device
    logits.index_put_((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                      torch.tensor(vals, dtype=logits.dtype, device=dev), accumulate=True)


def token_counts(token_lists: list[list[int]], vocab: int, device) -> torch.Tensor:
    """``[R, V]`` counts: entry ``[r, t]`` is how often ``t`` occurs in ``token_lists[r]``."""
    width = max((len(t) for t in token_lists), default=0)
    padded = torch.full((len(token_lists), width), vocab, dtype=torch.int64)  # pad: a column past the vocab
    for r, tokens in enumerate(token_lists):
        padded[r, :len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
    counts = torch.zeros(len(token_lists), vocab + 1, dtype=torch.int32)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.int32))
    return counts[:, :vocab].to(device)


# --8<-- [start:penalties]
def _penalise(logits: torch.Tensor, rows: list[tuple[int, SamplingParams, SamplingContext]]) -> None:
    """Repetition, then frequency and presence penalties, on the rows given (module docstring, 2-3)."""
    if not rows:
        return
    dev, vocab = logits.device, logits.shape[1]
    idx = torch.tensor([i for i, _, _ in rows], device=dev)
    column = lambda values: torch.tensor(values, dtype=logits.dtype, device=dev).unsqueeze(1)  # noqa: E731
    generated = token_counts([c.output_token_ids for _, _, c in rows], vocab, dev)  # [R, V]
    in_prompt = token_counts([c.prompt_token_ids for _, _, c in rows], vocab, dev) > 0
    seen = in_prompt | (generated > 0)
    x = logits[idx]
    r = column([p.repetition_penalty for _, p, _ in rows])
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    x = x - column([p.frequency_penalty for _, p, _ in rows]) * generated
    x = x - column([p.presence_penalty for _, p, _ in rows]) * (generated > 0)
    logits[idx] = x
# --8<-- [end:penalties]


def _ban(logits: torch.Tensor, bans: list[tuple[int, list[int]]]) -> None:
    if not bans:
        return
    rows = [i for i, toks in bans for _ in toks]
    toks = [t for _, ts in bans for t in ts]
    logits[torch.tensor(rows, device=logits.device), torch.tensor(toks, device=logits.device)] = float("-inf")


def unpack_bitmask(masks: list[bytes], vocab: int) -> torch.Tensor:
    """Bitmasks (bit ``t % 32`` of int32 word ``t // 32`` allows token ``t``) -> bool ``[R, V]``."""
    words = torch.frombuffer(bytearray(b"".join(masks)), dtype=torch.int32).view(len(masks), -1)
    bits = (words.unsqueeze(2) >> torch.arange(32, dtype=torch.int32)) & 1  # [R, W, 32]
    return bits.view(len(masks), -1)[:, :vocab].bool()


