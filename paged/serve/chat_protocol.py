"""The chat request body: messages (text, tool calls, tool results), tools and the tool choice.

``POST /v1/chat/completions`` takes OpenAI's conversation: ``system`` /
``developer`` / ``user`` / ``assistant`` / ``tool`` messages, an assistant
message possibly holding ``tool_calls`` instead of text, and a ``tool``
message answering one of them by its ``tool_call_id``. ``tools`` declares the
functions the model may call (each a JSON schema of its arguments) and
``tool_choice`` says whether it must (``tools.py`` turns the choice into a
constraint on the output, or a parser of it). As in ``protocol.py``, known
fields are strict and unknown ones are accepted and logged once.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictInt, StrictStr, Tag, model_validator

from paged.serve.errors import APIError
from paged.serve.extensions import ChatExtensions, Items, OpenAIModel, by_type
from paged.serve.protocol import EXPECTED, MAX_LOGPROBS, _Sampling, bounds

MAX_TOOLS = 128  # OpenAI's bound on the functions of one request
TOOL_NAME = r"^[a-zA-Z0-9_.:-]{1,64}$"  # OpenAI's function names (vLLM also lets '.' and ':' through)


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: StrictStr


class FunctionCall(OpenAIModel):
    name: StrictStr
    arguments: StrictStr = Field(description="the arguments as JSON text")


class ToolCall(OpenAIModel):
    """A call the assistant made earlier in the conversation."""

    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIModel):
    """One message of the conversation; an assistant's may hold ``tool_calls`` instead of text."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Items[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: Items[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    reasoning_content: StrictStr | None = Field(None, description="an earlier reply's reasoning (vLLM's field)")

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise APIError(f"a {self.role} message needs content (only an assistant's may hold tool_calls "
                           "instead)", param="messages", code="invalid_value")
        if self.tool_calls and self.role != "assistant":
            raise APIError(f"only an assistant message may hold tool_calls, not a {self.role} message",
                           param="messages", code="invalid_value")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The message as chat templates read it: text content, and each call's arguments as an object
        (transformers' convention: templates write ``arguments | tojson``)."""
        out = {"role": self.role, "content": self.text()}
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": _arguments(c.function.arguments)}} for c in self.tool_calls]
        return out


def _arguments(text: str):
    """A call's arguments as the object they encode (the text itself when it is no JSON object)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


class FunctionDefinition(OpenAIModel):
    name: StrictStr = Field(pattern=TOOL_NAME)
    description: StrictStr | None = None
    parameters: dict | None = Field(None, description="a JSON schema of the arguments (none: no arguments)")
    strict: StrictBool | None = None


class Tool(OpenAIModel):
    """A function the model may call (without a ``type``, a function: vLLM's default)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChosenFunction(OpenAIModel):
    name: StrictStr


class NamedToolChoice(OpenAIModel):
    """``tool_choice`` naming one function: the model calls it, with arguments valid for its schema."""

    type: Literal["function"] = "function"
    function: ChosenFunction


class AllowedTools(OpenAIModel):
    mode: Literal["auto", "required"]
    tools: Items[NamedToolChoice] = Field(min_length=1, max_length=MAX_TOOLS,
                                          description='the functions the model may call: {"type": "function", '
                                          '"function": {"name"}} each')


class AllowedToolsChoice(OpenAIModel):
    """``tool_choice`` allowing a subset of ``tools``: every tool still reaches the template (so the prompt,
    and its cached blocks, stay the same from request to request); only the allowed ones can be called,
    ``auto`` (the model decides) or ``required`` (at least one call)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


# a string, or an object by its type (none given: a function, as vLLM reads it)
ToolChoice = Annotated[Annotated[Literal["none", "auto", "required"], Tag("str")]
                       | Annotated[NamedToolChoice, Tag("NamedToolChoice")]
                       | Annotated[AllowedToolsChoice, Tag("AllowedToolsChoice")],
                       by_type(EXPECTED["tool_choice"], NamedToolChoice, allowed_tools=AllowedToolsChoice)]


class ChatCompletionRequest(_Sampling, ChatExtensions):
    """``POST /v1/chat/completions``: messages rendered into one prompt (see ``chat_template.py``)."""

    messages: Items[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, **bounds(minimum=1))
    max_completion_tokens: StrictInt | None = Field(None, **bounds(minimum=1))
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, **bounds(minimum=0, maximum=MAX_LOGPROBS))
    tools: Items[Tool] | None = Field(None, **bounds(max_items=MAX_TOOLS))
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = Field(None, description="more than one call in a reply "
                                                   "(default true)")
    include_reasoning: StrictBool = Field(True, description="with a --reasoning-parser: return the reasoning "
                                          "(reasoning_content); false leaves it out")

    @model_validator(mode="after")
    def _chat_rules(self):
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise APIError("give max_tokens or max_completion_tokens, not both", param="max_completion_tokens")
        if self.top_logprobs and not self.logprobs:  # top_logprobs: 0 alone is harmless (vLLM's rule)
            raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    def template_messages(self) -> list[dict]:
        return [m.for_template() for m in self.messages]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
