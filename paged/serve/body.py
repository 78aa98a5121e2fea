"""A request body, parsed: bytes -> JSON -> the endpoint's pydantic model, or a 400 that says what is wrong.

Bodies are parsed here rather than by FastAPI so that every failure — bytes
that are not UTF-8, malformed JSON, a JSON array instead of an object, wrong
field types, nesting deeper than ``MAX_JSON_DEPTH``, an integer longer than
``MAX_JSON_INT_DIGITS`` digits, a number past a double's range, ``NaN``, a lone
surrogate, more than ``MAX_PROMPTS`` prompts — gets its own message in OpenAI's
error shape with status 400, naming the field where it stands
(``logit_bias.50256: the number 1e999 is beyond...``, ``param`` the request's
field), and the connection stays open for the client's next request. Lists
longer than their bound are refused before pydantic validates their items, and
each list stops at its first bad item (``extensions.Items``). A body of
``INLINE_BODY_BYTES`` or more is parsed on the server's thread pool
(``offload.py``), so that a 4 MiB one costs the event loop nothing.
"""

from __future__ import annotations

import json
import math

from fastapi import Request
from pydantic import ValidationError

from paged.serve.errors import APIError, from_validation_error
from paged.serve.offload import Offload
from paged.serve.protocol import EXPECTED, LIST_BOUNDS, MAX_PROMPTS, count_prompts

MAX_JSON_DEPTH = 64  # nested arrays / objects in a body (a JSON schema needs a dozen)
MAX_JSON_INT_DIGITS = 40  # far past every field's bound (2**64 has 20), far below Python's 4 300-digit limit
INLINE_BODY_BYTES = 64 * 2**10  # smaller bodies are parsed on the event loop (a few ms at most; no hand-off)


async def parse_body(raw: Request, model_cls, work: Offload, expected: dict[str, str] = EXPECTED):
    """The body as ``model_cls``, or an ``APIError`` that says exactly what is wrong with it (``expected``:
    what each field of several types takes, in this request's terms).

    A body of ``INLINE_BODY_BYTES`` or more is parsed on ``work``, the server's pool, not on the event
    loop: reading and checking a 4 MiB body takes a core for a second or more, and every other
    connection would wait for it.
    """
    body = await raw.body()
    if len(body) < INLINE_BODY_BYTES:
        return parse(body, model_cls, expected)
    return await work.pooled(parse, body, model_cls, expected)


def parse(body: bytes, model_cls, expected: dict[str, str] = EXPECTED):
    """``parse_body``'s work: bytes -> text -> JSON -> checks -> ``model_cls``; cheap checks first."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(f"request body is not valid UTF-8: byte 0x{body[e.start]:02x} at offset {e.start}",
                       code="invalid_encoding") from None
    if not text.strip():
        raise APIError("request body is empty: send a JSON object", code="invalid_json")
    data = _decode(text)
    if not isinstance(data, dict):
        raise APIError(f"request body must be a JSON object, got a JSON {type(data).__name__}", code="invalid_json")
    for field, bound in LIST_BOUNDS.items():  # before the per-item validation a long list would cost
        value = data.get(field)
        if isinstance(value, (list, dict)) and len(value) > bound:
            raise APIError(f"{field} has {len(value)} entries; at most {bound} are allowed", param=field,
                           code="invalid_value")
    prompts = count_prompts(data.get("prompt"))
    if prompts > MAX_PROMPTS:
        raise APIError(f"prompt holds {prompts} prompts; at most {MAX_PROMPTS} are allowed in one request "
                       "(send the others in more requests)", param="prompt", code="invalid_value")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise _too_deep()
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        path = [_printable(p) for p in path_to(data, lambda v: isinstance(v, str) and not _is_unicode(v)) or []]
        raise APIError(f"{_dotted(path)}: holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff), which "
                       "is not valid Unicode text", param=path[0] if path else None,
                       code="invalid_encoding") from None
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, expected) from None


class _Refused:
    """A number or constant the parser refuses, left where it stood so that its field can be named."""

    __slots__ = ("why", "code")

    def __init__(self, why: str, code: str) -> None:
        self.why, self.code = why, code


def _decode(text: str):
    """The JSON value of ``text``; a number or constant no field could take is a 400 naming where it stands.

    Such a value is not refused while the text is read (the reader does not know where it is) but
    parsed into a ``_Refused`` mark; the first mark's path then names the field.
    """
    refused: list[_Refused] = []

    def refuse(why: str, code: str = "invalid_value") -> _Refused:
        refused.append(_Refused(why, code))
        return refused[-1]

    def bounded_int(number: str):
        digits = len(number.lstrip("-"))
        if digits > MAX_JSON_INT_DIGITS:
            return refuse(f"an integer of {digits} digits; at most {MAX_JSON_INT_DIGITS} are accepted "
                          "(no field takes a larger one)")
        return int(number)

    def finite_float(number: str):
        value = float(number)
        return value if math.isfinite(value) else refuse(f"the number {number[:40]} is beyond a double's range "
                                                         "(about 1.8e308)")

    def no_constant(name: str):
        return refuse(f"{name} is not JSON (JSON has no NaN or Infinity)", "invalid_json")

    try:
        data = json.loads(text, parse_int=bounded_int, parse_float=finite_float, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise APIError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}", code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    if refused:
        first = refused[0]  # the first in the text: the reader goes through it in order
        path = [_printable(p) for p in path_to(data, lambda v: v is first) or []]
        raise APIError(f"{_dotted(path)}: {first.why}", param=path[0] if path else None, code=first.code)
    return data


def path_to(data, bad) -> list[str] | None:
    """The keys and indices leading to the first value, or dict key, for which ``bad`` holds, in the order
    of the text (``["logit_bias", "50256"]``; ``[]`` for ``data`` itself), or None; without recursion."""
    stack = [(None, data, [])]
    while stack:
        key, node, path = stack.pop()
        if (key is not None and bad(key)) or bad(node):
            return path
        if isinstance(node, dict):
            stack.extend(reversed([(k, v, path + [k]) for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(None, v, path + [str(i)]) for i, v in enumerate(node)]))
    return None


def _dotted(path: list[str] | None) -> str:
    return ".".join(path) if path else "request"


def _printable(key: str) -> str:
    """``key`` as an error message may show it: a lone surrogate spelt ``\\udfff`` (UTF-8 has no such character)."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:  # a lone surrogate
        return False


def _too_deep() -> APIError:
    return APIError(f"the body nests arrays and objects more than {MAX_JSON_DEPTH} deep", code="invalid_json")


def json_depth(data) -> int:
    """The deepest nesting of lists and dicts in ``data`` (a scalar is 0), counted one level at a time
    (no recursion; past ``MAX_JSON_DEPTH`` the count stops at ``MAX_JSON_DEPTH + 1``)."""
    depth, level = 0, [data]
    while depth <= MAX_JSON_DEPTH:
        containers = [node for node in level if isinstance(node, (dict, list))]
        if not containers:
            break
        depth += 1
        level = [child for node in containers for child in (node.values() if isinstance(node, dict) else node)]
    return depth
