"""The JSON the server answers with, as typed models: OpenAI's completion / chat objects, chunks, logprobs.

Every body the server sends is one of the pydantic models below, built and
then serialized, so the OpenAPI document (``GET /openapi.json``, generated
from these same models) describes exactly what clients receive.

``Formatter`` builds them from engine outputs — pure functions, no I/O. It
knows the endpoint (``"completion"`` or ``"chat"``), the response id, the
model name and the tokenizer used to spell token ids.
"""

from __future__ import annotations

import time
from typing import Literal

from fastapi.responses import Response
from pydantic import BaseModel, Field

# "kv_cache_exhausted": step03's engine, which cannot preempt, ends a request that finds no free block
FinishReason = Literal["stop", "length", "kv_cache_exhausted"]


# -- shared pieces ----------------------------------------------------------------
class Usage(BaseModel):
    """Token counts of a request (all prompts, all returned choices)."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


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
class CompletionChoice(BaseModel):
    index: int = Field(ge=0, description="prompt * n + choice, as OpenAI numbers them")
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason
    stop_reason: str | int | None = Field(description="the stop string or stop token id that ended it, if any")


class CompletionResponse(BaseModel):
    """``POST /v1/completions`` without ``stream``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: str | None = Field(None, description="always null: this server never refuses")


class ChatChoice(BaseModel):
    index: int = Field(ge=0)
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason
    stop_reason: str | int | None


class ChatCompletionResponse(BaseModel):
    """``POST /v1/chat/completions`` without ``stream``."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


# -- stream chunks ----------------------------------------------------------------------
class CompletionChunkChoice(BaseModel):
    index: int = Field(ge=0)
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(BaseModel):
    """One event of a streamed completion; the last one carries only ``usage`` when asked for."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class Delta(BaseModel):
    """A chunk's new text; only the first chunk of a choice names the role (``OpeningDelta``)."""

    content: str | None = None


class OpeningDelta(Delta):
    role: Literal["assistant"] = "assistant"


class ChatChunkChoice(BaseModel):
    index: int = Field(ge=0)
    delta: OpeningDelta | Delta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed chat completion (the first one opens with the role)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# -- the other routes -----------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str = Field(description="the checkpoint folder")
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


# Characters that end a line for str.splitlines() (and httpx's line reader) but not for SSE, which
# JSON leaves raw inside strings; escaped, they decode to the same text and keep an event one line.
_SPLITLINES_ONLY = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def sse(event: BaseModel) -> str:
    """One server-sent event carrying ``event`` as JSON, on one line for any line reader."""
    return f"data: {event.model_dump_json().translate(_SPLITLINES_ONLY)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def json_response(body: BaseModel, status_code: int = 200) -> Response:
    """``body`` serialized by pydantic, as an ``application/json`` response."""
    return Response(body.model_dump_json(), status_code=status_code, media_type="application/json")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, inverted: what a byte-level BPE token's symbols mean."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars, extra = {b: b for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return {chr(c): b for b, c in chars.items()}


_BYTE_OF = _byte_level_alphabet()


def token_bytes(tokenizer, token_id: int, text: str) -> list[int]:
    """The token's exact bytes: for a byte-level BPE even a fragment of a UTF-8 character."""
    from tokenizers import decoders

    if tokenizer is not None and isinstance(tokenizer.decoder, decoders.ByteLevel):
        symbols = tokenizer.id_to_token(token_id) or ""
        if symbols and all(ch in _BYTE_OF for ch in symbols):
            return [_BYTE_OF[ch] for ch in symbols]
    return list(text.encode("utf-8"))


