"""What ``LLM.generate`` and ``Engine.step`` return (vLLM's output shape).

``LLM`` fills in what vLLM's offline API adds on top of the engine's outputs:
``Logprob`` objects (the engine's logprob floats, with their rank and text),
``RequestOutput.metrics`` (when the request arrived, was first scheduled, got
its first and last tokens), and ``LLM.beam_search``'s ``BeamSearchOutput``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    Attributes:
        index: which of the request's ``n`` completions this is.
        text: the detokenized output (stop strings removed); "" without a tokenizer.
        token_ids: the generated token ids (an EOS or stop token id is kept).
        cumulative_logprob: sum of the sampled tokens' log-probabilities, if computed.
        logprobs: per generated token, ``{token_id: logprob}`` of the top tokens
            and the sampled one, when ``SamplingParams.logprobs`` is set.
        finish_reason: ``"stop"`` (EOS, stop token or stop string), ``"length"``
            (max_tokens or the model's context), ``"abort"``, ``"error"`` (the
            request's own processing failed: ``RequestOutput.error`` says how), or
            ``"kv_cache_exhausted"`` (step03 only: no block left, no preemption yet).
        stop_reason: the stop string or stop token id that ended it, if any.
    """

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request after an engine step, or its final result."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (step04)
    # with SamplingParams.prompt_logprobs: None for the first prompt token, then {token id: logprob}
    # of the most likely tokens and the prompt's own at each position
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # what ended the request when its own processing failed (its grammar met a limit: a RequestError
    # naming the field; a logits processor raised: that exception); None otherwise
    error: BaseException | None = None
    metrics: RequestMetrics | None = None  # filled by LLM.generate (the engine reports no times)


class Logprob(float):
    """A token's logprob as vLLM's offline API gives it: the value (this float itself, so arithmetic and
    comparisons work as on the engine's floats), ``.logprob``, its ``.rank`` among the model's tokens
    (1 = most likely; None for a drawn token that was not among the top ones asked for) and its
    ``.decoded_token``."""

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
class RequestMetrics:
    """When things happened to one request (``time.time()`` seconds), as vLLM's ``RequestMetrics``."""

    arrival_time: float
    last_token_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    time_in_queue: float | None
    finished_time: float | None = None
    model_forward_time: float | None = None
    model_execute_time: float | None = None


@dataclass
class BeamSearchSequence:
    """One beam of ``LLM.beam_search``: the prompt's and the beam's tokens, their text, the beam's score."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]]
    cum_logprob: float
    text: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class BeamSearchOutput:
    """``LLM.beam_search``'s answer for one prompt: its beams, best first."""

    sequences: list[BeamSearchSequence]
