"""What the server keeps of its Responses: the finished ones, and the background ones as they run.

A finished response is kept (``store`` not false) with the conversation it ends,
so the next request can send only its new input (``previous_response_id``), and
with the items that made it (``input_items``: a follow-up's are the earlier
response's, its output, then its own input): the newest
``--response-store`` of them, 64 MiB at most, the oldest going first. Any of
those items, input or output, can be sent again by its id alone
(``item_reference``), for as long as a kept response holds it.

**Background responses** (``background.py``) run with no connection held; the
store keeps them as ``running`` until they end, then as finished ones, and
bounds them, since no connection does: at most ``--response-store`` run at
once, and one client (its address, as the fair order counts it) at most a
quarter of them; past either, a 429 before anything reaches the engine. A
streamed one's events count in the store's 64 MiB while they are written: the
oldest finished responses go first to make room, and when the running ones'
events alone pass it, the one with the most is ended ``failed`` (its events
dropped; it can still be polled).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import AsyncIterator, NamedTuple

from paged.serve.background import Background, first_after
from paged.serve.errors import APIError
from paged.serve.responses_schemas import InputItemOut, ResponseObject

MAX_STORED_CHARS = 64 * 2**20  # the store's conversations together, as text (about): the oldest go first past it
CLIENT_SHARE = 4  # one client may have a quarter of the store's background responses running
RUNNING = ("queued", "in_progress")
CONTINUABLE = ("completed", "incomplete")  # a response a follow-up can continue (previous_response_id)
ITEM_CHARS = 200  # what one message or item weighs beside its text: its ids, type and role, the JSON around them


def message_chars(message: dict) -> int:
    """About how many characters a chat message of a kept conversation holds: its texts, plus ``ITEM_CHARS``."""
    calls = message.get("tool_calls") or ()
    return ITEM_CHARS + len(message.get("content") or "") + len(message.get("reasoning_content") or "") + \
        sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) + ITEM_CHARS for c in calls)


def item_chars(item) -> int:
    """About how many characters an item (``InputItemOut``, or an output item) holds: its texts, arguments and
    output, plus ``ITEM_CHARS``."""
    fields = item.__dict__  # a model's fields (read so: asking a model for a field it lacks is slow)
    chars = ITEM_CHARS + sum(len(part.text) for part in fields.get("content") or ())
    for name in ("name", "arguments", "output"):
        value = fields.get(name)
        chars += len(value) if isinstance(value, str) else 0
    return chars + sum(len(part.get("text", "")) for part in fields.get("summary") or () if isinstance(part, dict))


class Kept(NamedTuple):
    """A finished response the server keeps: itself, the conversation it ends (chat messages, for a follow-up;
    None when it failed or was cancelled), the items it was made from (for ``input_items``), a background
    and streamed response's events (else None), and ``size``: those, as text."""

    response: ResponseObject
    conversation: list[dict] | None
    inputs: list[InputItemOut]
    events: list[str] | None
    size: int


