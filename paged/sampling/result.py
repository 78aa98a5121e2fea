"""``SampleResult`` (what one sequence drew), ``Logprob`` (a score with its rank) and ``num_top_logprobs``
(how many scores a row needs).

Apart from the sampler, which needs torch, because the scheduler's side reads them
with no tensor: the request records a ``SampleResult``, and the stand-in runner
(step03 ``stand_in.py``) makes them from a hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged.sampling.sampling_params import SamplingParams


class Logprob(float):
    """A token's log-probability as vLLM gives it: the value (this float itself, so arithmetic and
    comparisons work as on any float), ``.logprob``, its ``.rank`` among all the model's tokens
    (1 = the most likely) and its ``.decoded_token`` (the text; ``LLM`` fills it in, the engine does not)."""

    rank: int | None
    decoded_token: str | None

    def __new__(cls, logprob: float, rank: int | None = None, decoded_token: str | None = None):
        self = super().__new__(cls, logprob)
        self.rank, self.decoded_token = rank, decoded_token
        return self

    @property
    def logprob(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"


@dataclass
class SampleResult:
    """What one sequence drew this iteration."""

    token_id: int
    logprob: Logprob | None = None  # of token_id under the model's distribution, with its rank
    top_logprobs: dict[int, Logprob] | None = None  # the k most likely tokens, ranked 1 to k
    # per prompt token: None for the first, then {token: Logprob} of the k most likely and the prompt's own
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    error: BaseException | None = None  # this row's own processing failed: token_id means nothing


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
