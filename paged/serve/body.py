"""A request body, parsed: bytes -> JSON -> the endpoint's pydantic model, or a 400 that says what is wrong.

Bodies are parsed here rather than by FastAPI so that every failure — bytes
that are not UTF-8, malformed JSON, a JSON array instead of an object, wrong
field types, nesting deeper than ``MAX_JSON_DEPTH``, an integer longer than
``MAX_JSON_INT_DIGITS`` digits, a number past a double's range — gets its own
message in OpenAI's error shape with status 400, and the connection stays open
for the client's next request.
"""

from __future__ import annotations

import json
import math
import re

from fastapi import Request
from pydantic import ValidationError

from paged.serve.errors import APIError, from_validation_error
from paged.serve.protocol import EXPECTED, LIST_BOUNDS

MAX_JSON_DEPTH = 64  # nested arrays / objects in a body (a JSON schema needs a dozen)
MAX_JSON_INT_DIGITS = 40  # far past every field's bound (2**64 has 20), far below Python's 4 300-digit limit


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