class ResponseStore:
    """The newest finished responses and their conversations, bounded in count and in size (oldest evicted
    first), and the background responses that run (``running``), bounded in count (see the module)."""

    def __init__(self, capacity: int, max_chars: int = MAX_STORED_CHARS) -> None:
        self.capacity, self.max_chars = capacity, max_chars
        self.entries: OrderedDict[str, Kept] = OrderedDict()
        self.chars = 0
        self.items: dict[str, dict[str, object]] = {}  # an item's id -> {a kept response holding it: the item}
        self.running_chars = 0  # the running responses' events, as text (those not stopped)
        self.running: dict[str, Background] = {}

    def put(self, response: ResponseObject, conversation: list[dict] | None, inputs: list[InputItemOut],
            events: list[str] | None = None) -> None:
        # weighed by their texts, not written out: a follow-up holds its whole conversation's items again, and
        # writing 100 000 of them as text took 0.8 s of the event loop (weighing them: a few hundredths)
        size = sum(map(message_chars, conversation or ())) + sum(map(item_chars, inputs)) + \
            sum(map(len, events or ()))
        if self.capacity == 0 or size > self.max_chars:
            return
        self.entries[response.id] = Kept(response, conversation, inputs, events, size)
        self.chars += size
        for item in inputs + response.output:
            self.items.setdefault(item.id, {})[response.id] = item
        self._make_room()

    def _make_room(self) -> None:
        """The oldest kept responses forgotten until the count and the size (with the running events) fit."""
        while self.entries and (len(self.entries) > self.capacity
                                or self.chars + self.running_chars > self.max_chars):
            self._forget(next(iter(self.entries)))

    def _forget(self, response_id: str) -> None:
        kept = self.entries.pop(response_id)
        self.chars -= kept.size
        for item in kept.inputs + kept.response.output:
            holders = self.items.get(item.id)  # None: an id this response held twice, already let go
            if holders is not None:
                holders.pop(response_id, None)
                if not holders:
                    del self.items[item.id]

    def _missing(self, response_id: str, param: str) -> APIError:
        return APIError(f"response {response_id[:80]!r} is not kept by this server (it keeps the newest "
                        f"{self.capacity} it gave, with store not false, since it started, until deleted)", 404,
                        param=param, code="not_found")

    def get(self, response_id: str, param: str = "response_id") -> Kept:
        """A finished response (a 404 naming ``param`` if it is not kept; a 400 if it is still running)."""
        if response_id in self.running:
            status = self.running[response_id].builder.status
            raise APIError(f"{param}: response {response_id[:80]!r} is still {status} (a background response); "
                           "wait until it is done", param=param, code="invalid_value")
        if response_id not in self.entries:
            raise self._missing(response_id, param)
        return self.entries[response_id]

    def continued(self, response_id: str) -> tuple[list[dict], list[InputItemOut]]:
        """What a follow-up continues (``previous_response_id``): the conversation, as chat messages, and as the
        items that made it (the response's own input items, then its output). Only a completed or incomplete
        response can be continued; another is a 400 naming the field."""
        kept = self.get(response_id, "previous_response_id")
        if kept.conversation is None:
            raise APIError(f"previous_response_id: response {response_id[:80]!r} {kept.response.status}; only a "
                           f"{' or '.join(CONTINUABLE)} response can be continued", param="previous_response_id",
                           code="invalid_value")
        return kept.conversation, kept.inputs + kept.response.output

    def response(self, response_id: str) -> ResponseObject:
        """A response as it stands: a running one's status, or a kept one (a 404 if neither)."""
        if response_id in self.running:
            return self.running[response_id].response()
        return self.get(response_id).response

    def inputs(self, response_id: str) -> list[InputItemOut]:
        """The items a response was made from, running or kept (a 404 if neither)."""
        if response_id in self.running:
            return self.running[response_id].inputs
        return self.get(response_id).inputs

    def delete(self, response_id: str) -> None:
        """Forget a response and its conversation (a 404, as ``get``, if it is not kept)."""
        self.get(response_id)
        self._forget(response_id)

    def find(self, references: list[tuple[int, str]]) -> dict:
        """The kept items that ``item_reference`` s name (``(place in input, id)``): id -> the item, from the newest
        response holding it (a follow-up holds its conversation's); a 404 naming the first one no kept response
        holds. Dictionary lookups only: cheap on the event loop."""
        found = {}
        for n, item_id in references:
            if item_id not in found:
                holders = self.items.get(item_id)
                if not holders:
                    raise APIError(f"input.{n}.id: no response this server keeps has an item {item_id[:80]!r} (it keeps "
                                   f"the newest {self.capacity} it gave, with store not false, until deleted)", 404,
                                   param=f"input.{n}.id", code="not_found")
                found[item_id] = next(reversed(holders.values()))
        return found

    # --- background responses

    def admit(self, client: str) -> None:
        """Room for one more background response from ``client``, else an error (nothing has started)."""
        if self.capacity == 0:
            raise APIError("background: this server keeps no responses (--response-store 0), so it runs none in "
                           "the background", param="background", code="invalid_value")
        share = max(1, self.capacity // CLIENT_SHARE)
        mine = sum(job.client == client for job in self.running.values())
        if len(self.running) >= self.capacity or mine >= share:
            whose = f"this client's {mine} (at most {share}: a quarter of --response-store {self.capacity})" \
                if mine >= share else f"{len(self.running)} (at most --response-store {self.capacity})"
            raise APIError(f"background: {whose} background responses are running; wait for one to end or "
                           "cancel one (POST /v1/responses/{id}/cancel)", 429, param="background",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"})

    def start(self, job: Background, events: AsyncIterator) -> None:
        """Run ``job`` on ``events``, kept as running until its task ends (then as a finished response)."""
        self.running[job.builder.id] = job
        job.on_grow = self._grew
        job.task = asyncio.get_running_loop().create_task(job.drive(events))
        job.task.add_done_callback(lambda _: self._ended(job))

    def _grew(self, job: Background, chars: int) -> None:
        """A running response wrote down ``chars`` more of events: room is made for them (the oldest kept
        responses go); if the running events alone pass the store's size, the response with the most is
        stopped, its events no longer counted."""
        self.running_chars += chars
        self._make_room()
        if self.running_chars > self.max_chars:
            hog = max((j for j in self.running.values() if j.failure is None), key=lambda j: j.chars)
            self.running_chars -= hog.chars
            hog.stop(f"the events of this streamed background response ({hog.chars} characters, the most of those "
                     f"running) passed, with the others', the {self.max_chars} the server keeps for responses; "
                     "poll a long response instead of streaming it, or stream it without background")

    def _ended(self, job: Background) -> None:
        """Move an ended job (finished, failed or cancelled) from ``running`` to the kept responses."""
        if job.ended:
            return
        if not job.began:  # cancelled before its task ran: its engine request was never followed
            job.abort()
        if job.failure is None:
            self.running_chars -= job.chars
        if job.builder.status in RUNNING and job.failure is not None:
            job._add(job.builder.fail(job.failure))
        elif job.builder.status in RUNNING:
            job.builder.cancel()
        job.ended = True
        job.grew.set()
        del self.running[job.builder.id]
        status = job.builder.status
        conversation = job.history + [job.builder.output_message()] if status in CONTINUABLE else None
        self.put(job.response(), conversation, job.inputs, job.events if job.failure is None else None)

    def follow(self, response_id: str, after: int | None) -> AsyncIterator[str]:
        """A background stream's text after event ``after``: as it runs, or as it was."""
        job = self.running.get(response_id)
        events = job.events if job is not None else self.get(response_id).events
        if events is None:
            raise APIError(f"stream: response {response_id[:80]!r} has no events kept: only a response made with "
                           "background: true and stream: true keeps them, to stream again (while they fit the "
                           "store)", param="stream", code="invalid_value")
        if job is not None:
            return job.follow(after)

        async def replay():
            for text in events[first_after(after):]:
                yield text
        return replay()

    async def cancel(self, response_id: str) -> ResponseObject:
        """Cancel a running background response (its engine request aborted) and return it; a finished
        background one is returned as it is; one made without ``background`` is a 400."""
        job = self.running.get(response_id)
        if job is not None:
            job.task.cancel()
            await asyncio.wait({job.task})
            self._ended(job)
        kept = self.get(response_id)
        if not kept.response.background:
            raise APIError(f"response {response_id[:80]!r} was not made in the background; only a background "
                           "response can be cancelled", param="response_id", code="invalid_value")
        return kept.response

    async def close(self) -> None:
        """Cancel every background response still running (the server stops)."""
        for job in list(self.running.values()):
            job.task.cancel()
        if self.running:
            await asyncio.wait({job.task for job in self.running.values()})
