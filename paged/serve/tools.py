"""Tool calling: what a request's ``tool_choice`` asks of the output, and how calls are read back out of it.

``tool_choice`` takes four values (OpenAI's), each answered its own way:

* ``"none"``: the model writes text; ``tools`` still reach the chat template.
* ``"auto"`` (the default when ``tools`` are given): the model decides. The
  server must have been started with ``--enable-auto-tool-choice
  --tool-call-parser NAME``; the template receives ``tools``, and the parser
  (``tool_parsers.py``) finds the calls in what the model writes.
* ``"required"``: at least one call, for any model. The output is forced by
  structured output (llguidance) to a JSON array of calls,
  ``[{"name": ..., "parameters": {...}}]``, each call's parameters valid for its
  tool's schema (one call only with ``parallel_tool_calls: false``);
  ``CallListParser`` reads it back.
* a named function: exactly that call; the output is forced to the tool's
  arguments schema, and all of it is the call's ``arguments`` (``NamedCallParser``).

``{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`` narrows what
may be called, not what the model is told: every tool still reaches the
template, so the prompt (and the prefix cache's blocks of it) stays the same
while the allowed set changes from turn to turn. ``required`` forces the calls'
array over the allowed functions only; ``auto`` hands the allowed names to the
parser, which keeps a call to any other tool as text, as it keeps a block that
is no call.

Either way the client sees ``tool_calls`` with the arguments as JSON text, in
the message or streamed as ``tool_calls`` deltas (the first piece of a call
carries its id and name, the next ones more arguments text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from paged.serve.chat_output import DeltaMessage, ToolCallDelta, tool_call_id
from paged.serve.chat_protocol import AllowedToolsChoice
from paged.serve.errors import APIError

NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass
class ToolPlan:
    """What one request's tools ask: ``mode`` (``none``, ``auto``, ``required``, ``named``), the tools as the
    template receives them, the forced function's name, whether several calls may be made, and the functions
    that may be called (``allowed``; None: every tool)."""

    mode: str
    tools: list[dict] | None
    name: str | None = None
    parallel: bool = True
    allowed: frozenset[str] | None = None

    def schema(self, functions: dict[str, dict]) -> dict | None:
        """The JSON schema forced on the output (``required`` / ``named``), else None."""
        if self.mode == "named":
            return functions[self.name]
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, params in functions.items() if self.allowed is None or name in self.allowed]
        return {"type": "array", "minItems": 1, **({} if self.parallel else {"maxItems": 1}),
                "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}


def plan_tools(req, auto_parser: str | None) -> tuple[ToolPlan, dict[str, dict]]:
    """The ``ToolPlan`` of a chat request and each tool's arguments schema, or a 400 naming the field.

    Args:
        req: the ``ChatCompletionRequest``.
        auto_parser: the server's ``--tool-call-parser`` when ``--enable-auto-tool-choice`` is on, else None.
    """
    tools = req.tools or []
    functions = {t.function.name: t.function.parameters or NO_ARGUMENTS for t in tools}
    if len(functions) < len(tools):
        raise APIError("tools: two tools share a name; each function needs its own", param="tools",
                       code="invalid_value")
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    as_given = [t.model_dump(exclude_none=True) for t in tools] or None
    parallel = req.parallel_tool_calls is not False
    if choice == "none":
        return ToolPlan("none", as_given), functions
    if not tools:
        raise APIError(f"tool_choice {choice if isinstance(choice, str) else 'naming a function'} needs tools",
                       param="tool_choice", code="invalid_value")
    allowed = None
    if isinstance(choice, AllowedToolsChoice):
        allowed = frozenset(t.function.name for t in choice.allowed_tools.tools)
        unknown = sorted(allowed - functions.keys())
        if unknown:
            raise APIError(f"tool_choice: allowed_tools names {unknown[0]!r:.80}, which is not among tools "
                           f"({sorted(functions)[:8]})", param="tool_choice", code="invalid_value")
        choice = choice.allowed_tools.mode
    if choice == "auto":
        if auto_parser is None:
            raise APIError('tool_choice "auto" (the default when tools are given) needs the server started with '
                           '--enable-auto-tool-choice and --tool-call-parser; "required", a named function and '
                           '"none" work on any server', param="tool_choice", code="invalid_value")
        return ToolPlan("auto", as_given, parallel=parallel, allowed=allowed), functions
    if choice == "required":
        return ToolPlan("required", as_given, parallel=parallel, allowed=allowed), functions
    name = choice.function.name
    if name not in functions:
        raise APIError(f"tool_choice names {name!r:.80}, which is not among tools ({sorted(functions)[:8]})",
                       param="tool_choice", code="invalid_value")
    return ToolPlan("named", as_given, name=name, parallel=False), functions


class NamedCallParser:
    """The output is the named function's arguments, whole: one call, streamed as it is written."""

    def __init__(self, name: str) -> None:
        self.forced_name = name
        self.started = False

    def feed(self, text: str) -> DeltaMessage:
        piece = ToolCallDelta(0, arguments=text)
        if not self.started:
            self.started, piece.id, piece.name = True, tool_call_id(), self.forced_name
        return DeltaMessage(tool_calls=[piece])

    def finish(self) -> DeltaMessage:
        return DeltaMessage() if self.started else self.feed("")


