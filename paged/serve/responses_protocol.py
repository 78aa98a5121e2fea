"""The ``POST /v1/responses`` request body (OpenAI's Responses API), and its conversation as chat messages.

A Responses request carries its conversation as ``input`` (a string, or a list
of items: messages with text parts, the model's earlier ``function_call`` s and
the ``function_call_output`` s answering them, earlier ``reasoning``),
``instructions`` (a system message that is not carried to the next response),
the functions the model may call (``tools``, flat: ``{"type": "function",
"name", "parameters"}``), ``text.format`` (plain, a JSON object, or a JSON
schema) and ``max_output_tokens``. ``ResponsesRequest.chat_body`` turns it into
the body of a chat request, so the same code renders, constrains, generates
and parses it (``responses.py``). Tools of other types (web search, a shell,
custom tools) are not served: they are dropped, and logged once.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Field, StrictBool, StrictFloat, StrictInt, StrictStr, Tag, TypeAdapter, model_validator

from paged.serve.chat_protocol import MAX_TOOLS, TOOL_NAME
from paged.serve.errors import APIError
from paged.serve.extensions import BUILT_HERE, Items, OpenAIModel, RequestModel, by_type, note_ignored
from paged.serve.protocol import MAX_LOGPROBS, bounds


class TextPart(OpenAIModel):
    """A text part of a message: ``input_text`` (the user's), ``output_text`` (an earlier reply's)."""

    type: Literal["input_text", "output_text", "text"]
    text: StrictStr


class MessageItem(OpenAIModel):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | Items[TextPart]
    id: StrictStr | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(OpenAIModel):
    """A call the model made in an earlier response."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None


class FunctionCallOutputItem(OpenAIModel):
    """The answer to a call, by its ``call_id``."""

    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr | Items[TextPart]
    id: StrictStr | None = None

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningTextPart(OpenAIModel):
    type: Literal["reasoning_text", "summary_text"]
    text: StrictStr


class ReasoningItem(OpenAIModel):
    """An earlier response's reasoning: it goes with the assistant message that follows it."""

    type: Literal["reasoning"]
    id: StrictStr | None = None
    summary: Items[ReasoningTextPart] = []
    content: Items[ReasoningTextPart] | None = None


class ItemReference(OpenAIModel):
    """An item of a response this server keeps (one it was given or one it gave), by its id: the server puts
    the item itself in its place (``ResponseStore.item``)."""

    type: Literal["item_reference"]
    id: StrictStr


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem  # what a reference stands for
AS_INPUT = TypeAdapter(InputItem)
MAX_REFERENCED_CHARS = 4 * 2**20  # what one request's references may bring in: as much as a body may carry


class FunctionTool(OpenAIModel):
    type: Literal["function"]
    name: StrictStr = Field(pattern=TOOL_NAME)
    description: StrictStr | None = None
    parameters: dict | None = None
    strict: StrictBool | None = None


NOT_FUNCTION = {"not": {"const": "function"}}  # in the document: a function's object is never "another type"


class OtherTool(OpenAIModel):
    """A tool of another type (``web_search``, ``custom``, ``local_shell``...): not served, dropped."""

    note_extras: ClassVar[bool] = False  # dropped whole: its type is logged, not each of its fields
    type: StrictStr = Field(json_schema_extra=NOT_FUNCTION)


class FunctionChoice(OpenAIModel):
    type: Literal["function"]
    name: StrictStr


class AllowedTool(OpenAIModel):
    """One tool an ``allowed_tools`` choice allows: a function by its name, or a tool of another type (not
    served: dropped)."""

    type: StrictStr
    name: StrictStr | None = None


