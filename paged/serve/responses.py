"""The JSON the server answers with: OpenAI's completion / chat objects, chunks and logprobs.

Pure functions of engine outputs; no I/O. ``Formatter`` knows the endpoint
(``"completion"`` or ``"chat"``), the response id, the model name and the
tokenizer used to spell token ids.
"""

from __future__ import annotations

import json
import time

# engine finish reasons OpenAI clients know; the rest (kv_cache_exhausted of step03/04 engines) pass as is
FINISH_REASONS = {"stop": "stop", "length": "length"}


def sse(obj) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


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


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class Formatter:
    """Builds responses and chunks for one request.

    Args:
        kind: ``"completion"`` or ``"chat"``.
        response_id: ``cmpl-...`` or ``chatcmpl-...``.
        model: the served model name.
        tokenizer: spells token ids for logprobs (None: ids are shown as ``"token_id:<id>"``).
        num_logprobs: top alternatives per position (None: no logprobs).
    """

    def __init__(self, kind: str, response_id: str, model: str, tokenizer, num_logprobs: int | None) -> None:
        self.kind = kind
        self.id = response_id
        self.model = model
        self.tokenizer = tokenizer
        self.num_logprobs = num_logprobs
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def token_text(self, token_id: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    # -- logprobs ------------------------------------------------------------------
    def logprobs(self, token_ids: list[int], entries: list[dict] | None, text_offset: int = 0):
        """Logprobs of ``token_ids`` in the endpoint's format, or None when not requested."""
        if self.num_logprobs is None or entries is None:
            return None
        if self.kind == "chat":
            content = []
            for tok, entry in zip(token_ids, entries):
                top = sorted(entry.items(), key=lambda kv: -kv[1])[: self.num_logprobs]
                content.append({**self._chat_token(tok, entry[tok]),
                                "top_logprobs": [self._chat_token(t, lp) for t, lp in top]})
            return {"content": content}
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for tok, entry in zip(token_ids, entries):
            text = self.token_text(tok)
            out["tokens"].append(text)
            out["token_logprobs"].append(entry[tok])
            top = sorted(entry.items(), key=lambda kv: -kv[1])[: self.num_logprobs]
            out["top_logprobs"].append({self.token_text(t): lp for t, lp in top})
            out["text_offset"].append(text_offset)
            text_offset += len(text)
        return out

    def _chat_token(self, token_id: int, logprob: float) -> dict:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": token_bytes(self.tokenizer, token_id, text)}

    # -- whole responses -------------------------------------------------------------
    def choice(self, index: int, text: str, completion) -> dict:
        """One finished choice of a non-streamed response."""
        lp = self.logprobs(completion.token_ids, completion.logprobs)
        finish = FINISH_REASONS.get(completion.finish_reason, completion.finish_reason)
        if self.kind == "chat":
            return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                    "finish_reason": finish, "stop_reason": completion.stop_reason}
        return {"index": index, "text": text, "logprobs": lp, "finish_reason": finish,
                "stop_reason": completion.stop_reason}

    def response(self, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": usage(prompt_tokens, completion_tokens)}

    # -- stream chunks ------------------------------------------------------------------
    def chunk(self, index: int, text: str | None, logprobs=None, finish_reason: str | None = None,
              role: bool = False) -> str:
        """One SSE chunk for choice ``index`` (``role``: the chat stream's opening chunk)."""
        finish = FINISH_REASONS.get(finish_reason, finish_reason)
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return sse({**self._head("chat.completion.chunk"), "choices": [choice]})
        choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return sse({**self._head("text_completion"), "choices": [choice]})

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": usage(prompt_tokens, completion_tokens)})

    def error_chunk(self, message: str) -> str:
        return sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})
