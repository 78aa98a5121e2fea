"""What ``LLM.generate`` and ``Engine.step`` return (vLLM's output shape)."""

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
