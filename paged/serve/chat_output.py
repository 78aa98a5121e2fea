"""A chat reply's text split into reasoning, content and tool calls, as it streams and when it is whole.

The engine returns text; what a chat client expects is a message: the
``reasoning_content`` a thinking model wrote inside ``<think>...</think>``
(``reasoning.py``), the ``content``, and the ``tool_calls`` the model made
(``tools.py``: forced by the tool choice, or found by a ``--tool-call-parser``
in ``tool_parsers.py``). ``ChatParser`` chains them: the reasoning parser
reads the text first, the tool parser reads what it leaves as content.

Each parser is incremental — ``feed`` a text delta, get a ``DeltaMessage`` of
what can be sent now; ``finish`` once, for what was held back — and a whole
reply is parsed by feeding it in one piece (``ChatParser.whole``). So a stream
and the same reply unstreamed are split by the same code, and the stream's
pieces concatenate to the whole reply's fields.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def tool_call_id() -> str:
    """A new call id, in OpenAI's shape (``call_`` and 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCallDelta:
    """A piece of one tool call: its first piece has ``id`` and ``name``, later ones more ``arguments`` text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class DeltaMessage:
    """What one step adds to a reply: reasoning text, content text, tool-call pieces (any may be empty)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __add__(self, other: DeltaMessage) -> DeltaMessage:
        return DeltaMessage(self.reasoning + other.reasoning, self.content + other.content,
                            self.tool_calls + other.tool_calls)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


@dataclass
class Message:
    """A whole reply: ``reasoning`` (None without a reasoning parser's find), ``content`` (None when empty
    and tools were called), ``tool_calls`` as ``(id, name, arguments text)``."""

    reasoning: str | None
    content: str | None
    tool_calls: list[tuple[str, str, str]]


def gather(delta: DeltaMessage) -> list[tuple[str, str, str]]:
    """The tool-call pieces of ``delta`` joined per index into ``(id, name, arguments)``."""
    calls: dict[int, list] = {}
    for piece in delta.tool_calls:
        call = calls.setdefault(piece.index, [None, None, ""])
        call[0], call[1] = call[0] or piece.id, call[1] or piece.name
        call[2] += piece.arguments
    return [tuple(calls[i]) for i in sorted(calls)]


def held_prefix(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag`` (held back until known)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ChatParser:
    """One choice's reply through an optional reasoning parser, then an optional tool parser.

    Args:
        reasoning: a ``reasoning.ThinkParser`` (or None).
        tools: a tool parser of ``tools.py`` / ``tool_parsers.py`` (or None).
        include_reasoning: False drops the reasoning (the request's ``include_reasoning``).
    """

    def __init__(self, reasoning=None, tools=None, include_reasoning: bool = True) -> None:
        self.reasoning, self.tools, self.include_reasoning = reasoning, tools, include_reasoning
        self.called = False  # a tool call was found: the finish reason becomes "tool_calls"

    def _through_tools(self, delta: DeltaMessage, text: str, final: bool) -> DeltaMessage:
        if self.tools is None:
            out = DeltaMessage(delta.reasoning, text)
        else:
            out = self.tools.feed(text) if text else DeltaMessage()
            if final:
                out = out + self.tools.finish()
            out = DeltaMessage(delta.reasoning, out.content, out.tool_calls)
        self.called = self.called or bool(out.tool_calls)
        if not self.include_reasoning:
            out.reasoning = ""
        return out

    def feed(self, text: str) -> DeltaMessage:
        delta = self.reasoning.feed(text) if self.reasoning else DeltaMessage(content=text)
        return self._through_tools(delta, delta.content, final=False)

    def finish(self) -> DeltaMessage:
        delta = self.reasoning.finish() if self.reasoning else DeltaMessage()
        return self._through_tools(delta, delta.content, final=True)

    def finish_reason(self, reason: str | None) -> str | None:
        """``tool_calls`` for a reply that ended on its own after calling tools (OpenAI's), else ``reason``."""
        forced_name = getattr(self.tools, "forced_name", None)
        return "tool_calls" if reason == "stop" and self.called and forced_name is None else reason

    def whole(self, text: str) -> Message:
        """The whole reply ``text`` parsed at once (the same parsers a stream goes through)."""
        delta = self.feed(text) + self.finish()
        calls = gather(delta)
        return Message(delta.reasoning or None, delta.content if (delta.content or not calls) else None, calls)
