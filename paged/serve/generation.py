"""What ``/v1/completions`` and ``/v1/chat/completions`` share once a request is prompt token ids.

An endpoint (``completions.py``, ``chat.py``) turns its body into prompt token
ids and hands them to ``Generator.run``; from there the path is the same, in
this order:

1. ``Generator.params`` — the checks only the server can make (the prompt and
   ``max_tokens`` against the context, streaming with ranked outputs) and the
   engine's ``SamplingParams``, whose own errors name the endpoint's field;
2. submit one engine request per prompt (atomically: the engine's check runs
   for all of them before any is queued), then
3. stream (``streaming.py``) or collect every final output and answer one JSON
   body, built by the request's ``Formatter`` (``formatter.py``).

A request may carry several prompts (completions); each has ``n`` choices,
numbered ``prompt * n + j`` as OpenAI does. A client that goes away — the
stream's task is cancelled, or the disconnect watcher fires for a non-streamed
request — aborts its engine requests, which frees their blocks before the
engine's next step.

**Bounded answers.** What a request may ask back is bounded before anything
runs: ``response_entries`` counts the token entries its answer could hold —
each returned token, and with ``logprobs`` each of its alternatives — over
every prompt and choice, echoed prompts included, and more than
``MAX_RESPONSE_ENTRIES`` is a 400 naming the field that multiplies most. A
grammar is built, and a large answer's JSON is written, on the offload pool
(``offload.py``), not on the event loop.

**Engine ids are the server's.** Each engine request is ``cmpl-<uuid>-<i>``
(``chatcmpl-...``; a Responses request's ``resp_<uuid>-0``, its response's id),
whatever the client sent as ``request_id``: engine ids are
what the server logs and the operator's KV view lists, and a string one client
chose must not reach them. The response's ``id`` still carries the client's.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

from paged import RequestError
from paged.serve import streaming
from paged.serve.async_engine import EngineDeadError, StoppingError
from paged.serve.connections import client_key
from paged.serve.errors import APIError, engine_failure, from_request_error, request_failure, stopping_error
from paged.serve.formatter import Formatter
from paged.serve.metrics import RequestTimer
from paged.serve.offload import INLINE_MAX

# Token entries one request's answer may hold: each returned token is one, and with logprobs each of
# its k + 1 alternatives is one more (about 35 bytes of JSON each). 2**18 is a 9 MB answer, written
# in well under a second; lm-eval's scoring (echo, logprobs 1) fits 40 prompts of 2 048 tokens in it.
MAX_RESPONSE_ENTRIES = 2**18


def params_max_logprobs() -> int:
    """The engine's own bound on logprobs (past it, ``SamplingParams`` refuses with its message)."""
    from paged import SamplingParams

    return SamplingParams.MAX_LOGPROBS


def response_entries(prompt_lengths: list[int], n: int, max_tokens: int, logprobs: int | None, echo: bool,
                     prompt_logprobs: int | None = None) -> int:
    """The most token entries an answer can hold: per prompt, ``n`` choices of ``max_tokens`` tokens (plus the
    prompt's own when it is echoed), each token one entry and, with ``logprobs``, ``logprobs + 1`` more; with
    vLLM's ``prompt_logprobs``, ``prompt_logprobs + 1`` per prompt token in each choice."""
    per_token = 1 + (logprobs + 1 if logprobs is not None else 0)
    per_prompt_token = prompt_logprobs + 1 if prompt_logprobs is not None else 0
    return sum(n * ((max_tokens + (length if echo else 0)) * per_token + length * per_prompt_token)
               for length in prompt_lengths)


