"""Errors as the OpenAI API shapes them: ``{"error": {"message", "type", "param", "code"}}``.

Every failure of a request ends here, with a 4xx status when the client can fix
it (the message says what was wrong and what the bound is) and 5xx only when
the server itself failed. Nothing about a bad request reaches the engine: it is
refused before ``add_request``, so an error never leaves blocks or queue
entries behind.

One place maps each kind of failure: a pydantic error (``from_validation_error``),
a ``RequestError`` of ``SamplingParams`` or the engine (``from_request_error``),
a request that failed while it ran (``request_failure``), a failed engine
(``engine_failure``), and any exception a route lets through
(``install_handlers``). A stream that fails after its first event ends with
the same error as an event (``APIError.event``).
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from paged import RequestError
from paged.serve.async_engine import StoppingError
from paged.serve.schemas import ErrorResponse

RETRY_AFTER_S = 5  # what a refused client is told to wait: a restarted server takes about this long to answer

logger = logging.getLogger("paged.serve")

_TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """A request that cannot be served; becomes the OpenAI error JSON with ``status``."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _TYPE_OF_STATUS.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers  # e.g. Retry-After on a 503 while the server stops

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers={**(self.headers or {}), **(headers or {})})

    def event(self) -> ErrorResponse:
        """The error as the last event of a stream (whose status, 200, was sent with its first event)."""
        return ErrorResponse.model_validate(self.body())


def _is_field(part: str) -> bool:
    return part.isdigit() or bool(re.fullmatch(r"[a-z_][a-z0-9_]*", part)) and part not in {
        "str", "int", "float", "bool", "list", "dict", "none"}


def _loc(error: dict) -> tuple[str, ...]:
    """Where an error stands, as strings, without FastAPI's leading ``body``, ``query`` or ``path``."""
    loc = tuple(str(p) for p in error.get("loc", ()))
    return loc[1:] if loc[:1] in (("body",), ("query",), ("path",)) else loc


def _field_path(error: dict) -> list[str]:
    """``loc`` without the union-member tags pydantic inserts (``str``, ``list[int]``, ``function-after[...]``)."""
    return [p for p in _loc(error) if _is_field(p)]


def _field_name(path: list[str]) -> str | None:
    """The field a path ends in, past a list index (``messages.0`` -> ``messages``)."""
    names = [p for p in path if not p.isdigit()]
    return names[-1] if names else None


def lead_with(message: str, old: str | None, new: str) -> str:
    """``message`` led by the field name ``new``: in place of ``old`` where the message starts with it
    (``max_tokens must be ...``, ``messages.0.role: ...``), else before it (``new: message``)."""
    if old and message.startswith(old) and message[len(old):len(old) + 1] in (" ", ":"):
        return new + message[len(old):]
    return f"{new}: {message}"


def _meant_members(errors: list[dict]) -> list[dict]:
    """The errors of the union members a value was meant for: first a member whose type the value does
    not have (a list where a string goes) is left out with its errors, where another member took the
    value's type; then a member whose ``type`` field the value does not carry (an item of another kind);
    each step only if some errors remain; last, of members that failed at a list's items, the one that
    failed furthest in. A value no member takes the type of keeps each member's error:
    that is its problem (``input.0.content``: 5 is neither a string nor a list of parts). Linear in the
    errors (a body of 10 000 bad items has 20 000): each is matched by the prefixes of its place."""
    def member_of(loc: tuple, e: dict, wrong_kind: bool) -> tuple | None:
        """The member ``e`` rules out: the value is not of its type, or carries another ``type``."""
        tags = [i for i, p in enumerate(loc) if not _is_field(p)]
        rest = loc[tags[-1] + 1:] if tags else None
        if rest == () and not wrong_kind and e.get("type", "").endswith("_type") or \
                rest == ("type",) and wrong_kind and e.get("type") in ("literal_error", "missing"):
            return loc[:tags[-1] + 1]
        return None

    def prefixes(loc: tuple) -> list[tuple]:
        return [loc[:i] for i in range(len(loc) + 1)]

    def without(errors: list[dict], wrong_kind: bool) -> list[dict]:
        locs = [_loc(e) for e in errors]
        members = [member_of(loc, e, wrong_kind) for loc, e in zip(locs, errors)]
        wrong = {m for m in members if m is not None}
        if not wrong_kind:  # a type some member took: the parent holds an error of another kind
            held = {p for loc, m in zip(locs, members) if m is None for p in prefixes(loc)}
            wrong = {m for m in wrong if m[:-1] in held}
        meant = [e for loc, e in zip(locs, errors) if not wrong.intersection(prefixes(loc))]
        kinds = [e["ctx"]["expected"] for e, m in zip(errors, members)
                 if wrong_kind and m is not None and e.get("type") == "literal_error"]
        if not meant and wrong_kind and kinds:  # an item of no kind the union has: name every kind
            first = next(e for e in errors if e.get("type") == "literal_error")
            return [{**first, "msg": f"Input should be {' or '.join(kinds)}"}]
        return meant or errors

    def furthest(errors: list[dict]) -> list[dict]:
        """Members that each took a list's first items: the one that took the most was meant (token ids
        ending in a string are told ``prompt.3``, not ``prompt.0`` where a list of strings failed)."""
        def reach(e: dict) -> tuple[tuple, int] | None:
            loc = _loc(e)
            at = [i for i in range(len(loc) - 1) if not _is_field(loc[i]) and loc[i + 1].isdigit()]
            return (loc[:at[-1]], int(loc[at[-1] + 1])) if at else None

        reaches = [reach(e) for e in errors]
        most: dict[tuple, int] = {}
        for r in reaches:
            if r is not None:
                most[r[0]] = max(most.get(r[0], -1), r[1])
        return [e for e, r in zip(errors, reaches) if r is None or r[1] == most[r[0]]]

    return furthest(without(without(errors, wrong_kind=False), wrong_kind=True))