class AllowedChoice(OpenAIModel):
    """``allowed_tools``: only these of ``tools`` may be called (every tool still reaches the template)."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: Items[AllowedTool] = Field(min_length=1, max_length=MAX_TOOLS)


class OtherChoice(OpenAIModel):
    """A choice of another type (a hosted tool's): not served, the default is used."""

    note_extras: ClassVar[bool] = False
    type: StrictStr = Field(json_schema_extra={"not": {"enum": ["function", "allowed_tools"]}})


PARTS = 'a list of {"type": "input_text", "text": ...} parts'
# what a field of several types takes, for the error message (in this request's shapes, not chat's)
EXPECTED = {
    "input": 'a string or a list of items (each {"type": "message", "role", "content"}, "function_call", '
             '"function_call_output", "reasoning" or "item_reference")',
    "content": f"a string or {PARTS}",
    "output": f"a string or {PARTS}",
    "tool_choice": '"none", "auto", "required", {"type": "function", "name": ...} or {"type": "allowed_tools", '
                   '"mode", "tools"}',
}


Tool = Annotated[Annotated[FunctionTool, Tag("FunctionTool")] | Annotated[OtherTool, Tag("OtherTool")],
                 by_type("a tool object", OtherTool, function=FunctionTool)]
ToolChoice = Annotated[Annotated[Literal["none", "auto", "required"], Tag("str")]
                       | Annotated[FunctionChoice, Tag("FunctionChoice")]
                       | Annotated[AllowedChoice, Tag("AllowedChoice")] | Annotated[OtherChoice, Tag("OtherChoice")],
                       by_type(EXPECTED["tool_choice"], OtherChoice, function=FunctionChoice,
                               allowed_tools=AllowedChoice)]


class TextFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    json_schema: dict | None = Field(None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None

    model_config = {"populate_by_name": True}


class TextConfig(OpenAIModel):
    format: TextFormat | None = None
    verbosity: Any = None


LOGPROBS = "message.output_text.logprobs"  # the include value served
MAX_METADATA, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's bounds on metadata


class ResponsesRequest(RequestModel):
    """``POST /v1/responses``: OpenAI's fields this server reads; any other is accepted and logged once."""

    model: StrictStr | None = None
    input: StrictStr | Items[InputItem | ItemReference] = Field(description="a user message, or the "
                                                                  "conversation's items")
    instructions: StrictStr | None = None
    previous_response_id: StrictStr | None = Field(None, description="continue a response this server gave "
                                                   "(and still keeps: the newest --response-store ones)")
    max_output_tokens: StrictInt | None = Field(None, **bounds(minimum=1))
    # the chat request's bound, which SamplingParams enforces (OpenAI's own API stops at 2; vLLM sets none)
    temperature: StrictFloat | None = Field(None, **bounds(minimum=0, maximum=100))
    top_p: StrictFloat | None = Field(None, **bounds(exclusive_minimum=0, maximum=1))
    tools: Items[Tool] | None = Field(None, **bounds(max_items=MAX_TOOLS))
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    stream: StrictBool = False
    store: StrictBool = True
    background: StrictBool = Field(False, description="answer at once (queued) and run with no connection held: "
                                   "poll, stream again or cancel it by its id (needs store)")
    seed: StrictInt | None = Field(None, description="vLLM's: this request's own generator")
    priority: StrictInt = Field(0, description="vLLM's: the smaller goes first (--scheduling-policy priority)")
    cache_salt: StrictStr | None = Field(None, description="vLLM's: the prefix cache is shared only within a salt")
    top_logprobs: StrictInt | None = Field(None, description="alternatives per token, with include "
                                           '["message.output_text.logprobs"]', **bounds(minimum=0,
                                                                                        maximum=MAX_LOGPROBS))
    include: Items[StrictStr] | None = Field(None, description='"message.output_text.logprobs": each token\'s '
                                             "logprob with the message's text; other values are accepted, logged")
    metadata: dict | None = Field(None, description="up to 16 string pairs, echoed on the response",
                                  **bounds(max_properties=MAX_METADATA, property_names={"maxLength": MAX_METADATA_KEY},
                                           additional_properties={"type": "string", "maxLength": MAX_METADATA_VALUE}))
    reasoning: Any = None
    user: Any = None
    truncation: Literal["auto", "disabled"] | None = Field(None, description="auto: past the context, the oldest "
                                                         "turns are dropped until the prompt fits")

    @model_validator(mode="after")
    def _own_bounds(self):
        """The bounds of the fields no chat field checks (``top_logprobs`` without ``include``, ``metadata``)."""
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise APIError(f"top_logprobs: must be in [0, {MAX_LOGPROBS}] (got {self.top_logprobs})",
                           param="top_logprobs", code="invalid_value")
        metadata = self.metadata or {}
        if len(metadata) > MAX_METADATA:
            raise APIError(f"metadata: at most {MAX_METADATA} pairs, got {len(metadata)}", param="metadata",
                           code="invalid_value")
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise APIError(f"metadata: the value of {key[:80]!r} is not a string (got {str(value)[:80]})",
                               param="metadata", code="invalid_value")
            if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                raise APIError(f"metadata: key {key[:80]!r} (at most {MAX_METADATA_KEY} characters) or its value (at "
                               f"most {MAX_METADATA_VALUE}) is too long", param="metadata", code="invalid_value")
        return self

    @property
    def logprobs(self) -> bool:
        """Whether each token's logprob goes with the message's text (``include``); other values are logged."""
        for value in set(self.include or ()) - {LOGPROBS}:
            note_ignored(f"include[{value[:60]}]", "only message.output_text.logprobs is served")
        return LOGPROBS in (self.include or ())

    def references(self) -> list[tuple[int, str]]:
        """Each ``item_reference`` of the input: its place and the id it names."""
        return [] if isinstance(self.input, str) else \
            [(n, i.id) for n, i in enumerate(self.input) if isinstance(i, ItemReference)]

    def referenced(self, kept: dict[str, BaseModel]) -> ResponsesRequest:
        """This request with each ``item_reference`` replaced by the item it names (``kept``: id -> the kept
        item, an output or input item: either is a valid input item once dumped), each id converted once; the
        items it brings in weigh at most ``MAX_REFERENCED_CHARS`` (as JSON), else a 400 naming the reference
        past it — a few bytes of references must not become gigabytes of prompt."""
        if not kept:
            return self
        converted: dict[str, tuple[InputItem, int]] = {}
        chars, out = 0, []
        for n, item in enumerate(self.input):
            if isinstance(item, ItemReference):
                if item.id not in converted:
                    found = kept[item.id]
                    converted[item.id] = (AS_INPUT.validate_python(found.model_dump(), context=BUILT_HERE),
                                          len(found.model_dump_json()))
                item, size = converted[item.id]
                chars += size
                if chars > MAX_REFERENCED_CHARS:
                    raise APIError(f"input.{n}.id: the referenced items bring more than {MAX_REFERENCED_CHARS} "
                                   "characters (as JSON) into one request", param=f"input.{n}.id",
                                   code="invalid_value")
            out.append(item)
        return self.model_copy(update={"input": out})

    def function_tools(self) -> list[FunctionTool]:
        tools = [t for t in self.tools or [] if isinstance(t, FunctionTool)]
        for other in {t.type for t in self.tools or [] if not isinstance(t, FunctionTool)}:
            note_ignored(f"tools[type={other[:40]}]", "only function tools are served here; the model is not told "
                         "of the others")
        return tools

    def chat_tool_choice(self):
        """``tool_choice`` in the chat request's shape (another type of choice: the default, logged; an
        ``allowed_tools`` one keeps its functions, and allowing none of them, in ``auto``, is ``none``)."""
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            return {"type": "function", "function": {"name": choice.name}}
        if isinstance(choice, AllowedChoice):
            names = [t.name for t in choice.tools if t.type == "function"]
            for other in {t.type for t in choice.tools if t.type != "function"}:
                note_ignored(f"tool_choice.tools[type={other[:40]}]", "only function tools are served")
            if not names and choice.mode == "auto":
                return "none"
            if not names:
                raise APIError("tool_choice.tools: allowed_tools in required mode allows no function, and only "
                               "function tools are served here", param="tool_choice.tools", code="invalid_value")
            return {"type": "allowed_tools", "allowed_tools": {
                "mode": choice.mode, "tools": [{"type": "function", "function": {"name": n}} for n in names]}}
        if isinstance(choice, OtherChoice):
            note_ignored(f"tool_choice[type={choice.type[:40]}]", "only function choices are served")
            return None
        return choice

    def chat_body(self, history: list[dict]) -> dict:
        """The chat request this one is: ``history`` (the previous response's conversation), ``instructions``
        first, then ``input``; ``stream`` (also for ``background``) with the usage at the end, so the last event
        can report it."""
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + history
        messages += input_messages(self.input)
        streamed = self.stream or self.background  # a background response is made from the stream's chunks
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": streamed}
        if streamed:
            body["stream_options"] = {"include_usage": True}
        tools = self.function_tools()
        if tools:
            body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True,
                                                                           by_alias=True)} for t in tools]
        choice = self.chat_tool_choice()
        if choice is not None and (tools or choice == "none"):
            body["tool_choice"] = choice
        if self.logprobs:
            body["logprobs"], body["top_logprobs"] = True, self.top_logprobs or 0
        for ours, theirs in (("max_output_tokens", "max_completion_tokens"), ("temperature", "temperature"),
                             ("top_p", "top_p"), ("parallel_tool_calls", "parallel_tool_calls"), ("seed", "seed"),
                             ("priority", "priority"), ("cache_salt", "cache_salt")):
            if getattr(self, ours) is not None:
                body[theirs] = getattr(self, ours)
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif fmt is not None and fmt.type == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "output", "schema": fmt.json_schema or {}, "strict": fmt.strict}}
        return body


class InputTokensRequest(ResponsesRequest):
    """``POST /v1/responses/input_tokens``: a Responses request whose prompt is counted, not answered (``input``
    may be left out when ``instructions`` or ``previous_response_id`` give the conversation)."""

    input: StrictStr | Items[InputItem | ItemReference] = Field([], description="a user message, or the "
                                                                 "conversation's items")


def input_messages(items: str | list) -> list[dict]:
    """``input`` as chat messages: a call and the text before it form one assistant message, each call's
    output a ``tool`` message, an earlier reasoning the next assistant message's ``reasoning_content``."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    reasoning = None
    for item in items:
        if isinstance(item, ReasoningItem):
            reasoning = "".join(p.text for p in item.content or item.summary)
            continue
        if isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
            continue
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if last is None:
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": item.role, "content": item.text()})
            last = messages[-1] if item.role == "assistant" else None
        if last is not None and reasoning is not None:
            last["reasoning_content"], reasoning = reasoning, None
    return messages