@dataclass
class Run:
    """One HTTP request's engine requests, from submission to their last outputs.

    ``ids`` are the prompts' token ids, ``rids`` their engine request ids (one per
    prompt), ``outputs`` the queue their outputs arrive on, ``echo`` the prompts'
    texts when the client asked for them back. ``rename`` maps engine field
    names to this endpoint's (``prompt`` -> ``messages`` for chat).
    """

    req: object
    fmt: object
    rids: list[str]
    ids: list[list[int]]
    params: object
    rename: dict[str, str]
    echo: list[str] | None
    outputs: asyncio.Queue
    timing: RequestTimer
    tokenizer: object
    engine: object
    metrics: object
    work: object  # the ``Offload`` pool, for building large chunks
    entries: int  # the most token entries the answer can hold (``response_entries``)
    parse: object = None  # a factory of per-choice ``chat_output.ChatParser`` s, or None: text is content

    def final_text(self, completion) -> str:
        """The engine's text (cut before the stop string), with the stop string that ended it when asked
        (vLLM's ``include_stop_str_in_output``)."""
        include = self.req.include_stop_str_in_output and completion.finish_reason == "stop"
        stop = completion.stop_reason if include else None
        return completion.text + stop if isinstance(stop, str) else completion.text

    def abort_unfinished(self, finals: dict) -> None:
        """Abort the engine requests with no final output yet (the client went away, or one failed)."""
        gone = [r for r in self.rids if r not in finals]
        if gone:
            self.engine.abort(gone)
            self.metrics.finished("abort", len(gone))


def client_address(raw: Request) -> str:
    """Who asks, for the fair order's shares: the peer's IP address, an IPv6 one as its /64
    (``connections.client_key``; behind a proxy on this machine that sends ``X-Forwarded-For``, uvicorn
    puts the forwarded address there); ``""`` where there is none."""
    return client_key(raw.client.host) if raw.client else ""


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


