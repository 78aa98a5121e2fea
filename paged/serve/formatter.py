"""Engine outputs -> the response models of ``schemas.py``: choices, whole responses, stream chunks, logprobs.

``Formatter`` knows one request: the endpoint (``"completion"`` or ``"chat"``),
the response id, the model name and the tokenizer used to spell token ids. Its
methods are pure (no I/O): the caller serializes what they return, as JSON
(``generation.py``) or as server-sent events (``streaming.py``).
"""

from __future__ import annotations

import time

from paged.serve.schemas import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                                 ChatCompletionResponse, ChatLogprobs, CompletionChoice, CompletionChunk,
                                 CompletionChunkChoice, CompletionLogprobs, CompletionResponse, Delta,
                                 FunctionCallDelta, FunctionCallOut, OpeningDelta, PromptLogprob, PromptTokensDetails,
                                 TokenLogprob,
                                 ToolCallDelta, ToolCallOut, TopLogprob, Usage)


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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> Usage:
    """A request's counts; ``cached_tokens`` (prompt tokens the prefix cache held) when known."""
    details = PromptTokensDetails(cached_tokens=cached_tokens) if cached_tokens is not None else None
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details)


def delta_of(text: str | None, parsed=None) -> Delta:
    """A chat chunk's delta: the text as content, or a ``chat_output.DeltaMessage``'s reasoning, content and
    tool-call pieces."""
    if parsed is None:
        return Delta(content=text)
    calls = [ToolCallDelta(index=c.index, id=c.id, type="function" if c.id else None,
                           function=FunctionCallDelta(name=c.name, arguments=c.arguments)) for c in parsed.tool_calls]
    content = parsed.content if parsed.content or not (parsed.reasoning or calls) else None
    return Delta(content=content, reasoning_content=parsed.reasoning or None, tool_calls=calls or None)


