"""``SampleResult`` (what one sequence drew) and ``num_top_logprobs`` (how many scores a row needs).

Apart from the sampler, which needs torch, because the scheduler's side reads them
with no tensor: the request records a ``SampleResult``, and the stand-in runner
(step03 ``stand_in.py``) makes them from a hash.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged.sampling.sampling_params import SamplingParams


@dataclass
class SampleResult:
    """What one sequence drew this iteration."""

    token_id: int
    logprob: float | None = None  # of token_id under the model's distribution
    top_logprobs: dict[int, float] | None = None  # the k most likely tokens
    # per prompt token: None for the first, then {token: logprob} of the k most likely and the prompt's own
    prompt_logprobs: list[dict[int, float] | None] | None = None
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
