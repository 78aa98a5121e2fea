"""A Response built from a reply's pieces: its output items, and, streamed, its events.

``ResponseBuilder`` is fed what each step of the engine added — reasoning text,
message text, tool-call pieces, the tokens' logprobs — as the chat path parsed
it, and answers with the Responses events those pieces make (an item opened,
its text's deltas, the item closed), keeping the output items as they stand. A
whole answer goes through the same builder, fed once, so a response and its
stream agree item for item. ``usage_of`` turns the chat usage into the
Responses one.
"""

from __future__ import annotations

import time
import uuid

from paged.serve.response_store import RUNNING
from paged.serve.responses_protocol import ResponsesRequest
from paged.serve.responses_schemas import (ArgumentsDeltaEvent, ArgumentsDoneEvent, ErrorInfo, FunctionCallOut,
                                           IncompleteDetails, InputTokensDetails, ItemEvent, MessageOut, OutputText,
                                           OutputTokensDetails, PartEvent, ReasoningDeltaEvent, ReasoningDoneEvent,
                                           ReasoningOut, ReasoningText, ResponseEvent, ResponseObject, ResponseUsage,
                                           TextDeltaEvent, TextDoneEvent)


class ResponseBuilder:
    """One response's output items and events, fed the reply's pieces in order (see the module's docstring)."""

    def __init__(self, req: ResponsesRequest, model: str) -> None:
        self.req, self.model = req, model
        self.id, self.created = f"resp_{uuid.uuid4().hex}", time.time()
        self.items: list = []  # MessageOut / FunctionCallOut / ReasoningOut, as they stand
        self.open: object | None = None  # the item text goes into now
        self.calls: dict[int, FunctionCallOut] = {}
        self.seq = 0
        self.status = "queued" if req.background else "in_progress"  # the response's, as it stands
        self.error: ErrorInfo | None = None
        self.usage: ResponseUsage | None = None
        self.logprobs: list = []  # token logprobs not yet sent with message text (include: logprobs)

    def _event(self, cls, **fields):
        event = cls(sequence_number=self.seq, **fields)
        self.seq += 1
        return event

    def start(self) -> list:
        """The first two events: ``response.created`` and ``response.in_progress`` (a background response's:
        ``response.created`` and ``response.queued``; its ``progress`` comes at its first token)."""
        snapshot = self.response(self.status)
        return [self._event(ResponseEvent, type=t, response=snapshot) for t in ("response.created",
                                                                              f"response.{self.status}")]

    def progress(self) -> list:
        """A queued response's ``response.in_progress``, once the engine has begun it (else nothing)."""
        if self.status != "queued":
            return []
        self.status = "in_progress"
        return [self._event(ResponseEvent, type="response.in_progress", response=self.response(self.status))]

    def fail(self, message: str) -> list:
        """The response failed (the engine's error, ``message``): ``response.failed``, with its ``error``."""
        self._close()
        self.status, self.error = "failed", ErrorInfo(code="server_error", message=message)
        return [self._event(ResponseEvent, type="response.failed", response=self.response(self.status))]

    def cancel(self) -> None:
        """The response was cancelled: what it said so far stays, the item it was writing ``incomplete``."""
        if self.open is not None and self.open.status == "in_progress":
            self.open.status = "incomplete"
        self.open, self.status = None, "cancelled"

    def _close(self) -> list:
        item, self.open = self.open, None
        if item is None or item.status != "in_progress":
            return []
        item.status, index = "completed", self.items.index(item)
        if isinstance(item, FunctionCallOut):
            done = [self._event(ArgumentsDoneEvent, item_id=item.id, output_index=index, name=item.name,
                                arguments=item.arguments)]
        else:
            part, text = item.content[0], item.content[0].text
            where = dict(item_id=item.id, output_index=index, content_index=0, text=text)
            if isinstance(item, MessageOut):
                part.logprobs += self.logprobs  # tokens that came after its last text (a held stop string)
                self.logprobs = []
                text_done = self._event(TextDoneEvent, **where, logprobs=part.logprobs)
            else:
                text_done = self._event(ReasoningDoneEvent, **where)
            done = [text_done,
                    self._event(PartEvent, type="response.content_part.done", item_id=item.id, output_index=index,
                                content_index=0, part=part)]
        return done + [self._event(ItemEvent, type="response.output_item.done", output_index=index, item=item)]

    def _text(self, kind, text: str) -> list:
        events = []
        if not isinstance(self.open, kind):
            events += self._close()
            if kind is MessageOut:
                self.open = MessageOut(id=f"msg_{uuid.uuid4().hex}", status="in_progress", content=[OutputText(text="")])
            else:
                self.open = ReasoningOut(id=f"rs_{uuid.uuid4().hex}", status="in_progress",
                                         content=[ReasoningText(text="")])
            self.items.append(self.open)
            index, empty = len(self.items) - 1, self.open.model_copy(deep=True)
            events += [self._event(ItemEvent, type="response.output_item.added", output_index=index, item=empty),
                       self._event(PartEvent, type="response.content_part.added", item_id=self.open.id,
                                   output_index=index, content_index=0, part=empty.content[0])]
        self.open.content[0].text += text
        where = dict(item_id=self.open.id, output_index=self.items.index(self.open), content_index=0, delta=text)
        if kind is ReasoningOut:
            return events + [self._event(ReasoningDeltaEvent, **where)]
        sent, self.logprobs = self.logprobs, []
        self.open.content[0].logprobs += sent
        return events + [self._event(TextDeltaEvent, **where, logprobs=sent)]

    def _call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list:
        events = []
        item = self.calls.get(index)
        if item is None:
            events += self._close()
            item = self.calls[index] = FunctionCallOut(id=f"fc_{uuid.uuid4().hex}", call_id=call_id or "", name=name
                                                       or "", arguments="", status="in_progress")
            self.items.append(item)
            self.open = item
            events.append(self._event(ItemEvent, type="response.output_item.added", output_index=len(self.items) - 1,
                                      item=item.model_copy()))
        item.arguments += arguments
        if arguments:
            events.append(self._event(ArgumentsDeltaEvent, item_id=item.id, output_index=self.items.index(item),
                                      delta=arguments))
        return events

    def feed(self, reasoning: str | None, content: str | None, calls: list[tuple], logprobs: list | None = None) -> list:
        """The events for what one step added: reasoning text, content text, call pieces ``(index, id, name,
        arguments)``, and its tokens' logprobs (with ``include`` logprobs): they go with the next message text,
        so every token's — a reasoning token's too — is in the message's ``output_text``."""
        self.logprobs += logprobs or []
        events = self._text(ReasoningOut, reasoning) if reasoning else []
        events += self._text(MessageOut, content) if content else []
        for call in calls:
            events += self._call(*call)
        return events

    def finish(self, reason: str | None, usage: ResponseUsage | None) -> tuple[list, ResponseObject]:
        """Close the open item; the last event and the Response (``incomplete`` when cut by length)."""
        events = self._close()
        messages = [i for i in self.items if isinstance(i, MessageOut)]
        if messages:  # tokens after the message closed (a call's): the response holds every token's, as unstreamed
            messages[-1].content[0].logprobs += self.logprobs
        self.logprobs = []
        status = self.status = "incomplete" if reason == "length" else "completed"
        self.usage = usage
        final = self.response(status)
        return events + [self._event(ResponseEvent, type=f"response.{status}", response=final)], final

    def response(self, status: str) -> ResponseObject:
        """The Response as it stands at ``status`` (its output once it is no longer queued or in progress)."""
        req = self.req
        tools = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
                  "strict": t.strict} for t in req.function_tools()]
        choice = req.tool_choice
        fmt = req.text.format.model_dump(exclude_none=True, by_alias=True) if req.text and req.text.format else None
        return ResponseObject(
            id=self.id, created_at=self.created, status=status, background=req.background, error=self.error,
            model=self.model, output=[i.model_copy(deep=True) for i in self.items] if status not in RUNNING else [],
            incomplete_details=IncompleteDetails() if status == "incomplete" else None,
            instructions=req.instructions, max_output_tokens=req.max_output_tokens,
            parallel_tool_calls=req.parallel_tool_calls is not False, previous_response_id=req.previous_response_id,
            store=req.store, temperature=req.temperature, top_p=req.top_p, tools=tools,
            tool_choice=(choice.model_dump() if hasattr(choice, "model_dump") else choice) or "auto",
            text={"format": fmt or {"type": "text"}}, truncation=req.truncation or "disabled", usage=self.usage,
            metadata=req.metadata or {}, top_logprobs=req.top_logprobs)

    def output_message(self) -> dict:
        """The reply as the assistant message the next response's conversation holds."""
        text = "".join(i.content[0].text for i in self.items if isinstance(i, MessageOut))
        message = {"role": "assistant", "content": text or None}
        calls = [i for i in self.items if isinstance(i, FunctionCallOut)]
        if calls:
            message["tool_calls"] = [{"id": c.call_id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments}} for c in calls]
        reasoning = "".join(i.content[0].text for i in self.items if isinstance(i, ReasoningOut))
        if reasoning:
            message["reasoning_content"] = reasoning
        if message["content"] is None and not calls:
            message["content"] = ""
        return message


def usage_of(usage, served, reasoning: str) -> ResponseUsage:
    """A chat ``Usage`` in the Responses shape (``cache_write_tokens``: the prompt's full blocks this request
    put in the prefix cache)."""
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    written = usage.prompt_tokens // served.block_size * served.block_size - cached if served.prefix_caching else 0
    thought = len(served.tokenizer.encode(reasoning).ids) if reasoning and served.tokenizer is not None else 0
    return ResponseUsage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                         total_tokens=usage.total_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=max(0, written)),
                         output_tokens_details=OutputTokensDetails(reasoning_tokens=thought))
