"""Beam search as the engine runs it: pick k of the k x |V| extensions (paper §4.4, Figure 9).

Pure bookkeeping over plain numbers; the engine turns its decisions into
forks (a beam chosen more than once) and frees (a beam not chosen at all),
which is where paged memory pays off: candidates share their common history
block by block, as in the paper's Figure 9.

The rules, stated once (the test oracle in ``tests/step04_sharing`` follows
them on a contiguous KV cache):

* Each live beam proposes its ``2k`` most likely next tokens, scored by the
  beam's cumulative log-probability plus the token's.
* Proposals are taken best first (ties: earlier beam, then lower token id).
  An end-of-sequence proposal (EOS or a stop token id) becomes a finished
  hypothesis; the others become the next beams until ``k`` are taken.
* A hypothesis is ranked by ``cumulative_logprob / len(tokens) ** length_penalty``
  (tokens generated, the final EOS included).
* The search ends when ``max_tokens`` is reached (live beams then count as
  finished) or, once ``k`` hypotheses are finished: with ``early_stopping=True``
  at once; with ``False`` when the best live beam, scored at its current length,
  cannot beat the k-th best finished one; with ``"never"`` when it cannot even
  at ``max_tokens`` length (for ``length_penalty > 0``).
* The ``n`` best hypotheses are returned, best first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Hypothesis:
    """A finished candidate."""

    token_ids: list[int]
    cumulative_logprob: float
    ended_by: int | None  # the EOS / stop token id, or None when cut by length
    text: str = ""  # detokenized by the decoding component
    stop_reason: int | None = None  # the stop token id that ended it (an EOS is no stop reason)
    parent: int | None = None  # the live beam it extends (its index in ``select``'s ``beams``)
    logprobs: list[dict[int, float]] | None = None  # per token, when the request asked for them

    def score(self, length_penalty: float) -> float:
        return beam_score(self.cumulative_logprob, len(self.token_ids), length_penalty)


def beam_score(cumulative_logprob: float, length: int, length_penalty: float) -> float:
    return cumulative_logprob / (max(length, 1) ** length_penalty)


# --8<-- [start:select]
def select(
    beams: list[tuple[float, list[int]]],  # per live beam: (cumulative logprob, tokens so far)
    proposals: list[dict[int, float]],  # per live beam: {token: logprob} of its 2k best
    k: int,
    is_end: callable,  # token -> True for EOS / stop tokens
) -> tuple[list[tuple[int, int, float]], list[Hypothesis]]:
    """One step: ``([(parent beam, token, new cumulative logprob)] * <= k, new finished)``."""
    ranked = sorted(
        ((cum + lp, b, tok) for b, (cum, _) in enumerate(beams) for tok, lp in proposals[b].items()),
        key=lambda x: (-x[0], x[1], x[2]),
    )
    chosen, finished = [], []
    for score, b, tok in ranked:
        if len(chosen) == k:
            break
        if is_end(tok):
            finished.append(Hypothesis(beams[b][1] + [tok], score, tok, parent=b))
        else:
            chosen.append((b, tok, score))
    return chosen, finished
# --8<-- [end:select]


def is_done(finished: list[Hypothesis], best_live: float | None, length: int, k: int,
            max_tokens: int, length_penalty: float, early_stopping) -> bool:
    """Whether more steps could still change the k best (see the module rules)."""
    if best_live is None or length >= max_tokens:
        return True
    if len(finished) < k:
        return False
    if early_stopping is True:
        return True
    kth = sorted((h.score(length_penalty) for h in finished), reverse=True)[k - 1]
    at = max_tokens if (early_stopping == "never" and length_penalty > 0) else length
    return kth >= beam_score(best_live, at, length_penalty)


def best(finished: list[Hypothesis], n: int, length_penalty: float) -> list[Hypothesis]:
    """The n best hypotheses, best first (stable for ties)."""
    return sorted(finished, key=lambda h: -h.score(length_penalty))[:n]