def _ranked(entry: dict[int, float], chosen: int, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely of ``entry`` and, when it is not among them, the chosen token (k + 1 then)."""
    ranked = sorted(entry.items(), key=lambda kv: -kv[1])
    top = ranked[:k]
    if all(t != chosen for t, _ in top):
        top.append((chosen, entry[chosen]))
    return top


def usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens)


class Formatter:
    """Builds the response models and stream chunks of one request.

    Args:
        kind: ``"completion"`` or ``"chat"``.
        response_id: ``cmpl-...`` or ``chatcmpl-...``.
        model: the served model name.
        tokenizer: spells token ids for logprobs (None: ids are shown as ``"token_id:<id>"``).
        num_logprobs: top alternatives per position (None: no logprobs).
        tokens_as_ids: spell every token ``"token_id:<id>"`` (vLLM's ``return_tokens_as_token_ids``).
    """

    def __init__(self, kind: str, response_id: str, model: str, tokenizer, num_logprobs: int | None,
                 tokens_as_ids: bool | None = False) -> None:
        self.kind = kind
        self.tokens_as_ids = bool(tokens_as_ids)
        self.id = response_id
        self.model = model
        self.tokenizer = tokenizer
        self.num_logprobs = num_logprobs
        self.created = int(time.time())

    def _head(self) -> dict:
        return {"id": self.id, "created": self.created, "model": self.model}

    def token_text(self, token_id: int) -> str:
        if self.tokenizer is None or self.tokens_as_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    # -- logprobs ------------------------------------------------------------------
    def logprobs(self, token_ids: list[int], entries: list[dict | None] | None,
                 text_offset: int = 0) -> CompletionLogprobs | ChatLogprobs | None:
        """Logprobs of ``token_ids`` in the endpoint's format, or None when not requested.

        An entry may be None (an echoed prompt's first token has no logprob): it shows as null.
        An entry holds the top ``num_logprobs`` tokens and the chosen one, so a position lists up to
        ``num_logprobs + 1`` alternatives, the chosen token among them, as vLLM and OpenAI do."""
        if self.num_logprobs is None or entries is None:
            return None
        if self.kind == "chat":
            content = []
            for tok, entry in zip(token_ids, entries):
                top = _ranked(entry, tok, self.num_logprobs)
                content.append(TokenLogprob(**self._chat_token(tok, entry[tok]).model_dump(),
                                            top_logprobs=[self._chat_token(t, lp) for t, lp in top]))
            return ChatLogprobs(content=content)
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for tok, entry in zip(token_ids, entries):
            text = self.token_text(tok)
            out.tokens.append(text)
            out.token_logprobs.append(entry[tok] if entry is not None else None)
            top = _ranked(entry, tok, self.num_logprobs) if entry is not None else None
            out.top_logprobs.append({self.token_text(t): lp for t, lp in top} if top is not None else None)
            out.text_offset.append(text_offset)
            text_offset += self.text_length(tok)
        return out

    def text_length(self, token_id: int) -> int:
        """The characters ``token_id`` adds to the returned text: none for a special token (a BOS
        shown in ``tokens`` is not part of an echoed prompt), so ``text_offset`` indexes the text."""
        if self.tokenizer is None:
            return 0
        return len(self.tokenizer.decode([token_id], skip_special_tokens=True))

    def _chat_token(self, token_id: int, logprob: float) -> TopLogprob:
        text = self.token_text(token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=token_bytes(self.tokenizer, token_id, text))

    # -- whole responses -------------------------------------------------------------
    def choice(self, index: int, text: str, completion, echoed=None) -> CompletionChoice | ChatChoice:
        """One finished choice of a non-streamed response; ``echoed``: ``(prompt token ids, prompt
        logprobs)`` whose logprobs come first (``echo`` with ``logprobs``)."""
        if echoed is not None and completion.logprobs is not None:
            lp = self.logprobs(echoed[0] + completion.token_ids, echoed[1] + completion.logprobs)
        else:
            lp = self.logprobs(completion.token_ids, completion.logprobs)
        if self.kind == "chat":
            return ChatChoice(index=index, message=AssistantMessage(content=text), logprobs=lp,
                              finish_reason=completion.finish_reason, stop_reason=completion.stop_reason)
        return CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=completion.finish_reason,
                                stop_reason=completion.stop_reason)

    def response(self, choices: list, prompt_tokens: int,
                 completion_tokens: int) -> CompletionResponse | ChatCompletionResponse:
        model = ChatCompletionResponse if self.kind == "chat" else CompletionResponse
        return model(**self._head(), choices=choices, usage=usage(prompt_tokens, completion_tokens))

    # -- stream chunks ------------------------------------------------------------------
    def chunk(self, index: int, text: str | None, logprobs=None, finish_reason: str | None = None,
              role: bool = False, counts: tuple[int, int] | None = None) -> str:
        """One SSE chunk for choice ``index`` (``role``: the chat stream's opening chunk; ``counts``:
        ``(prompt, completion)`` tokens so far, sent as ``usage`` for vLLM's ``continuous_usage_stats``)."""
        counts = usage(*counts) if counts is not None else None
        if self.kind == "chat":
            delta = OpeningDelta(content="") if role else Delta(content=text)
            choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
            return sse(ChatCompletionChunk(**self._head(), choices=[choice], usage=counts))
        choice = CompletionChunkChoice(index=index, text=text or "", logprobs=logprobs, finish_reason=finish_reason)
        return sse(CompletionChunk(**self._head(), choices=[choice], usage=counts))

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        model = ChatCompletionChunk if self.kind == "chat" else CompletionChunk
        return sse(model(**self._head(), choices=[], usage=usage(prompt_tokens, completion_tokens)))

    def error_chunk(self, message: str, type: str = "server_error", param: str | None = None,
                    code: str | None = None) -> str:
        return sse(ErrorResponse(error=ErrorDetail(message=message, type=type, param=param, code=code)))
