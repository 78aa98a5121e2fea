"""The FastAPI application: routes, the request guard (API key, body size) and the engine's lifetime.

``build_app(llm, ...)`` wires an ``LLM`` (model + engine) to HTTP:

=====================  =====================================================
``GET /health``        200 while the engine runs, 503 after it failed
``GET /v1/models``     the one served model
``POST /v1/completions``        see ``completions.py``
``POST /v1/chat/completions``   see ``completions.py``
``GET /metrics``       Prometheus text (see ``metrics.py``)
``GET /openapi.json``  the OpenAPI document, ``GET /docs`` its Swagger UI page
``GET /kv``            the live KV cache page (``static/kv.html``, see ``kv_view.py``)
``GET /kv/snapshot``   its data: the latest KV snapshot (unless ``?have=`` it) and the events after ``?since=``
=====================  =====================================================

Each route declares its response models and error statuses, and each body
the server sends is built from those models, so the published document
(``openapi.py``) is what the server does.

Bodies are parsed here rather than by FastAPI so that every failure — bytes
that are not UTF-8, malformed JSON, a JSON array instead of an object, wrong
field types, nesting deeper than ``MAX_JSON_DEPTH``, an integer longer than
``MAX_JSON_INT_DIGITS`` digits, a number past a double's range — gets its own
message in OpenAI's error shape with status 400, and the connection stays open
for the client's next request.
The guard is plain ASGI (no ``BaseHTTPMiddleware``), so streaming responses
and disconnect detection pass through untouched. Besides the API key and the
body size it refuses a POST whose ``Content-Type`` is not JSON (415: a web page
can post ``text/plain`` to any address without asking, but not JSON), and,
when no API key is set, a ``Host`` header that does not name the bind address
(a page whose name was re-bound to 127.0.0.1 must not read the answers).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import re
import time
from importlib.metadata import PackageNotFoundError, version
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from paged.serve.async_engine import AsyncEngine, describe
from paged.serve.completions import OpenAIServing
from paged.serve.errors import APIError, from_validation_error, install_handlers
from paged.serve.kv_view import KVView, page
from paged.serve.metrics import ServerMetrics
from paged.serve.openapi import error_responses, event_stream, request_body
from paged.serve.openapi import install as install_openapi
from paged.serve import tokenize
from paged.serve.protocol import EXPECTED, LIST_BOUNDS, ChatCompletionRequest, CompletionRequest
from paged.serve.responses import (ChatCompletionChunk, ChatCompletionResponse, CompletionChunk, CompletionResponse,
                                   Health, Index, ModelCard, ModelList)

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
try:
    __version__ = version("paged")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0"
# the API, the tokenizer routes (/tokenize covers /tokenizer_info) and the KV data; /kv (a page with no data) stays open
GUARDED_PREFIXES = ("/v1", "/kv/", "/tokenize", "/detokenize")
MAX_JSON_DEPTH = 64  # nested arrays / objects in a body (a JSON schema needs a dozen)
MAX_JSON_INT_DIGITS = 40  # far past every field's bound (2**64 has 20), far below Python's 4 300-digit limit
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
WILDCARD_HOSTS = {"0.0.0.0", "::", ""}


def host_allowed(host_header: str, bind_host: str) -> bool:
    """Whether a request's ``Host`` names the address the server was bound to.

    Bound to a loopback address: ``localhost``, ``127.0.0.1`` or ``[::1]``; to a
    wildcard (``0.0.0.0``): any IP literal or ``localhost``; to another address
    or name: that one. A DNS-rebinding page always sends its own host name, so
    it is refused in every case. The port is not compared.
    """
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8000
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    bind = bind_host.strip("[]").lower()
    if bind in WILDCARD_HOSTS:
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return host == "localhost"
    if bind in LOOPBACK_NAMES or bind.startswith("127."):
        return host in LOOPBACK_NAMES or host == bind
    return host == bind


def is_json(content_type: bytes) -> bool:
    """``application/json`` (any parameters, e.g. ``; charset=utf-8``) or a ``+json`` type."""
    media = content_type.split(b";")[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class Guard:
    """ASGI middleware: Bearer API key on ``GUARDED_PREFIXES`` (constant-time compare) and a body size limit.

    Args:
        app: the ASGI app behind the guard.
        api_key: the key clients must send, or None for no check.
        max_body_bytes: larger bodies get 413 without being read further.
        bind_host: the address the server listens on; without an API key, a ``Host``
            header that does not name it gets 421 (``host_allowed``). None: no check.
    """

    def __init__(self, app, api_key: str | None, max_body_bytes: int, bind_host: str | None = None) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.bind_host = bind_host

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.api_key is None and self.bind_host is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            if not host_allowed(host, self.bind_host):
                err = APIError(f"Host {host!r} does not name this server ({self.bind_host}); without an API key "
                               "the server answers only requests addressed to the address it listens on",
                               421, code="misdirected_request")
                return await err.response()(scope, receive, send)
        if self.api_key is not None and scope["path"].startswith(GUARDED_PREFIXES):
            auth = headers.get(b"authorization", b"")
            given = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
            if not hmac.compare_digest(given, self.api_key):
                why = "wrong API key" if given else "missing API key"
                err = APIError(f"{why}: send the header 'Authorization: Bearer <key>' with the key the "
                               "server was started with (--api-key or PAGED_API_KEY)", 401, code="invalid_api_key")
                return await err.response(headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        too_big = APIError(f"request body is larger than the limit of {limit} bytes (--max-request-bytes)",
                           413, code="request_too_large")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await too_big.response()(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        content_type = headers.get(b"content-type")
        if content_type is not None and not is_json(content_type):
            err = APIError(f"Content-Type {content_type.decode('latin-1')!r} is not accepted: send the body as "
                           "JSON with 'Content-Type: application/json'", 415, code="unsupported_media_type")
            return await err.response()(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await too_big.response()(scope, receive, send)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return await self.app(scope, replay, send)


async def parse_body(raw: Request, model_cls):
    """The body as ``model_cls``, or an ``APIError`` that says exactly what is wrong with it."""
    body = await raw.body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(f"request body is not valid UTF-8: byte 0x{body[e.start]:02x} at offset {e.start}",
                       code="invalid_encoding") from None
    if not text.strip():
        raise APIError("request body is empty: send a JSON object", code="invalid_json")
    try:
        data = json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
    except _BadNumber as e:
        e = _name_the_field(e, text)
        raise APIError(f"{e.field or 'request'}: {e}", param=e.field, code="invalid_value") from None
    except json.JSONDecodeError as e:
        raise APIError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}", code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(data, dict):
        raise APIError(f"request body must be a JSON object, got a JSON {type(data).__name__}", code="invalid_json")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise _too_deep()
    for field, bound in LIST_BOUNDS.items():  # before the per-item validation a long list would cost
        value = data.get(field)
        if isinstance(value, (list, dict)) and len(value) > bound:
            raise APIError(f"{field} has {len(value)} entries; at most {bound} are allowed", param=field,
                           code="invalid_value")
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError("request body holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff), "
                       "which is not valid Unicode text", code="invalid_encoding") from None
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, EXPECTED) from None


class _BadNumber(ValueError):
    """A number the body parser refuses; ``field`` is filled in from the text around it."""

    field: str | None = None


_KEY = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:')


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise _BadNumber(f"an integer of {len(text.lstrip('-'))} digits; at most {MAX_JSON_INT_DIGITS} are accepted "
                         "(no field takes a larger one)", text)
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(f"the number {text[:40]} is beyond a double's range (about 1.8e308)", text)
    return value


def _name_the_field(err: _BadNumber, body: str) -> _BadNumber:
    """The key nearest before the refused number (``seed``; ``stop_token_ids`` for one inside its list)."""
    at = body.find(err.args[1])
    keys = _KEY.findall(body, max(0, at - 4096), max(at, 0))
    err.field = keys[-1] if at >= 0 and keys else None
    err.args = err.args[:1]
    return err


def _no_constant(name: str):
    raise APIError(f"{name} is not JSON (JSON has no NaN or Infinity)", code="invalid_json")


def _too_deep() -> APIError:
    return APIError(f"the body nests arrays and objects more than {MAX_JSON_DEPTH} deep", code="invalid_json")


def json_depth(data) -> int:
    """The deepest nesting of lists and dicts in ``data`` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)
                             if isinstance(child, (dict, list)))
    return deepest


