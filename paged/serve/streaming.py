"""A request answered as server-sent events: one event per step's new text, then ``data: [DONE]``.

Both generation endpoints stream through ``events``; it is handed a ``Run``
(``generation.py``: the request's engine ids, its params, its ``Formatter`` and
the queue its outputs arrive on) and yields the events: chunk models (``sse``
writes each as an event), or, for the largest ones, their event text already
written off the loop. ``/v1/responses`` reads the same chunks and sends its own
events (``responses.py``).

* **Whole characters, no stop string.** Each choice's text goes through a
  ``TextStream`` (``detokenize.py``): a chunk never carries half a UTF-8
  character nor any prefix of a stop string, and on the last step the engine's
  cut text replaces the new tokens' text, so the chunks concatenate to exactly
  the non-streamed text.
* **Reasoning and tool calls.** With a ``ChatParser`` (``chat_output.py``) each
  choice's text goes through it, and a chunk carries what it lets through:
  ``content``, ``reasoning_content``, ``tool_calls`` pieces; the last chunk's
  ``finish_reason`` is ``tool_calls`` when the reply called tools.
* **Chat opens each choice** with an empty ``role: assistant`` delta; ``echo``
  sends the prompt first (with ``logprobs``, once the prompt's logprobs came
  with the first output; those events, the largest a stream sends, are written
  on the offload pool).
* **A failure mid-stream** (the engine, or this request's own grammar) ends the
  stream with an error event: the 200 status went out with the first event.
* **A client that goes away** cancels the generator; its ``finally`` aborts the
  request's engine requests, which frees their blocks before the next step.
"""

from __future__ import annotations

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from paged.serve.detokenize import TextStream
from paged.serve.errors import engine_failure, request_failure
from paged.serve.schemas import CompletionLogprobs

SSE_DONE = "data: [DONE]\n\n"
# Characters that end a line for str.splitlines() (and httpx's line reader) but not for SSE, which
# JSON leaves raw inside strings; escaped, they decode to the same text and keep an event one line.
_SPLITLINES_ONLY = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def sse(event: BaseModel) -> str:
    """One server-sent event carrying ``event`` as JSON, on one line for any line reader."""
    return f"data: {event.model_dump_json().translate(_SPLITLINES_ONLY)}\n\n"


def response(events) -> StreamingResponse:
    """The ``text/event-stream`` answer sending ``events`` (an async iterator of event texts) as they come."""
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def events(run):
    """The events of ``run`` (a ``generation.Run``): chunk models (or event text), until ``SSE_DONE`` or an
    error (an ``ErrorResponse``)."""
    req, fmt, ids, n, finals = run.req, run.fmt, run.ids, run.params.n, {}

    def counts(i: int, index: int):  # continuous_usage_stats: this choice's counts so far, in every chunk
        return (len(ids[i]), sent_tokens[index]) if req.continuous_usage else None

    texts: dict[int, TextStream] = {}
    parsers = {}  # index -> its ChatParser, with run.parse
    sent_tokens: dict[int, int] = {}
    offsets: dict[int, int] = {}
    opened: set[int] = set()  # completions choices whose first chunk (with return_token_ids: the prompt's ids) is out

    def prompt_ids(i: int, index: int) -> list[int] | None:  # return_token_ids: the prompt's, in the first chunk
        if index in opened:
            return None
        opened.add(index)
        return ids[i]

    ended: set[int] = set()  # choices whose last chunk is sent
    echo = run.echo
    # echo with logprobs: the echo chunk waits for the prompt logprobs, which come with the first output
    echo_pending = set(range(len(run.rids))) if echo and run.params.prompt_logprobs is not None else set()
    try:
        for i in range(len(run.rids)):
            for j in range(n):
                index = i * n + j
                texts[index], sent_tokens[index] = TextStream(run.tokenizer, run.params.stop), 0
                if run.parse is not None:
                    parsers[index] = run.parse()
                offsets[index] = len(echo[i]) if echo else 0
                if fmt.kind == "chat":
                    yield fmt.chunk(index, None, role=True, counts=counts(i, index),
                                    prompt_token_ids=ids[i] if index == 0 else None)
                if echo and i not in echo_pending:
                    yield fmt.chunk(index, echo[i], counts=counts(i, index), prompt_token_ids=prompt_ids(i, index))
        pos = {rid: i for i, rid in enumerate(run.rids)}
        while len(finals) < len(run.rids):
            out = await run.outputs.get()
            if isinstance(out, BaseException):
                yield engine_failure(out, 500).event()
                break
            run.timing.observe(out)
            if out.error is not None:
                yield request_failure(out.error, run.rename).event()
                break
            i = pos[out.request_id]
            if i in echo_pending and out.prompt_logprobs is not None:
                echo_pending.discard(i)

                def echo_events(i: int = i, prompt_logprobs=out.prompt_logprobs) -> list[str]:
                    lp = fmt.logprobs(ids[i], prompt_logprobs)
                    return [sse(fmt.chunk(i * n + j, echo[i], lp, counts=counts(i, i * n + j),
                                          prompt_token_ids=prompt_ids(i, i * n + j))) for j in range(n)]
                # the prompt's logprobs, n times: as large as answers get, so written off the loop
                for event in await run.work.run(n * len(ids[i]) * (run.params.prompt_logprobs + 2), echo_events):
                    yield event
            for c in out.outputs:
                index = i * n + c.index
                if index in ended:
                    continue
                if c.finish_reason is None:
                    text = texts[index].feed(c.token_ids)
                else:  # the final text, stop string cut: send its unsent rest (not the new tokens' text)
                    text = texts[index].finish(run.final_text(c))
                    ended.add(index)
                new = c.token_ids[sent_tokens[index]:]
                if not (text or new or c.finish_reason):
                    continue
                entries = c.logprobs[sent_tokens[index]:] if c.logprobs is not None else None
                lp = fmt.logprobs(new, entries, offsets[index])
                sent_tokens[index] = len(c.token_ids)
                offsets[index] += sum(map(fmt.text_length, new)) if isinstance(lp, CompletionLogprobs) else 0
                parsed, reason = None, c.finish_reason
                if index in parsers:
                    parser = parsers[index]
                    parsed = parser.feed(text) if text else None
                    if c.finish_reason is not None:
                        parsed = (parsed + parser.finish()) if parsed is not None else parser.finish()
                        reason = parser.finish_reason(c.finish_reason)
                if (parsed if index in parsers else text) or lp or c.finish_reason or (fmt.token_ids and new):
                    yield fmt.chunk(index, text, lp, reason, counts=counts(i, index), parsed=parsed, token_ids=new,
                                    prompt_token_ids=None if fmt.kind == "chat" else prompt_ids(i, index))
            if out.finished:
                finals[out.request_id] = out
        if req.include_usage and len(finals) == len(run.rids):
            done = sum(len(c.token_ids) for o in finals.values() for c in o.outputs)
            yield fmt.usage_chunk(sum(map(len, ids)), done, sum(o.num_cached_tokens for o in finals.values()))
        yield SSE_DONE
    finally:  # also on cancellation: the client went away mid-stream
        run.abort_unfinished(finals)
