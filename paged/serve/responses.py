"""``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``POST
/v1/responses/{id}/cancel``, ``POST /v1/responses/input_tokens``: OpenAI's Responses API over the chat path.

A Responses request is a chat request in other clothes: ``responses_protocol``
turns it into one (instructions, the previous response's conversation, the
input items, function tools, ``text.format``), and ``chat.answer`` renders,
constrains, submits and parses it as any chat request. What differs is the
answer: ``ResponseBuilder`` (``response_builder.py``) turns the parsed reply —
reasoning, content, tool calls — into the Response's output items, and, streamed, into the Responses
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
(``background.py``, ``response_store.py``). ``truncation: "auto"``: a conversation past the
context loses its oldest turns instead of being refused (``fit_context``).
"""

from __future__ import annotations

import uuid
from typing import Literal

from fastapi import Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError

from paged.serve import chat, streaming
from paged.serve.background import Background, event_text
from paged.serve.body import parse_body
from paged.serve.chat_protocol import ChatCompletionRequest
from paged.serve.errors import APIError, from_validation_error, lead_with
from paged.serve.extensions import BUILT_HERE
from paged.serve.generation import client_address
from paged.serve.offload import INLINE_MAX
from paged.serve.openapi import error_responses, request_body
from paged.serve.response_builder import ResponseBuilder, usage_of
from paged.serve.response_store import ResponseStore
from paged.serve.responses_protocol import (EXPECTED, FunctionCallItem, FunctionCallOutputItem, InputTokensRequest,
                                            MessageItem, ResponsesRequest)
from paged.serve.responses_schemas import (ErrorEvent, FunctionCallOut, FunctionCallOutputOut, InputItemOut,
                                           InputMessage, InputText, InputTokens, MessageOut, OutputText, ReasoningOut,
                                           ReasoningText, ResponseDeleted, ResponseItemList, ResponseObject)
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

    async def gathered(req: ResponsesRequest) -> tuple[ResponsesRequest, list[dict], list[InputItemOut], int]:
        """What a request's prompt is made of: the request with its references put in place (the items found
        on the loop, each put in on the pool), the conversation it continues as chat messages and as items,
        and its items' count (the weight of the work on them)."""
        conversation, earlier = store.continued(req.previous_response_id) if req.previous_response_id else ([], [])
        references = req.references()
        if references:
            req = await served.work.run(len(references), req.referenced, store.find(references))
        return req, conversation, earlier, len(conversation) + (len(req.input) if isinstance(req.input, list) else 1)

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
        req, conversation, earlier, items = await gathered(req)
        if req.background:
            store.admit(client_address(raw))
        builder = ResponseBuilder(req, served.name)
        try:
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
        req, conversation, _, items = await gathered(await parse_body(raw, InputTokensRequest, served.work, EXPECTED))
        try:
            body, chat_req = await served.work.run(items, as_chat, req, conversation)
            ids = (await chat.render(chat_req, served))[3]
            if req.truncation == "auto" and len(ids) > served.max_model_len - (req.max_output_tokens or 1):
                chat_req = (await fit_context(req, body, served, items))[1]
                ids = (await chat.render(chat_req, served))[3]
            most = chat_req.requested_max_tokens
            await served.work.run(INLINE_MAX, generator.params, chat_req, [ids], 1 if most is None else most,
                                  chat_req.num_logprobs, chat.field_names(chat_req))
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
