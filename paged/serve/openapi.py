"""The published API: ``GET /openapi.json`` and an interactive page at ``GET /docs``.

The document is generated, never written by hand: paths and responses come
from the routes' declared response models (``schemas.py``), request bodies
from the same pydantic models that validate them (``protocol.py``). The
routes parse bodies themselves (``body.parse_body``, for OpenAI-shaped error
messages), so FastAPI does not see those models; ``request_body`` names them
for each route and ``openapi_document`` adds their JSON schemas to the
document's components.

A streamed answer is documented as ``text/event-stream`` whose ``schema``
describes one event (OpenAPI 3.1 has no stream keyword; 3.2's ``itemSchema``
reads the same way): its ``data`` is ``[DONE]`` or a JSON chunk (or, when the
engine failed mid-stream, an error).

The docs page is Swagger UI, served from the ``swagger-ui-bundle-v2`` package
rather than a CDN, so it works on a machine without internet access.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from paged.serve.schemas import ErrorResponse

COMPONENTS = "#/components/schemas/"
DOCS_ASSETS = "/docs/assets"

# statuses every /v1 route may answer with, besides its own
ERRORS = {
    400: "the request is malformed or out of bounds; the message names the field and the bound",
    401: "missing or wrong API key (only when the server was started with one)",
    413: "the body is larger than --max-request-bytes",
    415: "the body's Content-Type is missing or not JSON",
    421: "no API key is set and the Host header does not name the address the server listens on",
    500: "this request's own processing failed while it ran (e.g. a logits processor raised); the others go on",
}


def error_responses(*statuses: int, **more: str) -> dict:
    """``responses=`` entries documenting these error statuses with the error model."""
    described = {**{s: ERRORS[s] for s in statuses}, **{int(k[1:]): v for k, v in more.items()}}
    return {status: {"model": ErrorResponse, "description": why} for status, why in described.items()}


# request bodies shown on the docs page ("Try it out" starts from them); the fuzzing test sends each one
EXAMPLES = {
    "CompletionRequest": {
        "text": {"prompt": "def fib(n):", "max_tokens": 16, "temperature": 0},
        "stream": {"prompt": "def fib(n):", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}},
        "n_seed_stop_logprobs": {"prompt": ["Once upon a time", "import os"], "max_tokens": 8, "n": 2, "seed": 7,
                                 "stop": ["\n"], "logprobs": 2},
        "beam_search": {"prompt": [5, 6, 7], "max_tokens": 6, "n": 2, "use_beam_search": True, "temperature": 0},
    },
    "ChatCompletionRequest": {
        "chat": {"messages": [{"role": "user", "content": "Write a Python function."}], "max_tokens": 12},
        "stream_logprobs": {"messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Hello"}],
                            "max_completion_tokens": 6, "stream": True, "logprobs": True, "top_logprobs": 2},
        "forced_tool_call": {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 10,
                             "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                                 "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                                 "required": ["city"]}}}], "tool_choice": "required"},
    },
    "InputTokensRequest": {
        "text": {"input": "def fib(n):", "instructions": "Write Python."},
        "items": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
                            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "And now?"}]},
    },
    "ResponsesRequest": {
        "text": {"input": "def fib(n):", "instructions": "Write Python.", "max_output_tokens": 8},
        "stream": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}],
                   "max_output_tokens": 8, "stream": True},
        "json_schema": {"input": "A city.", "max_output_tokens": 12, "text": {"format": {
            "type": "json_schema", "name": "city", "schema": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}},
    },
}


def request_body(model: type[BaseModel]) -> dict:
    """``openapi_extra`` naming ``model`` (added by ``openapi_document``) as the route's JSON body."""
    examples = {name: {"value": body} for name, body in EXAMPLES.get(model.__name__, {}).items()}
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": COMPONENTS + model.__name__}, "examples": examples}}}}


def event_stream(chunk: type[BaseModel]) -> dict:
    """The ``text/event-stream`` content of a streamed answer: one event's shape."""
    data = {"type": "string", "if": {"const": "[DONE]"},
            "else": {"contentMediaType": "application/json",
                     "contentSchema": {"anyOf": [{"$ref": COMPONENTS + chunk.__name__},
                                                 {"$ref": COMPONENTS + ErrorResponse.__name__}]}}}
    return {"text/event-stream": {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}}}}


def generation_route(request_model: type[BaseModel], response_model: type[BaseModel],
                     chunk_model: type[BaseModel]) -> dict:
    """The route options of a generation endpoint: its body, its answers (JSON or a stream), its errors."""
    return {"openapi_extra": request_body(request_model), "response_model": None, "tags": ["OpenAI API"],
            "responses": {200: {"model": response_model, "content": event_stream(chunk_model),
                                "description": "the completion; with stream: true, server-sent events"},
                          **error_responses(400, 401, 413, 415, 421, 500, _404="the model named is not served here",
                                            _503="the engine failed, or the server is stopping (with Retry-After)")}}


def openapi_document(app: FastAPI, request_models: list[type[BaseModel]], chunk_models: list[type[BaseModel]],
                     api_key: bool) -> dict:
    """The OpenAPI 3.1 document of ``app``, with the request and chunk models' schemas as components.

    Args:
        app: the FastAPI app (its routes, title, version and description).
        request_models: models named by ``request_body`` (validation side: what clients may send).
        chunk_models: models named by ``event_stream`` (serialization side: what the server sends).
        api_key: whether /v1 routes need ``Authorization: Bearer <key>``.
    """
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    models = [(m, "validation") for m in request_models] + [(m, "serialization") for m in chunk_models]
    _, defs = models_json_schema(models, ref_template=COMPONENTS + "{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(defs.get("$defs", {}))
    for operations in doc["paths"].values():  # the handlers answer a validation error with 400, never 422
        for op in operations.values():
            op["responses"].pop("422", None)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    if api_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                            "description": "the server's --api-key"}}
        for path, operations in doc["paths"].items():
            if path.startswith(("/v1", "/tokenize", "/detokenize")):  # guard.GUARDED_PREFIXES' documented routes
                for op in operations.values():
                    op["security"] = [{"bearer": []}]
    return doc


def install(app: FastAPI, request_models: list[type[BaseModel]], chunk_models: list[type[BaseModel]],
            api_key: bool) -> None:
    """Serve the document at ``/openapi.json`` (built once, on first use) and Swagger UI at ``/docs``."""
    from swagger_ui_bundle import swagger_ui_path

    def cached_openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app, request_models, chunk_models, api_key)
        return app.openapi_schema

    app.openapi = cached_openapi
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json():
        return cached_openapi()

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} API",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")
