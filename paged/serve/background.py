"""Background responses: a Response that runs with no connection held.

``background: true`` answers at once, with the response ``queued``; the
generation goes on as a ``Background`` job (an asyncio task over the same
events a stream is made of), and the client polls ``GET /v1/responses/{id}``:
``queued`` until the engine has given its first token, then ``in_progress``,
then ``completed`` or ``incomplete`` (or ``failed``, or ``cancelled`` by
``POST /v1/responses/{id}/cancel``). Asked for as a stream as well (``stream:
true``), every event it makes is written down, so the stream can be followed
from any event on (``GET /v1/responses/{id}?stream=true&starting_after=N``
after a dropped connection), by any number of readers, and closing one stops
nothing; polled only, it keeps no events (a long answer's events weigh about
250 bytes a token). Cancelling (or deleting) a running one aborts its engine
request, which frees its blocks. The store (``response_store.py``) holds the
jobs while they run, bounds them and counts their events.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

from paged.serve.responses_schemas import ErrorEvent, InputItemOut, ResponseObject
from paged.serve.streaming import sse


def first_after(after: int | None) -> int:
    """The index of the first event a stream resumed after event ``after`` sends (None: from the start); an
    event's index is its ``sequence_number``."""
    return 0 if after is None else after + 1


def event_text(event) -> str:
    """One Responses event as the stream sends it: its type, then its data."""
    return f"event: {event.type}\n{sse(event)}"


class Background:
    """A response that runs with no connection: its builder (``response_builder.ResponseBuilder``), the events so far
    as stream text, and the task that makes them.

    Args:
        builder: the response's builder; its ``status`` is the response's.
        client: who asked (``generation.client_address``), for the per-client bound.
        history, inputs: what the store keeps with it when it ends (its conversation before the reply; the
            items it was made from).
        abort: ends its engine request; called if it is cancelled before its task began (the task's own
            stream aborts it otherwise).
    """

    def __init__(self, builder, client: str, history: list[dict], inputs: list[InputItemOut],
                 abort: Callable[[], None]) -> None:
        self.builder, self.client, self.history, self.inputs, self.abort = builder, client, history, inputs, abort
        self.events: list[str] | None = [] if builder.req.stream else None  # written down only for a stream
        self.chars = 0  # of the events, as the store counts them (none once it is stopped for their size)
        self.grew = asyncio.Event()  # set (and replaced) at each new event, and at the end
        self.task: asyncio.Task | None = None
        self.began = self.ended = False
        self.on_grow: Callable[[Background, int], None] = lambda job, chars: None  # the store's count
        self.failure: str | None = None  # why the store stopped it, if it did

    def response(self) -> ResponseObject:
        return self.builder.response(self.builder.status)

    def _add(self, events) -> None:
        if self.events is not None:
            texts = [event_text(e) for e in events]
            self.events += texts
            if self.failure is None:
                chars = sum(map(len, texts))
                self.chars += chars
                self.on_grow(self, chars)
        self.grew.set()
        self.grew = asyncio.Event()

    def stop(self, reason: str) -> None:
        """End it ``failed`` for ``reason`` (its task cancelled: it ends at its next step)."""
        if self.failure is None:
            self.failure = reason
            self.task.cancel()

    async def drive(self, events: AsyncIterator) -> None:
        """Write down ``events`` (``responses.response_events`` of its run) as they come; an error event is
        followed by ``response.failed``. A cancel (``task.cancel``) stops it where it is."""
        self.began = True
        try:
            async for event in events:
                self._add([event])
                if isinstance(event, ErrorEvent):
                    self._add(self.builder.fail(event.message))
        except asyncio.CancelledError:
            pass

    async def follow(self, after: int | None) -> AsyncIterator[str]:
        """The stream text of its events after the one numbered ``after`` (None: all), as they come, until the
        last."""
        i = first_after(after)
        while True:
            grew = self.grew
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.ended:
                return
            await grew.wait()