class CallListParser:
    """Reads ``[{"name": "f", "parameters": {...}}, ...]`` (what ``required`` forces) as it is written.

    A small scanner over the JSON text: it follows strings and nesting, notes each call's name when its
    string closes, and where its ``parameters`` value starts and ends; each piece of that value's text
    is sent as soon as it is written, so the arguments stream token by token. The text is valid by
    construction (the grammar), except where ``max_tokens`` cut it.
    """

    def __init__(self) -> None:
        self.text = ""
        self.pos = 0
        self.depth = 0  # 1: in the array, 2: in a call object, more: inside a value
        self.in_string = self.escaped = False
        self.string_start = 0
        self.key: str | None = None
        self.expect_key = False
        self.calls: list[dict] = []  # name, start, end (of the parameters' text), sent (chars of it sent)

    def _scan(self) -> None:
        text = self.text
        for i in range(self.pos, len(text)):
            c = text[i]
            call = self.calls[-1] if self.calls else None
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 2 and self.expect_key:
                        self.key, self.expect_key = json.loads(text[self.string_start:i + 1]), False
                    elif self.depth == 2 and self.key == "name" and call is not None and call["name"] is None:
                        call["name"] = json.loads(text[self.string_start:i + 1])
                    elif self.depth == 2 and self.key == "parameters" and call["end"] is None:
                        call["end"] = i + 1
                continue
            if c.isspace():
                continue
            if self.depth == 2 and self.key == "parameters" and call["start"] is None and c not in ":,}":
                call["start"] = i  # the parameters' value begins (an object, almost always)
            if c == '"':
                self.in_string, self.string_start = True, i
            elif c in "[{":
                self.depth += 1
                if self.depth == 2:
                    self.calls.append({"name": None, "start": None, "end": None, "sent": 0})
                    self.key, self.expect_key = None, True
            elif c in "]}":
                if self.depth == 2 and call is not None and call["start"] is not None and call["end"] is None:
                    call["end"] = i  # a scalar value ended by the object's close
                self.depth -= 1
                if self.depth == 2 and self.key == "parameters" and call["end"] is None:
                    call["end"] = i + 1
            elif c == "," and self.depth == 2:
                if call["start"] is not None and call["end"] is None:
                    call["end"] = i
                self.expect_key = True
        self.pos = len(text)

    def _pieces(self) -> DeltaMessage:
        out = DeltaMessage()
        for index, call in enumerate(self.calls):
            if call["name"] is None:
                continue
            piece = ToolCallDelta(index)
            if "id" not in call:
                call["id"] = piece.id = tool_call_id()
                piece.name = call["name"]
            if call["start"] is not None:
                stop = call["end"] if call["end"] is not None else len(self.text)
                piece.arguments = self.text[call["start"] + call["sent"]:stop]
                call["sent"] = stop - call["start"]
            if piece.id or piece.arguments:
                out.tool_calls.append(piece)
        return out

    def feed(self, text: str) -> DeltaMessage:
        self.text += text
        self._scan()
        return self._pieces()

    def finish(self) -> DeltaMessage:
        return self._pieces()
