"""What ``/v1/responses`` answers with: the Response object, its output items, and its stream's events.

OpenAI's shapes (the ``openai`` package's ``Response`` and
``ResponseStreamEvent`` parse them, checked by ``tests/serve/test_responses.py``):
a Response's ``output`` is a list of items — ``reasoning`` (the model's
``<think>`` text, with a ``--reasoning-parser``), ``message`` (the reply's
text as one ``output_text`` part) and ``function_call`` (one per call) — and a
streamed Response is a sequence of typed events, each numbered
(``sequence_number``): ``response.created``, ``response.in_progress``, then per
item ``response.output_item.added``, its parts' and text's
``...added`` / ``...delta`` / ``...done``, ``response.output_item.done``, and
last ``response.completed`` (or ``response.incomplete`` when
``max_output_tokens`` cut it) with the whole Response. A background response
(``background: true``) opens with ``response.created`` and ``response.queued``,
has its ``response.in_progress`` at its first token, and may end ``failed``
(``response.failed``, with its ``error``) or ``cancelled``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Status = Literal["completed", "in_progress", "incomplete", "failed"]  # an output item's
ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = Field(default_factory=list)
    logprobs: list = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class MessageOut(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Status
    content: list[OutputText]


class FunctionCallOut(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Status


class ReasoningOut(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list = Field(default_factory=list)
    content: list[ReasoningText]
    status: Status


OutputItem = MessageOut | FunctionCallOut | ReasoningOut


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(ge=0, description="prompt tokens found in the prefix cache")
    cache_write_tokens: int = Field(ge=0, description="prompt tokens of full blocks this request added to the "
                                    "prefix cache (0 without one)")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(ge=0, description="tokens of the reasoning text (with a --reasoning-parser)")


class ResponseUsage(BaseModel):
    input_tokens: int = Field(ge=0)
    input_tokens_details: InputTokensDetails
    output_tokens: int = Field(ge=0)
    output_tokens_details: OutputTokensDetails
    total_tokens: int = Field(ge=0)


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ErrorInfo(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    """A response: its output items, usage and the settings it was made with."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: ResponseStatus
    background: bool = False
    error: ErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    store: bool
    temperature: float | None = None
    text: dict = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict
    tools: list[dict]
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: ResponseUsage | None = Field(None, exclude_if=lambda value: value is None,
                                        description="once the response is done")
    top_logprobs: int | None = None
    metadata: dict = Field(default_factory=dict)


class InputText(BaseModel):
    type: Literal["input_text"] = "input_text"
    text: str


class InputMessage(BaseModel):
    """A message of a request's ``input`` (a user's, system's or developer's), as ``input_items`` lists it."""

    type: Literal["message"] = "message"
    id: str
    role: Literal["user", "system", "developer"]
    status: Status = "completed"
    content: list[InputText]


class FunctionCallOutputOut(BaseModel):
    """A ``function_call_output`` of a request's ``input``, as ``input_items`` lists it."""

    type: Literal["function_call_output"] = "function_call_output"
    id: str
    call_id: str
    output: str
    status: Status = "completed"


InputItemOut = InputMessage | MessageOut | FunctionCallOut | FunctionCallOutputOut | ReasoningOut


class ResponseItemList(BaseModel):
    """``GET /v1/responses/{id}/input_items``: one page of the items a response was given."""

    object: Literal["list"] = "list"
    data: list[InputItemOut]
    first_id: str | None
    last_id: str | None
    has_more: bool


class InputTokens(BaseModel):
    """``POST /v1/responses/input_tokens``'s answer: the prompt's tokens, as ``usage.input_tokens`` would count."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int = Field(ge=0)


class ResponseDeleted(BaseModel):
    """``DELETE /v1/responses/{id}``'s answer: the response is no longer kept."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: Literal[True] = True


# -- stream events -----------------------------------------------------------------------------
class _Event(BaseModel):
    sequence_number: int = Field(ge=0)


class ResponseEvent(_Event):
    """``response.created``, ``response.queued``, ``response.in_progress``, ``response.completed``,
    ``response.incomplete``, ``response.failed``: the whole Response as it stands."""

    type: Literal["response.created", "response.queued", "response.in_progress", "response.completed",
                  "response.incomplete", "response.failed"]
    response: ResponseObject


class ItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class PartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class TextDeltaEvent(_Event):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list = Field(default_factory=list)


class TextDoneEvent(_Event):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list = Field(default_factory=list)


class ReasoningDeltaEvent(_Event):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningDoneEvent(_Event):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    code: str | None
    message: str
    param: str | None


StreamEvent = (ResponseEvent | ItemEvent | PartEvent | TextDeltaEvent | TextDoneEvent | ReasoningDeltaEvent
               | ReasoningDoneEvent | ArgumentsDeltaEvent | ArgumentsDoneEvent | ErrorEvent)
