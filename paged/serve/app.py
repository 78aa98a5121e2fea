"""``build_app``: the pieces of the server, built once and wired to their routes, behind the guard.

``build_app(llm, ...)`` wires an ``LLM`` (model + engine) to HTTP. Each route
lives with its endpoint; this module only builds what they share and installs
them:

=========================================  ======================================================
``POST /v1/completions``                   ``completions.py``
``POST /v1/chat/completions``              ``chat.py``
``POST /v1/responses``, ``GET /v1/...``    ``responses.py`` (OpenAI's Responses API, over the chat path;
                                           ``response_store.py``: what it keeps, background ones)
``GET /v1/models``, ``/v1/models/{name}``  ``models.py``
``POST /tokenize``, ``/detokenize``,       ``tokenize.py``
``GET /tokenizer_info``
``GET /kv``, ``/kv/snapshot``              ``kv_view.py`` (the live KV cache view)
``GET /health``, ``GET /version``          ``health.py``
``GET /metrics``                           ``metrics.py`` (Prometheus)
``GET /openapi.json``, ``GET /docs``       ``openapi.py``
``GET /``                                  ``index.py`` (a page for a browser, JSON otherwise)
=========================================  ======================================================

What they share: the ``AsyncEngine`` (the one thread that owns the engine),
the ``Offload`` pool (heavy work off the event loop), the ``ServedModel``
(name, tokenizer, chat renderer, context), the ``Generator`` (submit, then
stream or collect), the metrics and the KV view.
Each route declares its response models and error statuses, and each body the
server sends is built from those models, so the published document is what
the server does. In front of the app sits the ``Guard`` (``guard.py``).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI

from paged.serve import chat, completions, health, index, kv_view, metrics, models, responses, tokenize
from paged.serve.response_store import ResponseStore
from paged.serve.async_engine import AsyncEngine
from paged.serve.errors import install_handlers
from paged.serve.generation import Generator
from paged.serve.guard import DEFAULT_MAX_BODY_BYTES, Guard
from paged.serve.offload import Offload
from paged.serve.openapi import install as install_openapi
from paged.serve.chat_protocol import ChatCompletionRequest
from paged.serve.options import ServeOptions
from paged.serve.protocol import CompletionRequest
from paged.serve.responses_protocol import InputTokensRequest, ResponsesRequest
from paged.serve.schemas import ChatCompletionChunk, CompletionChunk

ENDPOINTS = ["/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize",
             "/tokenizer_info", "/health", "/version", "/metrics", "/openapi.json", "/docs", "/kv"]
try:
    __version__ = version("paged")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0"


def build_app(llm, served_model_name: str, api_key: str | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, on_engine_failure=None,
              bind_host: str | None = None, kv_view_key: str | None = None,
              options: ServeOptions | None = None) -> Guard:
    """The ASGI app serving ``llm`` (an ``LLM``: ``.engine``, ``.tokenizer``, ``.model``).

    ``on_engine_failure(exc)`` runs on the event loop after the engine failed and every in-flight
    request got its error (``python -m paged.serve`` stops the server then); without it the app stays
    up and answers 503. ``kv_view_key`` opens the live KV view's data (None: nobody reads it). Once
    ``engine.stop_admission`` was called (a graceful stop, ``shutdown.py``) every new request gets a
    503. ``options``: the server-wide choices (``ServeOptions``: tool and reasoning parsers, bounds).
    The returned ``Guard`` holds the FastAPI app as ``.fastapi``.
    """
    engine = AsyncEngine(llm.engine, on_dead=on_engine_failure)
    work = Offload()
    device = llm.engine.kv_cache.data.device.type if hasattr(llm.engine, "kv_cache") else "cpu"
    server_metrics = metrics.ServerMetrics(lambda: engine.stats, device, served_model_name)
    llm.engine.add_observer(lambda eng, plan, results: server_metrics.observe_step(engine.step_started, eng, plan))
    view = kv_view.KVView(llm.engine)  # its first snapshot is taken here, before the engine thread starts
    llm.engine.add_observer(view.observe)
    engine.idle_observers.append(view.refresh)
    served = models.ServedModel(llm, served_model_name, work, options)
    generator = Generator(engine, served, server_metrics)

    @asynccontextmanager
    async def lifespan(app):
        engine.start()
        yield
        await app.state.response_store.close()  # background responses still running are cancelled
        engine.shutdown()
        work.shutdown()

    app = FastAPI(title="paged", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None, description="OpenAI-compatible completions and chat over paged's engine.")
    app.state.engine = engine
    install_handlers(app)
    if served.options.docs:
        install_openapi(app, [CompletionRequest, ChatCompletionRequest, ResponsesRequest, InputTokensRequest,
                              *tokenize.REQUEST_MODELS],
                        [CompletionChunk, ChatCompletionChunk], api_key=api_key is not None)
    health.install(app, engine, __version__)
    models.install(app, served)
    completions.install(app, served, generator)
    chat.install(app, served, generator)
    app.state.response_store = ResponseStore(served.options.response_store)
    responses.install(app, served, generator, app.state.response_store)
    metrics.install(app, server_metrics)
    tokenize.install(app, served)  # /tokenize, /detokenize, /tokenizer_info (vLLM's)
    kv_view.install(app, view)

    index.install(app, served_model_name, ENDPOINTS, served.options.docs)

    guarded = Guard(app, api_key, max_body_bytes, bind_host, kv_view_key, admission=engine)
    guarded.fastapi = app
    return guarded