def from_validation_error(err: ValidationError | RequestValidationError, expected: dict | None = None) -> APIError:
    """The first pydantic error as a 400 naming the field (``messages.0.role``) and the problem.

    ``expected`` maps a field name to what it accepts, used when the field is a
    union (pydantic then reports one error per member type). Another union's
    errors are those of the members the value was meant for (``_meant_members``):
    an ``input`` item with ``"type": "function_call_output"`` and no ``output`` is
    told ``input.0.output: Field required``, not that it is not a string.
    """
    expected = expected or {}
    every = err.errors()
    errors = _meant_members(every)
    first = errors[0]
    path = _field_path(first)
    field = ".".join(path) or None
    msg = first.get("msg", "invalid value")
    # every member's error at the field, those left out above included: a value of no shape is told them all
    union = {id(e) for e in every if _field_path(e)[:len(path)] == path and e is not first}
    if union and _field_name(path) in expected:
        msg = f"expected {expected[_field_name(path)]}"
        errors = [e for e in errors if e is first or id(e) not in union]
    if first.get("type") == "extra_forbidden":
        msg = "unknown field; see docs/serving.md for the accepted fields"
    elif "input" in first and first.get("type") not in ("missing",):
        shown = repr(first["input"])
        msg += f" (got {shown[:80]}{'...' if len(shown) > 80 else ''})"
    more = f" ({len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return APIError(f"{field or 'request'}: {msg}{more}", 400, param=field, code="invalid_value")


def from_request_error(err: RequestError, rename: dict[str, str]) -> APIError:
    """A ``RequestError`` of ``SamplingParams`` or the engine as a 400 whose ``param`` is the API's field.

    The engine names fields as the offline API does; ``rename`` maps those
    names to this endpoint's (chat: ``prompt`` -> ``messages``, ``logprobs`` ->
    ``top_logprobs``). A renamed field leads the message, so the client reads
    the name it sent: in place of the engine's name where the message starts
    with it (``max_completion_tokens must be ...``), else before it.
    """
    param = rename.get(err.param, err.param)
    message = str(err) if param == err.param else lead_with(str(err), err.param, param)
    return APIError(message, 400, param=param, code="invalid_value")


def request_failure(error: BaseException, rename: dict[str, str]) -> APIError:
    """A request that failed while it ran, as its own error: a 400 naming the field when the
    request asked for more than the engine could do (its grammar met a limit), else a 500."""
    if isinstance(error, RequestError):
        return from_request_error(error, rename)
    return APIError(f"this request failed while it ran: {type(error).__name__}: {error}", 500,
                    type="server_error", code="request_failed")


def engine_failure(error: BaseException, status: int = 503) -> APIError:
    """The engine loop delivered ``error`` instead of an output: the server is stopping and ended this
    request (``StoppingError``: a 503 saying so, with ``Retry-After``), or the engine failed under it (a
    503 for an answer not yet started, ``status`` 500, a ``server_error`` event, for a stream under way)."""
    if isinstance(error, StoppingError):
        return stopping_error(str(error))
    return APIError(f"the engine failed: {error}", status, type="server_error" if status == 500 else None)


def stopping_error(message: str) -> APIError:
    """A 503 of a server that is stopping: the client may retry (``Retry-After``), here or elsewhere."""
    return APIError(message, 503, code="server_shutting_down", headers={"Retry-After": str(RETRY_AFTER_S)})


def install_handlers(app: FastAPI) -> None:
    """Route every exception a request can raise to an OpenAI-shaped JSON response."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return from_validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            msg = f"no route {request.method} {request.url.path}; see GET /v1/models, POST /v1/completions, " \
                  "POST /v1/chat/completions, GET /health, GET /metrics"
        elif exc.status_code == 405:
            msg = f"method {request.method} is not allowed on {request.url.path}"
        else:
            msg = str(exc.detail)
        return APIError(msg, exc.status_code, code="not_found" if exc.status_code == 404 else None).response(
            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        logger.exception("internal error serving %s %s", request.method, request.url.path)
        return APIError(f"internal server error: {type(exc).__name__}: {exc}", 500,
                        type="server_error").response()