def build_app(llm, served_model_name: str, api_key: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, on_engine_failure=None,
              bind_host: str | None = None) -> Guard:
    """The ASGI app serving ``llm`` (an ``LLM``: ``.engine``, ``.tokenizer``, ``.model``).

    ``on_engine_failure(exc)`` runs on the event loop after the engine failed and every in-flight
    request got its error (``python -m paged.serve`` stops the server then); without it the app stays
    up and answers 503.
    """
    engine = AsyncEngine(llm.engine, on_dead=on_engine_failure)
    device = llm.engine.kv_cache.data.device.type if hasattr(llm.engine, "kv_cache") else "cpu"
    metrics = ServerMetrics(lambda: engine.stats, device)
    kv_view = KVView(llm.engine)  # its first snapshot is taken here, before the engine thread starts
    llm.engine.add_observer(kv_view.observe)
    engine.idle_observers.append(kv_view.refresh)
    serving = OpenAIServing(engine, llm.tokenizer, llm.model, served_model_name,
                            llm.engine.max_model_len, metrics)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="paged", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, description="OpenAI-compatible completions and chat over paged's engine.")
    app.state.engine = engine
    install_handlers(app)
    install_openapi(app, [CompletionRequest, ChatCompletionRequest, *tokenize.REQUEST_MODELS],
                    [CompletionChunk, ChatCompletionChunk],
                    api_key=api_key is not None)

    @app.get("/health", tags=["server"], summary="Is the engine running?",
             responses=error_responses(_503="the engine failed; the message says how"))
    async def health() -> Health:
        if engine.dead is not None:
            raise APIError(f"the engine failed: {describe(engine.dead)}", 503)
        return Health()

    def model_card() -> ModelCard:
        return ModelCard(id=served_model_name, created=created, owned_by="paged", root=str(llm.model.path),
                         max_model_len=llm.engine.max_model_len)

    @app.get("/v1/models", tags=["OpenAI API"], summary="The served model", responses=error_responses(401))
    async def models() -> ModelList:
        return ModelList(data=[model_card()])

    @app.get("/v1/models/{model:path}", tags=["OpenAI API"], summary="One model, by name",
             responses=error_responses(401, _404="no model of that name"))
    async def model(model: str) -> ModelCard:
        serving._check_model(model)
        return model_card()

    def generation(request_model, response_model, chunk_model) -> dict:
        """The route options of a generation endpoint: its body, its answers (JSON or a stream), its errors."""
        return {"openapi_extra": request_body(request_model), "response_model": None, "tags": ["OpenAI API"],
                "responses": {200: {"model": response_model, "content": event_stream(chunk_model),
                                    "description": "the completion; with stream: true, server-sent events"},
                              **error_responses(400, 401, 413, 415, 421, 500, _404="the model named is not served here",
                                                _503="the engine failed; the server takes no more requests")}}

    @app.post("/v1/completions", summary="Complete prompts",
              **generation(CompletionRequest, CompletionResponse, CompletionChunk))
    async def completions(raw: Request):
        return await serving.completions(await parse_body(raw, CompletionRequest), raw)

    @app.post("/v1/chat/completions", summary="Answer a conversation",
              **generation(ChatCompletionRequest, ChatCompletionResponse, ChatCompletionChunk))
    async def chat_completions(raw: Request):
        return await serving.chat_completions(await parse_body(raw, ChatCompletionRequest), raw)

    @app.get("/metrics", tags=["server"], summary="Prometheus metrics", response_class=PlainTextResponse,
             responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                              "description": "Prometheus text exposition format"}})
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    tokenize.install(app, serving, llm.model, parse_body)  # /tokenize, /detokenize, /tokenizer_info (vLLM's)

    # the live KV view is for people watching the server, not part of the OpenAI API: not in the document
    @app.get("/kv", include_in_schema=False)
    async def kv_page():
        return HTMLResponse(page())

    @app.get("/kv/snapshot", include_in_schema=False)
    async def kv_snapshot(since: int = 0, have: int = 0):
        return Response(kv_view.read(since, have), media_type="application/json")

    @app.get("/", tags=["server"], summary="What this server serves")
    async def root() -> Index:
        return Index(name="paged", model=served_model_name,
                     endpoints=["/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                                "/tokenizer_info", "/health", "/metrics",
                                "/openapi.json", "/docs", "/kv"])

    guarded = Guard(app, api_key, max_body_bytes, bind_host)
    guarded.fastapi = app
    return guarded
