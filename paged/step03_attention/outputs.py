"""What ``LLM.generate`` and ``Engine.step`` return (vLLM's output shape).

The engine's logprobs are ``Logprob`` s (a float with its rank among the model's
tokens); ``LLM`` fills in what vLLM's offline API adds on top: each one's text,
``RequestOutput.metrics`` (when the request arrived, was first scheduled, got
its first and last tokens), and ``LLM.beam_search``'s ``BeamSearchOutput``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.sampling.result import Logprob


@dataclass
class CompletionOutput:
    """One generated sequence of a request.

    Attributes:
        index: which of the request's ``n`` completions this is.
        text: the detokenized output (stop strings removed); "" without a tokenizer.
        token_ids: the generated token ids (an EOS or stop token id is kept).
        cumulative_logprob: sum of the sampled tokens' log-probabilities, if computed.
        logprobs: per generated token, ``{token_id: Logprob}`` of the top tokens
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
    logprobs: list[dict[int, Logprob]] | None = None
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
    # with SamplingParams.prompt_logprobs: None for the first prompt token, then {token id: Logprob}
    # of the most likely tokens and the prompt's own at each position
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # what ended the request when its own processing failed (its grammar met a limit: a RequestError
    # naming the field; a logits processor raised: that exception); None otherwise
    error: BaseException | None = None
    metrics: RequestMetrics | None = None  # filled by LLM.generate (the engine reports no times)


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
