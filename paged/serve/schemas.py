"""What the server answers with, as typed models: OpenAI's completion and chat objects, chunks, logprobs, errors.

Every body the server sends is one of the pydantic models below, built and
then serialized, so the OpenAPI document (``GET /openapi.json``, generated
from these same models) describes exactly what clients receive. The request
side is ``protocol.py``; ``formatter.py`` builds these from engine outputs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# "kv_cache_exhausted": step03's engine, which cannot preempt, ends a request that finds no free block;
# "tool_calls": a chat reply that ended after calling tools
FinishReason = Literal["stop", "length", "tool_calls", "kv_cache_exhausted"]


def omitted_when_none(**kwargs):
    """A field left out of the JSON when None (a vLLM or optional OpenAI field that has nothing to say)."""
    return Field(None, exclude_if=lambda value: value is None, **kwargs)


# -- shared pieces ----------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(ge=0, description="prompt tokens found in the prefix cache (not computed again)")


class Usage(BaseModel):
    """Token counts of a request (all prompts, all returned choices)."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    prompt_tokens_details: PromptTokensDetails | None = omitted_when_none()


class ErrorDetail(BaseModel):
    message: str = Field(description="what was wrong and, for a bound, what the bound is")
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, server_error...")
    param: str | None = Field(description="the request field at fault, e.g. max_tokens or messages.0.role")
    code: str | None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx answer, and the last event of a stream the engine failed under."""

    error: ErrorDetail


# -- logprobs -----------------------------------------------------------------------
class CompletionLogprobs(BaseModel):
    """Per generated token: its text, its logprob, the top alternatives, and where it starts in the text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] = Field(description="the token's exact UTF-8 bytes (a fragment of a character is possible)")


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: list[TokenLogprob] | None = Field(None, description="always null: this server never refuses")


# -- whole responses ------------------------------------------------------------------
class PromptLogprob(BaseModel):
    """A token at a prompt position (vLLM's ``prompt_logprobs``): its logprob, its rank among all the model's
    tokens (1: the most likely; the prompt's own token has its rank too, also when it is not among the most
    likely asked for) and its text."""

    logprob: float
    rank: int = Field(ge=1)
    decoded_token: str


PROMPT_LOGPROBS = dict(description="vLLM's, with prompt_logprobs: per prompt token, null for the first, then "
                       "{token id: {logprob, rank, decoded_token}} for the most likely tokens and the prompt's own")


class CompletionChoice(BaseModel):
    index: int = Field(ge=0, description="prompt * n + choice, as OpenAI numbers them")
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason
    stop_reason: str | int | None = Field(description="the stop string or stop token id that ended it, if any")
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = omitted_when_none(**PROMPT_LOGPROBS)
    prompt_token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: the prompt's token ids")
    token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: this choice's token ids")


class CompletionResponse(BaseModel):
    """``POST /v1/completions`` without ``stream``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class FunctionCallOut(BaseModel):
    name: str
    arguments: str = Field(description="the arguments as JSON text")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = Field(None, description="always null: this server never refuses")
    tool_calls: list[ToolCallOut] | None = omitted_when_none(description="the calls the reply made, if any")
    reasoning_content: str | None = omitted_when_none(description="with a --reasoning-parser: the model's "
                                                      "reasoning (vLLM's field)")


class ChatChoice(BaseModel):
    index: int = Field(ge=0)
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason
    stop_reason: str | int | None
    token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: this choice's token "
                                                    "ids")


class ChatCompletionResponse(BaseModel):
    """``POST /v1/chat/completions`` without ``stream``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = omitted_when_none(**PROMPT_LOGPROBS)
    prompt_token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: the prompt's token ids")


# -- stream chunks ----------------------------------------------------------------------
class CompletionChunkChoice(BaseModel):
    index: int = Field(ge=0)
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    prompt_token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: the "
                                                           "prompt's token ids, in the choice's first chunk")
    token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: the tokens this "
                                                    "chunk adds")


class CompletionChunk(BaseModel):
    """One event of a streamed completion; the last one carries only ``usage`` when asked for."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class FunctionCallDelta(BaseModel):
    name: str | None = omitted_when_none()
    arguments: str = ""


class ToolCallDelta(BaseModel):
    """A piece of a tool call: the first one of each call has its ``id``, ``type`` and ``function.name``."""

    index: int = Field(ge=0)
    id: str | None = omitted_when_none()
    type: Literal["function"] | None = omitted_when_none()
    function: FunctionCallDelta


class Delta(BaseModel):
    """A chunk's new text; only the first chunk of a choice names the role (``OpeningDelta``)."""

    content: str | None = None
    reasoning_content: str | None = omitted_when_none(description="with a --reasoning-parser: more reasoning")
    tool_calls: list[ToolCallDelta] | None = omitted_when_none()


class OpeningDelta(Delta):
    role: Literal["assistant"] = "assistant"


class ChatChunkChoice(BaseModel):
    index: int = Field(ge=0)
    delta: OpeningDelta | Delta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: the tokens this "
                                                    "chunk adds")


class ChatCompletionChunk(BaseModel):
    """One event of a streamed chat completion (the first one opens with the role)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = omitted_when_none(description="vLLM's, with return_token_ids: the "
                                                           "prompt's token ids, in the first chunk")


# -- the other routes -----------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str = Field(description="the model's name, as served (never a path on the server)")
    max_model_len: int = Field(ge=1)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Index(BaseModel):
    name: str
    model: str
    endpoints: list[str]


class Version(BaseModel):
    version: str = Field(description="this server's version (the paged package's)")
