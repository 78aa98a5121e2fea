"""Streaming text out of a growing list of token ids, one delta per engine step.

Two rules make a stream safe to concatenate:

1. **Never split a character.** A byte-level BPE token may hold only part of a
   UTF-8 character (``€`` is three bytes, possibly three tokens); decoding such
   a prefix yields U+FFFD. ``IncrementalDetokenizer`` decodes a small window of
   recent tokens and holds output back while the window's text ends in U+FFFD,
   so every delta is whole characters and the deltas concatenate to the full
   decode.
2. **Never send a stop string.** The engine cuts a completion just before the
   first stop string; a stop string can span several tokens, so while streaming
   ``StopHoldback`` keeps the last ``len(longest stop) - 1`` characters unsent:
   any text that could still be the start of a stop string waits until it is
   either completed (and cut) or ruled out.

At the end ``finish(final_text)`` sends whatever of the engine's final text is
still unsent, so the concatenated stream equals the non-streamed text exactly.
"""

from __future__ import annotations

import logging

from paged.step03_attention.request import REPLACEMENT  # what decoding yields for an unfinished character

logger = logging.getLogger("paged.serve")


class IncrementalDetokenizer:
    """Text deltas for a growing token list, decoding only a window of recent tokens.

    The window is ``ids[prefix:]``: ``prefix..read`` are tokens already turned
    into text (kept as context, so tokenizers whose decoding depends on the
    neighbour — word-level spacing, byte fragments — stay right), ``read..`` are
    new. Cost per step is the window, not the whole output.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (anything with ``decode(ids, skip_special_tokens=)``).
        skip_special_tokens: as the engine's final text (True there).
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.prefix = 0  # start of the context window
        self.read = 0  # tokens before this are already in the text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip) if ids else ""

    def feed(self, token_ids: list[int]) -> str:
        """Given every output token so far, return the text they add (possibly ``""``)."""
        if len(token_ids) <= self.read:
            return ""
        before = self._decode(token_ids[self.prefix:self.read])
        window = self._decode(token_ids[self.prefix:])
        if window.endswith(REPLACEMENT) or len(window) <= len(before):
            return ""  # a character is still incomplete (or nothing printable yet): wait
        self.prefix, self.read = self.read, len(token_ids)
        return window[len(before):]


class StopHoldback:
    """Holds back the tail of a streamed text that could still begin a stop string.

    Args:
        stop: the request's stop strings (may be empty: nothing is held).
    """

    def __init__(self, stop: list[str] | None) -> None:
        self.hold = max((len(s) for s in stop or ()), default=1) - 1
        self.text = ""  # everything decoded so far
        self.sent = 0  # characters of ``text`` already sent

    def push(self, delta: str) -> str:
        """Add decoded text; return the part that can be sent now."""
        self.text += delta
        safe = len(self.text) - self.hold
        if safe <= self.sent:
            return ""
        out = self.text[self.sent:safe]
        self.sent = safe
        return out

    def finish(self, final_text: str) -> str:
        """The engine's final text (stop string cut): return the unsent rest of it."""
        sent = self.text[:self.sent]
        if not final_text.startswith(sent):
            # cannot happen with the rules above; say so rather than send a wrong stream
            logger.warning("streamed text %r is not a prefix of the final text %r", sent[-40:], final_text[-40:])
        self.text, rest = final_text, final_text[self.sent:]
        self.sent = len(final_text)
        return rest


class TextStream:
    """One completion's stream: detokenize, hold back for stop strings, flush at the end.

    Call ``feed`` on every step of a running sequence and, on the step that
    finishes it, ``finish`` *instead*: the new tokens may run past a stop
    string, and only the engine's cut text may be sent.
    """

    def __init__(self, tokenizer, stop: list[str] | None) -> None:
        self.detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.holdback = StopHoldback(stop)

    def feed(self, token_ids: list[int]) -> str:
        return self.holdback.push(self.detok.feed(token_ids)) if self.detok else ""

    def finish(self, final_text: str) -> str:
        return self.holdback.finish(final_text)