class Generator:
    """Submits a request's prompts to the ``AsyncEngine`` and answers with the stream or the whole response.

    Args:
        engine: the ``AsyncEngine``.
        served: the ``ServedModel`` (its tokenizer and context length).
        metrics: the ``ServerMetrics``.
    """

    def __init__(self, engine, served, metrics) -> None:
        self.engine = engine
        self.served = served
        self.metrics = metrics
        self.work = served.work

    def check_context(self, ids, max_tokens, rename) -> None:
        """Each prompt, and ``max_tokens`` after it, must fit the model's context."""
        max_model_len = self.served.max_model_len
        prompt_param = rename.get("prompt", "prompt")
        max_tokens_name = rename.get("max_tokens", "max_tokens")
        longest = max(len(i) for i in ids)
        if longest >= max_model_len:
            raise APIError(f"the prompt has {longest} tokens; this model's context is {max_model_len} "
                           f"tokens (max_model_len), so a prompt may have at most {max_model_len - 1}",
                           param=prompt_param, code="context_length_exceeded")
        if isinstance(max_tokens, int) and max_tokens > max_model_len - longest:
            raise APIError(f"{max_tokens_name} must be <= {max_model_len - longest} for this prompt "
                           f"({longest} prompt tokens + {max_tokens} > max_model_len {max_model_len}), "
                           f"got {max_tokens}", param=max_tokens_name, code="context_length_exceeded")

    def check_answer_size(self, req, ids, max_tokens, logprobs, rename, echo: bool) -> int:
        """The most token entries the answer can hold (``response_entries``); more than
        ``MAX_RESPONSE_ENTRIES`` is a 400 naming the field that multiplies most."""
        longest = max(len(i) for i in ids)
        most_tokens = max_tokens if isinstance(max_tokens, int) else self.served.max_model_len - longest
        prompt_top = req.prompt_logprobs
        entries = response_entries([len(i) for i in ids], req.n, most_tokens, logprobs, echo, prompt_top)
        if entries <= MAX_RESPONSE_ENTRIES:
            return entries
        max_tokens_name = rename.get("max_tokens", "max_tokens")
        logprobs_name = rename.get("logprobs", "logprobs")
        per_token = f" x (1 + {logprobs_name} {logprobs} + 1)" if logprobs is not None else ""
        prompt_part = f", + the prompt x (prompt_logprobs {prompt_top} + 1)" if prompt_top is not None else ""
        param = logprobs_name if logprobs else "prompt_logprobs" if prompt_top else "n" if req.n > 1 else \
            "echo" if echo else max_tokens_name
        raise APIError(f"{param}: this request's answer could hold {entries} token entries ({len(ids)} prompt(s) "
                       f"x n {req.n} x ({max_tokens_name} {most_tokens}{' + the echoed prompt' if echo else ''})"
                       f"{per_token}{prompt_part}); at most {MAX_RESPONSE_ENTRIES} are allowed: ask for fewer choices, "
                       "logprobs or tokens, or send the prompts in several requests", param=param,
                       code="response_too_large")

    def params(self, req, ids, max_tokens, logprobs, rename, prompt_logprobs=None):
        """The request's ``SamplingParams``; ``rename`` maps engine field names to this endpoint's."""
        most = self.served.options.max_logprobs
        for asked, field in ((logprobs, "logprobs"), (req.prompt_logprobs, "prompt_logprobs"),
                             (prompt_logprobs, "logprobs")):
            if asked is not None and most < asked <= params_max_logprobs():
                name = rename.get(field, field)
                raise APIError(f"{name} must be <= {most} on this server (--max-logprobs), got {asked}",
                               param=name, code="invalid_value")
        try:
            params = req.sampling_params(max_tokens, logprobs, prompt_logprobs, self.served.options.sampling_defaults)
        except RequestError as e:
            raise from_request_error(e, rename) from None
        if req.stream and (params.use_beam_search or params.best_of > params.n):
            raise APIError("stream cannot be used with use_beam_search or best_of > n: the returned "
                           "sequences are only known when all have finished", param="stream")
        return params

    async def run(self, req, raw: Request, kind: str, ids: list[list[int]], prompts: list[str | None],
                  max_tokens: int | None, logprobs: int | None, rename: dict[str, str],
                  prompt_logprobs: int | None = None, echo=None, stop_token_ids=(), parse=None) -> Response:
        """Check, submit ``ids`` (one engine request each) and answer: the event stream, or the whole response.

        Args:
            req: the parsed request (its sampling fields, ``stream``, ``request_id``...).
            raw: the HTTP request (to notice a client that goes away).
            kind: ``"completion"`` or ``"chat"``: the shape of the answer.
            ids: each prompt's token ids; ``prompts`` their texts where the client sent text.
            max_tokens, logprobs, prompt_logprobs: as the engine names them, already read from the
                endpoint's own fields; ``rename`` maps engine field names back to those fields.
            echo: None, the prompts' texts, or an async callable giving them, called once the engine has
                accepted the ids (an id outside the vocabulary is a 400 before anything is decoded).
            stop_token_ids: more tokens that end a reply (chat: the template's end of turn).
            parse: chat: a factory of per-choice ``ChatParser`` s (reasoning, tool calls), or None.
        """
        run = await self.start(req, kind, ids, prompts, max_tokens, logprobs, rename, prompt_logprobs, echo,
                               stop_token_ids, parse, client=client_address(raw))
        if req.stream:
            return streaming.response(streaming.sse(event) if not isinstance(event, str) else event
                                      async for event in streaming.events(run))
        finals = await self.collect(run, raw)
        if finals is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        body = await self.work.run(run.entries, lambda: self.whole_response(run, finals).model_dump_json())
        return Response(body, media_type="application/json")

    async def start(self, req, kind: str, ids: list[list[int]], prompts: list[str | None], max_tokens: int | None,
                    logprobs: int | None, rename: dict[str, str], prompt_logprobs: int | None = None, echo=None,
                    stop_token_ids=(), parse=None, tag: str | None = None, client: str = "") -> Run:
        """Check and submit ``ids`` (as ``run``); the ``Run`` whose outputs then arrive. ``tag``: the engine
        ids' stem, when the server already named the answer (a Responses request: its ``resp_...`` id);
        ``client``: who asks (``client_address``), whom a fair order shares the device between; each engine
        request also carries ``req.priority`` (the engine refuses one other than 0 unless its order ranks by it)."""
        self.check_context(ids, max_tokens, rename)
        entries = self.check_answer_size(req, ids, max_tokens, logprobs, rename, echo is not None)
        # a grammar is compiled while the params are built: off the loop (and a long allowed_token_ids checked)
        weight = INLINE_MAX if req.wants_grammar else len(req.allowed_token_ids or ())
        params = await self.work.run(weight, self.params, req, ids, max_tokens,
                                     logprobs, rename, prompt_logprobs)
        params.stop_token_ids += [t for t in stop_token_ids if t not in params.stop_token_ids]
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        tag = tag or f"{prefix}-{uuid.uuid4().hex}"  # the engine's ids: the server's own (the module's docstring)
        fmt = Formatter(kind, f"{prefix}-{req.request_id}" if req.request_id else tag, self.served.name,
                        self.served.tokenizer, logprobs, req.return_tokens_as_token_ids, req.prompt_logprobs,
                        req.return_token_ids)
        rids = [f"{tag}-{i}" for i in range(len(ids))]
        try:
            outputs = await self.engine.add([(rid, one, params, prompt, client, req.priority)
                                             for rid, one, prompt in zip(rids, ids, prompts)])
        except RequestError as e:
            raise from_request_error(e, rename) from None
        except EngineDeadError as e:
            raise APIError(str(e), 503) from None
        except StoppingError as e:
            raise stopping_error(str(e)) from None
        return Run(req, fmt, rids, ids, params, rename, await echo() if callable(echo) else echo, outputs,
                   RequestTimer(self.metrics, params), self.served.tokenizer, self.engine, self.metrics, self.work, entries, parse)

    async def collect(self, run: Run, raw: Request) -> dict | None:
        """Wait for every request's final output; None if the client disconnected (requests aborted)."""
        finals: dict = {}
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
        try:
            while len(finals) < len(run.rids):
                get = asyncio.ensure_future(run.outputs.get())
                done, _ = await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    return None
                out = get.result()
                if isinstance(out, BaseException):
                    raise engine_failure(out)
                run.timing.observe(out)
                if out.error is not None:  # the other prompts of this request end with it (aborted)
                    raise request_failure(out.error, run.rename)
                if out.finished:
                    finals[out.request_id] = out
            return finals
        finally:
            watcher.cancel()
            run.abort_unfinished(finals)

    @staticmethod
    def whole_response(run: Run, finals: dict):
        """The response model of a non-streamed request: every choice of every prompt, and the usage."""
        choices, completion_tokens, asked = [], 0, None
        for i, rid in enumerate(run.rids):
            prompt_lp = finals[rid].prompt_logprobs
            echoed = (run.ids[i], prompt_lp) if run.echo and prompt_lp is not None else None
            if run.fmt.num_prompt_logprobs is not None:  # vLLM's prompt_logprobs
                asked = run.fmt.prompt_logprobs(run.ids[i], prompt_lp)
            for c in finals[rid].outputs:
                echo, text = (run.echo[i] if run.echo else ""), run.final_text(c)
                message = reason = None
                if run.parse is not None:
                    parser = run.parse()
                    message, reason = parser.whole(text), parser.finish_reason(c.finish_reason)
                    if echo:
                        message.content = echo + (message.content or "")
                choices.append(run.fmt.choice(i * run.params.n + c.index, echo + text, c, echoed, message, reason,
                                              asked if run.fmt.kind == "completion" else None, run.ids[i]))
                completion_tokens += len(c.token_ids)
        return run.fmt.response(choices, sum(map(len, run.ids)), completion_tokens, cached_tokens(finals),
                                asked if run.fmt.kind == "chat" else None, run.ids[0])


def cached_tokens(finals: dict) -> int:
    """Prompt tokens the prefix cache held, over a request's prompts (each prompt counted once, not per choice)."""
    return sum(out.num_cached_tokens for out in finals.values())
