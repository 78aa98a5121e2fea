"""Serving ``/v1/completions`` and ``/v1/chat/completions``: validate, submit, stream or collect.

A request becomes one engine request per prompt (a completions request may
carry several prompts; each has ``n`` choices, numbered ``prompt * n + j`` as
OpenAI does). Everything that can be refused is refused before the engine
sees it — model name (404), prompt and ``max_tokens`` against the context,
sampling bounds, streaming with ranked outputs (400) — and the engine's own
check runs atomically for all prompts of the request.

Streaming sends each step's new text as it is safe to send (whole UTF-8
characters, no possible stop-string prefix; see ``detokenize.py``). A client
that goes away — the stream's task is cancelled, or the disconnect watcher
fires for a non-streamed request — aborts its engine requests, which frees
their blocks before the engine's next step.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from paged import RequestError
from paged.serve.async_engine import EngineDeadError
from paged.serve.chat import ChatRenderer
from paged.serve.detokenize import TextStream
from paged.serve.errors import APIError, from_request_error
from paged.serve.protocol import ChatCompletionRequest, CompletionRequest
from paged.serve.responses import SSE_DONE, CompletionLogprobs, Formatter, json_response


def request_failure(error: BaseException, rename: dict[str, str]) -> APIError:
    """A request that failed while it ran, as its own error: a 400 naming the field when the
    request asked for more than the engine could do (its grammar met a limit), else a 500."""
    if isinstance(error, RequestError):
        return from_request_error(error, rename)
    return APIError(f"this request failed while it ran: {type(error).__name__}: {error}", 500,
                    type="server_error", code="request_failed")


class _Timing:
    """Per-request latency observations for /metrics."""

    def __init__(self, metrics) -> None:
        self.metrics, self.t0 = metrics, time.monotonic()
        self.last: dict[str, float] = {}
        self.tokens: dict[str, int] = {}

    def observe(self, out) -> None:
        rid, now = out.request_id, time.monotonic()
        n = sum(len(c.token_ids) for c in out.outputs)
        if n > self.tokens.get(rid, 0):
            hist = self.metrics.tpot if rid in self.last else self.metrics.ttft
            hist.observe(now - self.last.get(rid, self.t0))
            self.last[rid], self.tokens[rid] = now, n
        if out.finished:
            self.metrics.e2e.observe(now - self.t0)
            for c in out.outputs:
                self.metrics.finished.labels(c.finish_reason or "unknown").inc()


def _final_text(completion, include_stop_str: bool) -> str:
    """The engine's text (cut before the stop string), with the stop string that ended it when asked
    (vLLM's ``include_stop_str_in_output``)."""
    stop = completion.stop_reason if include_stop_str and completion.finish_reason == "stop" else None
    return completion.text + stop if isinstance(stop, str) else completion.text


async def _wait_for_disconnect(raw: Request) -> None:
    while (await raw.receive())["type"] != "http.disconnect":
        pass


class OpenAIServing:
    """The two generation endpoints over one ``AsyncEngine``.

    Args:
        engine: the ``AsyncEngine``.
        tokenizer: the model's ``tokenizers.Tokenizer`` or None.
        model: the ``LoadedModel`` (its chat template and special tokens).
        served_model_name: the name clients must send as ``model``.
        max_model_len: the engine's context length.
        metrics: the ``ServerMetrics``.
    """

    def __init__(self, engine, tokenizer, model, served_model_name: str, max_model_len: int, metrics) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat, self.no_chat = None, None
        if tokenizer is None:
            self.no_chat = "this model has no tokenizer, so chat messages cannot be rendered"
        elif model.chat_template is None:
            self.no_chat = "this model has no chat template, so there is no chat format to render messages in"
        else:
            self.chat = ChatRenderer(tokenizer, model.chat_template, model.special_tokens)
        self.model_name = served_model_name
        self.max_model_len = max_model_len
        self.metrics = metrics

    # -- endpoints ------------------------------------------------------------------
    async def completions(self, req: CompletionRequest, raw: Request) -> Response:
        self._check_model(req.model)
        prompts, ids = [], []
        for p in req.prompts():
            if isinstance(p, str):
                if self.tokenizer is None:
                    raise APIError("this model has no tokenizer.json: send prompt as token ids", param="prompt")
                prompts.append(p)
                ids.append(self.tokenizer.encode(p, add_special_tokens=req.add_special_tokens).ids)
            else:
                prompts.append(None)
                ids.append(p)
        for i, one in enumerate(ids):
            if req.truncate_prompt_tokens is not None and len(one) > req.truncate_prompt_tokens:
                ids[i], prompts[i] = one[-req.truncate_prompt_tokens:], None  # the last ones, as vLLM keeps
        prompt_logprobs = req.logprobs if req.echo else None  # echo with logprobs: the prompt's too
        rename = req.guided_rename()
        params = self._params(req, ids, req.max_tokens, req.logprobs, rename, prompt_logprobs=prompt_logprobs)
        fmt = Formatter("completion", self._response_id("cmpl", req), self.model_name, self.tokenizer, req.logprobs,
                        req.return_tokens_as_token_ids)
        # decoded only once the engine has accepted the ids (an id out of the vocabulary is a 400)
        echo = (lambda: [self._prompt_text(p, i) for p, i in zip(prompts, ids)]) if req.echo else None
        return await self._serve(req, raw, fmt, ids, prompts, params, rename, echo)

    async def chat_completions(self, req: ChatCompletionRequest, raw: Request) -> Response:
        self._check_model(req.model)
        if self.chat is None:
            raise APIError(f"{self.no_chat}; use /v1/completions instead", param="messages",
                           code="chat_template_missing")
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            text, ids = self.chat.encode(messages, req.add_generation_prompt and not req.continue_final_message,
                                         req.continue_final_message, req.add_special_tokens,
                                         self._template_variables(req))
        except ValueError as e:
            raise APIError(str(e), param="messages") from None
        if req.truncate_prompt_tokens is not None and len(ids) > req.truncate_prompt_tokens:
            text, ids = None, ids[-req.truncate_prompt_tokens:]
        # vLLM's chat echo: a reply that continues the last message (same role) starts with that message
        echo = [messages[-1]["content"]] if req.echo and messages[-1]["role"] == "assistant" else None
        max_tokens = req.requested_max_tokens
        if max_tokens is None:  # OpenAI's default for chat: whatever context is left
            max_tokens = max(1, self.max_model_len - len(ids))
        name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        rename = {"prompt": "messages", "logprobs": "top_logprobs", "max_tokens": name,  # engine field -> chat's
                  **req.guided_rename()}
        params = self._params(req, [ids], max_tokens, req.num_logprobs, rename)
        params.stop_token_ids += [t for t in self.chat.end_of_turn_ids if t not in params.stop_token_ids]
        fmt = Formatter("chat", self._response_id("chatcmpl", req), self.model_name, self.tokenizer,
                        req.num_logprobs, req.return_tokens_as_token_ids)
        return await self._serve(req, raw, fmt, [ids], [text], params, rename, echo)

    @staticmethod
    def _response_id(prefix: str, req) -> str:
        """``cmpl-<request_id>`` when the client named its request (vLLM's ``request_id``), else a fresh uuid."""
        return f"{prefix}-{req.request_id or uuid.uuid4().hex}"

    @staticmethod
    def _template_variables(req: ChatCompletionRequest) -> dict:
        """``chat_template_kwargs`` and ``documents``: extra variables the chat template may read."""
        variables = dict(req.chat_template_kwargs or {})
        if req.documents is not None:
            variables["documents"] = req.documents
        return variables

    # -- checks -----------------------------------------------------------------------
    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(f"model {model!r} does not exist; this server serves {self.model_name!r} "
                           "(GET /v1/models)", 404, param="model", code="model_not_found")

    def _params(self, req, ids, max_tokens, logprobs, rename, prompt_logprobs=None):
        """The request's ``SamplingParams``; ``rename`` maps engine field names to this endpoint's."""
        prompt_param = rename.get("prompt", "prompt")
        max_tokens_name = rename.get("max_tokens", "max_tokens")
        longest = max(len(i) for i in ids)
        if longest >= self.max_model_len:
            raise APIError(f"the prompt has {longest} tokens; this model's context is {self.max_model_len} "
                           f"tokens (max_model_len), so a prompt may have at most {self.max_model_len - 1}",
                           param=prompt_param, code="context_length_exceeded")
        if isinstance(max_tokens, int) and max_tokens > self.max_model_len - longest:
            raise APIError(f"{max_tokens_name} must be <= {self.max_model_len - longest} for this prompt "
                           f"({longest} prompt tokens + {max_tokens} > max_model_len {self.max_model_len}), "
                           f"got {max_tokens}", param=max_tokens_name, code="context_length_exceeded")
        try:
            params = req.sampling_params(max_tokens, logprobs, prompt_logprobs)
        except RequestError as e:
            raise from_request_error(e, rename) from None
        if req.stream and (params.use_beam_search or params.best_of > params.n):
            raise APIError("stream cannot be used with use_beam_search or best_of > n: the returned "
                           "sequences are only known when all have finished", param="stream")
        return params

    def _prompt_text(self, prompt: str | None, ids: list[int]) -> str:
        if prompt is not None:
            return prompt
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer else ""

    # -- run ------------------------------------------------------------------------
    async def _serve(self, req, raw, fmt, ids, prompts, params, rename, echo) -> Response:
        # engine ids stay unique even when two clients send the same request_id
        tag = f"{fmt.id}-{uuid.uuid4().hex[:8]}" if req.request_id else fmt.id
        rids = [f"{tag}-{i}" for i in range(len(ids))]
        try:
            stream = await self.engine.add(list(zip(rids, ids, [params] * len(ids), prompts)))
        except RequestError as e:
            raise from_request_error(e, rename) from None
        except EngineDeadError as e:
            raise APIError(str(e), 503) from None
        if callable(echo):
            echo = echo()
        timing = _Timing(self.metrics)
        if req.stream:
            gen = self._stream(stream, rids, ids, params, fmt, timing, echo, req, rename)
            return StreamingResponse(gen, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        finals = await self._collect(stream, rids, raw, timing, rename)
        if finals is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        choices, completion_tokens = [], 0
        for i, rid in enumerate(rids):
            prompt_lp = finals[rid].prompt_logprobs
            echoed = (ids[i], prompt_lp) if echo and prompt_lp is not None else None
            for c in finals[rid].outputs:
                text = (echo[i] if echo else "") + _final_text(c, req.include_stop_str_in_output)
                choices.append(fmt.choice(i * params.n + c.index, text, c, echoed))
                completion_tokens += len(c.token_ids)
        return json_response(fmt.response(choices, sum(map(len, ids)), completion_tokens))

    async def _collect(self, stream, rids, raw, timing, rename):
        """Wait for every request's final output; None if the client disconnected (requests aborted)."""
        finals: dict = {}
        watcher = asyncio.ensure_future(_wait_for_disconnect(raw))
        try:
            while len(finals) < len(rids):
                get = asyncio.ensure_future(stream.get())
                done, _ = await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    return None
                out = get.result()
                if isinstance(out, BaseException):
                    raise APIError(f"the engine failed: {out}", 503)
                timing.observe(out)
                if out.error is not None:  # the other prompts of this request end with it (aborted)
                    raise request_failure(out.error, rename)
                if out.finished:
                    finals[out.request_id] = out
            return finals
        finally:
            watcher.cancel()
            self._abort_unfinished(rids, finals)

    def _abort_unfinished(self, rids, finals) -> None:
        gone = [r for r in rids if r not in finals]
        if gone:
            self.engine.abort(gone)
            self.metrics.finished.labels("abort").inc(len(gone))

    async def _stream(self, stream, rids, ids, params, fmt, timing, echo, req, rename):
        n, finals = params.n, {}

        def counts(i: int, index: int):  # continuous_usage_stats: this choice's counts so far, in every chunk
            return (len(ids[i]), sent_tokens[index]) if req.continuous_usage else None

        texts: dict[int, TextStream] = {}
        sent_tokens: dict[int, int] = {}
        offsets: dict[int, int] = {}
        ended: set[int] = set()  # choices whose last chunk is sent
        # echo with logprobs: the echo chunk waits for the prompt logprobs, which come with the first output
        echo_pending = set(range(len(rids))) if echo and params.prompt_logprobs is not None else set()
        try:
            for i in range(len(rids)):
                for j in range(n):
                    index = i * n + j
                    texts[index], sent_tokens[index] = TextStream(self.tokenizer, params.stop), 0
                    offsets[index] = len(echo[i]) if echo else 0
                    if fmt.kind == "chat":
                        yield fmt.chunk(index, None, role=True, counts=counts(i, index))
                    if echo and i not in echo_pending:
                        yield fmt.chunk(index, echo[i], counts=counts(i, index))
            pos = {rid: i for i, rid in enumerate(rids)}
            while len(finals) < len(rids):
                out = await stream.get()
                if isinstance(out, BaseException):
                    yield fmt.error_chunk(f"the engine failed: {out}")
                    break
                timing.observe(out)
                if out.error is not None:
                    e = request_failure(out.error, rename)
                    yield fmt.error_chunk(e.message, e.type, e.param, e.code)
                    break
                i = pos[out.request_id]
                if i in echo_pending and out.prompt_logprobs is not None:
                    echo_pending.discard(i)
                    lp = fmt.logprobs(ids[i], out.prompt_logprobs)
                    for j in range(n):
                        yield fmt.chunk(i * n + j, echo[i], lp, counts=counts(i, i * n + j))
                for c in out.outputs:
                    index = i * n + c.index
                    if index in ended:
                        continue
                    if c.finish_reason is None:
                        text = texts[index].feed(c.token_ids)
                    else:  # the final text, stop string cut: send its unsent rest (not the new tokens' text)
                        text = texts[index].finish(_final_text(c, req.include_stop_str_in_output))
                        ended.add(index)
                    new = c.token_ids[sent_tokens[index]:]
                    if not (text or new or c.finish_reason):
                        continue
                    entries = c.logprobs[sent_tokens[index]:] if c.logprobs is not None else None
                    lp = fmt.logprobs(new, entries, offsets[index])
                    sent_tokens[index] = len(c.token_ids)
                    offsets[index] += sum(map(fmt.text_length, new)) if isinstance(lp, CompletionLogprobs) else 0
                    if text or lp or c.finish_reason:
                        yield fmt.chunk(index, text, lp, c.finish_reason, counts=counts(i, index))
                if out.finished:
                    finals[out.request_id] = out
            if req.include_usage and len(finals) == len(rids):
                done = sum(len(c.token_ids) for o in finals.values() for c in o.outputs)
                yield fmt.usage_chunk(sum(map(len, ids)), done)
            yield SSE_DONE
        finally:  # also on cancellation: the client went away mid-stream
            self._abort_unfinished(rids, finals)
