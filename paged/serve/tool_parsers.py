"""``--tool-call-parser``: finding the tool calls a model wrote on its own (``tool_choice: "auto"``).

A model trained to call tools writes each call in its own format; the parser
named by ``--tool-call-parser`` reads that format out of the reply. One
format, by vLLM's name:

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one
  block per call, what the Hermes, Qwen 2.5 and Qwen 3 chat templates teach.

Text outside the blocks is the message's ``content``; whitespace right before
a call, between calls and after the last one is dropped (a stream cannot know
whether trailing whitespace precedes a call, so it is held until the next text
says). A block whose JSON does not parse, or has no string
``name``, or names a function the request does not allow (``allowed_tools``),
is not a call: its text is returned as content, as written. A call
is sent once its block has closed (or the reply ended inside it), in one
piece: id, name and the whole arguments text. While streaming, a tail that
could be the start of ``<tool_call>`` is held back until the next text decides.
"""

from __future__ import annotations

import json

from paged.serve.chat_output import DeltaMessage, ToolCallDelta, held_prefix, tool_call_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser:
    """The calls and the content of one reply in the Hermes format, fed as text deltas; ``allowed``: the
    functions a call may name (None: any)."""

    def __init__(self, allowed: frozenset[str] | None = None) -> None:
        self.allowed = allowed
        self.pending = ""  # text not yet decided on
        self.in_call = False
        self.calls = 0
        self.spaces = ""  # trailing whitespace of the content: dropped if a call follows, sent if text does

    def _content(self, text: str) -> str:
        """The part of ``text`` that can be sent as content now (its trailing whitespace is held)."""
        text = self.spaces + text
        body = text.rstrip()
        self.spaces = text[len(body):]
        return body

    def _call(self, body: str) -> DeltaMessage:
        """A closed block: a call if its JSON names one, else its text as content."""
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            value = None
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)) or \
                (self.allowed is not None and value["name"] not in self.allowed):
            return DeltaMessage(content=self._content(OPEN + body + (CLOSE if not self.in_call else "")))
        arguments = value.get("arguments", value.get("parameters", {}))
        self.spaces = ""
        piece = ToolCallDelta(self.calls, tool_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))
        self.calls += 1
        return DeltaMessage(tool_calls=[piece])

    def feed(self, text: str) -> DeltaMessage:
        self.pending += text
        out = DeltaMessage()
        while True:
            if self.in_call:
                end = self.pending.find(CLOSE)
                if end < 0:
                    return out
                body, self.pending = self.pending[:end], self.pending[end + len(CLOSE):]
                self.in_call = False
                out = out + self._call(body)
                continue
            start = self.pending.find(OPEN)
            if start < 0:
                keep = held_prefix(self.pending, OPEN)
                sent, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
                out.content += self._content(sent)
                return out
            out.content += self._content(self.pending[:start])
            self.pending, self.in_call = self.pending[start + len(OPEN):], True  # its spaces go if it is a call

    def finish(self) -> DeltaMessage:
        rest, self.pending = self.pending, ""
        if self.in_call:  # the reply ended inside a block (max_tokens): a call only if its JSON is whole
            out = self._call(rest)
            self.in_call = False
            return out
        out = DeltaMessage(content=self._content(rest))
        if self.spaces and not self.calls:
            out.content, self.spaces = out.content + self.spaces, ""
        return out


PARSERS = {"hermes": HermesParser}