class Formatter:
    """Builds the response models and stream chunks of one request.

    Args:
        kind: ``"completion"`` or ``"chat"``.
        response_id: ``cmpl-...`` or ``chatcmpl-...``.
        model: the served model name.
        tokenizer: spells token ids for logprobs (None: ids are shown as ``"token_id:<id>"``).
        num_logprobs: top alternatives per position (None: no logprobs).
        tokens_as_ids: spell every token ``"token_id:<id>"`` (vLLM's ``return_tokens_as_token_ids``).
        num_prompt_logprobs: vLLM's ``prompt_logprobs``: the most likely tokens listed at each prompt position
            (None: the response has no ``prompt_logprobs``).
        token_ids: vLLM's ``return_token_ids``: the prompt's and each choice's token ids go with the text.
    """

    def __init__(self, kind: str, response_id: str, model: str, tokenizer, num_logprobs: int | None,
                 tokens_as_ids: bool | None = False, num_prompt_logprobs: int | None = None,
                 token_ids: bool | None = False) -> None:
        self.kind = kind
        self.num_prompt_logprobs = num_prompt_logprobs
        self.token_ids = bool(token_ids)
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

    def prompt_logprobs(self, token_ids: list[int], entries: list[dict | None]) -> list[dict | None]:
        """vLLM's ``prompt_logprobs`` of a prompt: per token, null for the first, then ``{token id:
        PromptLogprob}``: the ``num_prompt_logprobs`` most likely tokens, ranked 1.., and the prompt's own
        token with its rank among all the model's tokens (the engine's ``Logprob.rank``)."""
        top = self.num_prompt_logprobs
        return [None if entry is None else {
            str(t): PromptLogprob(logprob=lp, rank=lp.rank, decoded_token=self.token_text(t))
            for t, lp in _ranked(entry, tok, top)} for tok, entry in zip(token_ids, entries)]

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
    def choice(self, index: int, text: str, completion, echoed=None, message=None,
               finish_reason: str | None = None, prompt_logprobs=None,
               prompt_token_ids: list[int] | None = None) -> CompletionChoice | ChatChoice:
        """One finished choice of a non-streamed response; ``echoed``: ``(prompt token ids, prompt
        logprobs)`` whose logprobs come first (``echo`` with ``logprobs``); ``message``: the reply parsed
        into reasoning, content and tool calls (``chat_output.Message``), else ``text`` is the content;
        ``finish_reason``: the parser's (``tool_calls``), else the engine's; ``prompt_logprobs`` and
        ``prompt_token_ids`` (with ``return_token_ids``): vLLM's, a completions choice's."""
        token_ids = list(completion.token_ids) if self.token_ids else None
        if echoed is not None and completion.logprobs is not None:
            lp = self.logprobs(echoed[0] + completion.token_ids, echoed[1] + completion.logprobs)
        else:
            lp = self.logprobs(completion.token_ids, completion.logprobs)
        if self.kind == "chat":
            reply = AssistantMessage(content=text) if message is None else AssistantMessage(
                content=message.content, reasoning_content=message.reasoning,
                tool_calls=[ToolCallOut(id=i, function=FunctionCallOut(name=n, arguments=a))
                            for i, n, a in message.tool_calls] or None)
            return ChatChoice(index=index, message=reply, logprobs=lp,
                              finish_reason=finish_reason or completion.finish_reason,
                              stop_reason=completion.stop_reason, token_ids=token_ids)
        return CompletionChoice(index=index, text=text, logprobs=lp, finish_reason=completion.finish_reason,
                                stop_reason=completion.stop_reason, prompt_logprobs=prompt_logprobs,
                                prompt_token_ids=prompt_token_ids if self.token_ids else None, token_ids=token_ids)

    def response(self, choices: list, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
                 prompt_logprobs=None, prompt_token_ids: list[int] | None = None
                 ) -> CompletionResponse | ChatCompletionResponse:
        """A whole response; ``prompt_logprobs``, ``prompt_token_ids`` (with ``return_token_ids``): vLLM's, of a
        chat request's prompt (a completions choice carries its own)."""
        counts = usage(prompt_tokens, completion_tokens, cached_tokens)
        if self.kind == "chat":
            return ChatCompletionResponse(**self._head(), choices=choices, usage=counts, prompt_logprobs=prompt_logprobs,
                                          prompt_token_ids=prompt_token_ids if self.token_ids else None)
        return CompletionResponse(**self._head(), choices=choices, usage=counts)

    # -- stream chunks ------------------------------------------------------------------
    def chunk(self, index: int, text: str | None, logprobs=None, finish_reason: str | None = None,
              role: bool = False, counts: tuple[int, int] | None = None, parsed=None,
              token_ids: list[int] | None = None, prompt_token_ids: list[int] | None = None
              ) -> CompletionChunk | ChatCompletionChunk:
        """One stream chunk for choice ``index`` (``role``: the chat stream's opening chunk; ``counts``:
        ``(prompt, completion)`` tokens so far, sent as ``usage`` for vLLM's ``continuous_usage_stats``;
        ``parsed``: the text split by a ``ChatParser``, sent instead of ``text``; with ``return_token_ids``,
        ``token_ids`` the tokens it adds and ``prompt_token_ids`` in the first chunk)."""
        if not self.token_ids:
            token_ids = prompt_token_ids = None
        counts = usage(*counts) if counts is not None else None
        if self.kind == "chat":
            delta = OpeningDelta(content="") if role else delta_of(text, parsed)
            choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason,
                                     token_ids=token_ids)
            return ChatCompletionChunk(**self._head(), choices=[choice], usage=counts, prompt_token_ids=prompt_token_ids)
        choice = CompletionChunkChoice(index=index, text=text or "", logprobs=logprobs, finish_reason=finish_reason,
                                       prompt_token_ids=prompt_token_ids, token_ids=token_ids)
        return CompletionChunk(**self._head(), choices=[choice], usage=counts)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int,
                    cached_tokens: int | None = None) -> CompletionChunk | ChatCompletionChunk:
        """The stream's last chunk when ``include_usage`` was asked for: no choices, the request's counts."""
        model = ChatCompletionChunk if self.kind == "chat" else CompletionChunk
        return model(**self._head(), choices=[], usage=usage(prompt_tokens, completion_tokens, cached_tokens))
