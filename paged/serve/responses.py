"""``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``POST
/v1/responses/{id}/cancel``, ``POST /v1/responses/input_tokens``: OpenAI's Responses API over the chat path.

A Responses request is a chat request in other clothes: ``responses_protocol``
turns it into one (instructions, the previous response's conversation, the
input items, function tools, ``text.format``), and ``chat.answer`` renders,
constrains, submits and parses it as any chat request. What differs is the
answer: ``ResponseBuilder`` turns the parsed reply — reasoning, content, tool
calls — into the Response's output items, and, streamed, into the Responses
events (``responses_schemas.py``), built from the same chat chunks a chat
stream sends. A whole answer goes through the same builder, fed once, so the
two agree item for item.

``previous_response_id``: the server keeps the newest ``--response-store``
responses it gave (in memory, for its lifetime, or until ``DELETE
/v1/responses/{id}``; ``store: false`` keeps none),
each with its conversation (without its instructions, as OpenAI's API does),
so a client can send only the new input, and the items used to make it
(``input_items``, a page at a time: a follow-up's begin with the
conversation's). An id the server no longer keeps is a 404 naming the
field. An ``item_reference`` input item names one kept item, which is put in
its place. ``background: true``: the response runs with no
connection held, polled, streamed again from any event, or cancelled
(``response_store.py``). ``truncation: "auto"``: a conversation past the
context loses its oldest turns instead of being refused (``fit_context``).
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from fastapi import Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from paged.serve import chat, streaming
from paged.serve.body import parse_body
from paged.serve.chat_protocol import ChatCompletionRequest
from paged.serve.errors import APIError, from_validation_error, lead_with
from paged.serve.extensions import BUILT_HERE
from paged.serve.generation import client_address
from paged.serve.offload import INLINE_MAX
from paged.serve.openapi import error_responses, request_body
from paged.serve.response_store import RUNNING, Background, ResponseStore, event_text
from paged.serve.responses_protocol import (EXPECTED, FunctionCallItem, FunctionCallOutputItem, InputTokensRequest,
                                            MessageItem, ResponsesRequest)
from paged.serve.responses_schemas import (ArgumentsDeltaEvent, ArgumentsDoneEvent, ErrorEvent, ErrorInfo,
                                           FunctionCallOut, FunctionCallOutputOut, IncompleteDetails, InputItemOut,
                                           InputMessage, InputText, InputTokens, InputTokensDetails, ItemEvent,
                                           MessageOut,
                                           OutputText, OutputTokensDetails, PartEvent, ReasoningDeltaEvent,
                                           ReasoningDoneEvent, ReasoningOut, ReasoningText, ResponseDeleted,
                                           ResponseEvent, ResponseItemList, ResponseObject, ResponseUsage,
                                           TextDeltaEvent, TextDoneEvent)
from paged.serve.schemas import ErrorResponse

def input_items(req: ResponsesRequest) -> list[InputItemOut]:
    """The items ``req.input`` gave, as OpenAI lists them: each with its id (the client's, else a new one),
    text as ``input_text`` parts (an assistant's as ``output_text``), a call's output as text."""
    def new_id(prefix: str) -> str:
        return f"{prefix}_{uuid.uuid4().hex}"

    items = [MessageItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    out: list[InputItemOut] = []
    for item in items:
        if isinstance(item, MessageItem) and item.role == "assistant":
            out.append(MessageOut(id=item.id or new_id("msg"), status="completed",
                                  content=[OutputText(text=item.text())]))
        elif isinstance(item, MessageItem):
            out.append(InputMessage(id=item.id or new_id("msg"), role=item.role,
                                    content=[InputText(text=item.text())]))
        elif isinstance(item, FunctionCallItem):
            out.append(FunctionCallOut(id=item.id or new_id("fc"), call_id=item.call_id, name=item.name,
                                       arguments=item.arguments, status="completed"))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(FunctionCallOutputOut(id=item.id or new_id("fco"), call_id=item.call_id, output=item.text()))
        else:  # ReasoningItem
            out.append(ReasoningOut(id=item.id or new_id("rs"), status="completed",
                                    summary=[p.model_dump() for p in item.summary],
                                    content=[ReasoningText(text=p.text) for p in item.content or []]))
    return out


def page(items: list, limit: int, order: str, after: str | None, before: str | None) -> ResponseItemList:
    """One page of ``items`` (oldest first): in ``order``, those after the item ``after`` and before the item
    ``before`` (ids; a 400 naming the parameter when the response has no such item), at most ``limit``."""
    ordered = items if order == "asc" else items[::-1]
    ids = [item.id for item in ordered]
    start, end = 0, len(ordered)
    for name, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise APIError(f"{name}: this response's input has no item {cursor[:80]!r}", param=name,
                           code="invalid_value")
    if after is not None:
        start = ids.index(after) + 1
    if before is not None:
        end = ids.index(before)
    data = ordered[start:max(start, end)][:limit]
    return ResponseItemList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                            has_more=start + len(data) < end)


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


# the chat request's fields that come from a Responses request's own (ResponsesRequest.chat_body)
RESPONSES_FIELD = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
                   "messages": "input", "response_format": "text.format"}


def in_responses_terms(err: APIError) -> APIError:
    """An error of the chat request a Responses request became, naming the field the client sent
    (``max_output_tokens``, not ``max_completion_tokens``) in ``param`` and at the head of the message."""
    ours = RESPONSES_FIELD.get((err.param or "").split(".")[0])
    if ours is None:
        return err
    return APIError(lead_with(err.message, err.param, ours), err.status, param=ours, code=err.code, type=err.type,
                    headers=err.headers)


def as_chat(req: ResponsesRequest, conversation: list[dict]) -> tuple[dict, ChatCompletionRequest]:
    """The chat request ``req`` asks for, after ``conversation`` (a kept response's), with its body (on the
    pool when the items are many: checking 100 000 messages takes a core for a second)."""
    body = req.chat_body(conversation)
    return body, ChatCompletionRequest.model_validate(body, context=BUILT_HERE)


async def fit_context(req: ResponsesRequest, body: dict, served, weight: int) -> tuple[dict, ChatCompletionRequest]:
    """``truncation: "auto"`` for a prompt past the context: the chat request with the conversation's oldest
    turns dropped — after its leading system messages (the instructions), whole turns, each from a user
    message on, so a call and its output go together — the fewest that make the prompt and
    ``max_output_tokens`` fit the model's context (a binary search over the turns, each try rendered); all
    but the last turn when even that does not fit (its 400 follows)."""
    messages = body["messages"]
    head = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")), len(messages))
    cuts = [i for i in range(head + 1, len(messages)) if messages[i]["role"] == "user"]  # where a turn begins
    room = served.max_model_len - (req.max_output_tokens or 1)  # the longest prompt that fits

    async def without_turns_before(cut: int) -> tuple[dict, ChatCompletionRequest]:
        trial = {**body, "messages": messages[:head] + messages[cut:]}
        return trial, await served.work.run(weight, lambda: ChatCompletionRequest.model_validate(trial,
                                                                                          context=BUILT_HERE))

    lo, hi = 0, len(cuts) - 1
    if hi < 0:  # one turn only: nothing to drop
        return await without_turns_before(head)
    while lo < hi:  # the first cut that fits (the more dropped, the shorter)
        mid = (lo + hi) // 2
        _, trial = await without_turns_before(cuts[mid])
        if len((await chat.render(trial, served))[3]) <= room:
            hi = mid
        else:
            lo = mid + 1
    return await without_turns_before(cuts[lo])


def install(app, served, generator, store: ResponseStore) -> None:
    """Add ``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{response_id}``, ``GET
    /v1/responses/{response_id}/input_items``, ``POST /v1/responses/{response_id}/cancel`` and ``POST
    /v1/responses/input_tokens`` to ``app``."""
    errors = error_responses(400, 401, 413, 415, 421, 500,
                             _404="the model, previous_response_id or a referenced item is not here",
                             _429="background: too many background responses are running",
                             _503="the engine failed, or the server is stopping")
    stream_doc = {"text/event-stream": {"schema": {"type": "object", "properties": {"event": {"type": "string"},
                                                                                    "data": {"type": "string"}}}}}
    not_kept = "not kept (the newest --response-store are)"

    def event_stream(texts) -> StreamingResponse:
        return StreamingResponse(texts, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/responses", tags=["OpenAI API"], summary="Create a response (OpenAI's Responses API)",
              response_model=None, openapi_extra=request_body(ResponsesRequest),
              responses={200: {"model": ResponseObject, "content": stream_doc,
                               "description": "the response; with stream: true, its events"}, **errors})
    async def create(raw: Request):
        req = await parse_body(raw, ResponsesRequest, served.work, EXPECTED)
        if req.background and not req.store:
            raise APIError("background: true needs store: true (a background response is fetched later, so the "
                           "server keeps it)", param="background", code="invalid_value")
        conversation, earlier = store.continued(req.previous_response_id) if req.previous_response_id else ([], [])
        references = req.references()
        if references:  # the items found here, on the loop; each put in its place on the pool
            req = await served.work.run(len(references), req.referenced, store.find(references))
        if req.background:
            store.admit(client_address(raw))
        builder = ResponseBuilder(req, served.name)
        try:
            items = len(conversation) + (len(req.input) if isinstance(req.input, list) else 1)
            body, chat_req = await served.work.run(items, as_chat, req, conversation)
            try:
                run = await chat.answer(chat_req, raw, served, generator, start_only=True, tag=builder.id)
            except APIError as e:  # refused before the engine saw it: with truncation "auto", drop old turns
                if req.truncation != "auto" or e.code != "context_length_exceeded":
                    raise
                body, chat_req = await fit_context(req, body, served, items)
                run = await chat.answer(chat_req, raw, served, generator, start_only=True, tag=builder.id)
        except ValidationError as e:
            raise in_responses_terms(from_validation_error(e)) from None
        except APIError as e:
            raise in_responses_terms(e) from None
        history = body["messages"][1:] if req.instructions else body["messages"]
        inputs = earlier + await served.work.run(items, input_items, req) if req.store else []
        if req.background:
            try:  # again: another may have taken the room while this one was checked (then nothing is kept)
                store.admit(client_address(raw))
            except APIError:
                run.abort_unfinished({})
                raise
            job = Background(builder, client_address(raw), history, inputs, abort=lambda: run.abort_unfinished({}))
            store.start(job, response_events(run, builder, served))
            if req.stream:
                return event_stream(job.follow(None))
            return Response(job.response().model_dump_json(), media_type="application/json")
        if req.stream:
            return event_stream(streamed(run, builder, served, store, history, inputs))
        try:
            finals = await generator.collect(run, raw)
        except APIError as e:  # the request failed while it ran
            raise in_responses_terms(e) from None
        if finals is None:
            return Response(status_code=499)
        whole = generator.whole_response(run, finals)
        choice = whole.choices[0]
        message = choice.message
        builder.feed(message.reasoning_content, message.content,
                     [(i, c.id, c.function.name, c.function.arguments) for i, c in enumerate(message.tool_calls or [])],
                     choice.logprobs.content if choice.logprobs else None)
        _, final = builder.finish(choice.finish_reason, usage_of(whole.usage, served, message.reasoning_content or ""))
        if req.store:
            store.put(final, history + [builder.output_message()], inputs)
        return Response(final.model_dump_json(), media_type="application/json")

    @app.post("/v1/responses/input_tokens", tags=["OpenAI API"], response_model=InputTokens,
              summary="Count a Responses request's input tokens (nothing is generated)",
              openapi_extra=request_body(InputTokensRequest),
              responses=error_responses(400, 401, 413, 415, _404="the model, previous_response_id or a referenced "
                                        "item is not here"))
    async def count_input_tokens(raw: Request) -> InputTokens:
        """The prompt the request would make — its previous response's conversation, references, instructions,
        tools, and ``truncation: "auto"``'s cut — rendered and counted; its sampling fields are checked as
        ``create`` checks them, so a count never passes a request the server would refuse."""
        req = await parse_body(raw, InputTokensRequest, served.work, EXPECTED)
        conversation = store.continued(req.previous_response_id)[0] if req.previous_response_id else []
        references = req.references()
        if references:
            req = await served.work.run(len(references), req.referenced, store.find(references))
        items = len(conversation) + (len(req.input) if isinstance(req.input, list) else 1)
        try:
            body, chat_req = await served.work.run(items, as_chat, req, conversation)
            ids = (await chat.render(chat_req, served))[3]
            if req.truncation == "auto" and len(ids) > served.max_model_len - (req.max_output_tokens or 1):
                chat_req = (await fit_context(req, body, served, items))[1]
                ids = (await chat.render(chat_req, served))[3]
            rename = {"logprobs": "top_logprobs", "max_tokens": "max_completion_tokens", **chat_req.guided_rename()}
            most = chat_req.requested_max_tokens
            await served.work.run(INLINE_MAX, generator.params, chat_req, [ids], 1 if most is None else most,
                                  chat_req.num_logprobs, rename)
        except ValidationError as e:
            raise in_responses_terms(from_validation_error(e)) from None
        except APIError as e:
            raise in_responses_terms(e) from None
        return InputTokens(input_tokens=len(ids))

    @app.get("/v1/responses/{response_id}", tags=["OpenAI API"], summary="A response this server keeps",
             response_model=ResponseObject,
             responses={200: {"content": stream_doc, "description": "the response; with stream=true (a background "
                              "response), its events"}, **error_responses(400, 401, _404=not_kept)})
    async def retrieve(
            response_id: str,
            stream: bool = Query(False, description="a background response's events, as it runs or as it ran"),
            starting_after: int | None = Query(None, ge=0, description="with stream: the events after this "
                                               "sequence_number (a dropped stream's last)"),
    ):
        if stream:
            return event_stream(store.follow(response_id, starting_after))
        return store.response(response_id)

    @app.get("/v1/responses/{response_id}/input_items", tags=["OpenAI API"],
             summary="The items a kept response was made from (a follow-up's: the conversation's, then its input), "
                     "a page at a time",
             responses=error_responses(400, 401, _404=not_kept))
    async def list_input_items(
            response_id: str,
            limit: int = Query(20, ge=1, le=100, description="items on the page"),
            order: Literal["asc", "desc"] = Query("desc", description="asc: oldest first; desc: newest first"),
            after: str | None = Query(None, description="the page starts after this item id"),
            before: str | None = Query(None, description="the page ends before this item id"),
            include: list[str] | None = Query(None, description="accepted and ignored: no item has more to add"),
    ) -> ResponseItemList:
        return page(store.inputs(response_id), limit, order, after, before)

    @app.post("/v1/responses/{response_id}/cancel", tags=["OpenAI API"],
              summary="Cancel a background response (a finished one is returned as it is)",
              responses=error_responses(400, 401, 415, _404=not_kept))
    async def cancel(response_id: str) -> ResponseObject:
        return await store.cancel(response_id)

    @app.delete("/v1/responses/{response_id}", tags=["OpenAI API"],
                summary="Forget a response this server keeps (a running background one is cancelled first)",
                responses=error_responses(401, _404=not_kept))
    async def delete(response_id: str) -> ResponseDeleted:
        if response_id in store.running:
            await store.cancel(response_id)
        store.delete(response_id)
        return ResponseDeleted(id=response_id)


async def response_events(run, builder: ResponseBuilder, served):
    """The Responses events of a run (event models), from the chat chunks ``streaming.events`` builds; an error
    ends them with an ``ErrorEvent``."""
    for event in builder.start():
        yield event
    reason, reasoning = None, ""
    async for chunk in streaming.events(run):
        if run.timing.tokens:  # the engine has begun it: a background response is no longer queued
            for event in builder.progress():
                yield event
        if isinstance(chunk, ErrorResponse):
            err = in_responses_terms(APIError(chunk.error.message, param=chunk.error.param, code=chunk.error.code))
            yield builder._event(ErrorEvent, code=err.code, message=err.message, param=err.param)
            return
        if isinstance(chunk, str):  # [DONE]
            continue
        if not chunk.choices:  # the usage chunk: the last one
            for event in builder.finish(reason, usage_of(chunk.usage, served, reasoning))[0]:
                yield event
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        reason = choice.finish_reason or reason
        reasoning += delta.reasoning_content or ""
        calls = [(c.index, c.id, c.function.name, c.function.arguments) for c in delta.tool_calls or []]
        logprobs = choice.logprobs.content if choice.logprobs else None
        for event in builder.feed(delta.reasoning_content, delta.content, calls, logprobs):
            yield event


async def streamed(run, builder: ResponseBuilder, served, store: ResponseStore, history: list[dict],
                   inputs: list[InputItemOut]):
    """A streamed response's event texts; kept (``store``) as its last event is made, so a client that reads
    it can fetch or continue it at once."""
    async for event in response_events(run, builder, served):
        if builder.req.store and event.type in ("response.completed", "response.incomplete"):
            store.put(event.response, history + [builder.output_message()], inputs)
        yield event_text(event)
