"""The HTTP guard: plain ASGI in front of every route (API key, operator key, ``Host``, ``Content-Type``, body size).

It is plain ASGI (no ``BaseHTTPMiddleware``), so streaming responses and
disconnect detection pass through untouched. It refuses, before any route runs:

* every request once the server is stopping (503 with ``Retry-After``: see
  ``shutdown.py``);
* without an API key, a ``Host`` header that does not name the bind address
  (421: a page whose name was re-bound to 127.0.0.1 must not read the answers);
* a missing or wrong Bearer key on ``GUARDED_PREFIXES`` when the server has an
  API key (401; compared in constant time);
* on ``OPERATOR_PREFIXES`` (the live KV view's data), any key but the
  operator's ``--kv-view-key`` (401), and everything when the server has none
  (403): the view shows which blocks each request found in the prefix cache,
  so a client holding it could confirm a guess at another client's prompt
  block by block. The API key is the clients' and does not open it;
* a body larger than ``--max-request-bytes`` (413, by ``Content-Length`` or
  while it is read);
* a POST whose ``Content-Type`` is missing or not JSON (415: a web page can
  send ``text/plain``, a form, or a body with no type at all to any address
  without asking the server first, but not JSON).

The body is read whole here and replayed to the app, so a route never waits on a
slow body.
"""

from __future__ import annotations

import hmac
import ipaddress

from paged.serve.errors import APIError, stopping_error

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
# the API and the tokenizer routes (/tokenize covers /tokenizer_info); /kv (a page with no data) stays open
GUARDED_PREFIXES = ("/v1", "/tokenize", "/detokenize")
OPERATOR_PREFIXES = ("/kv/",)  # the live KV view's data: the operator's key (--kv-view-key) only
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


def bearer(headers: dict) -> bytes:
    """The token of an ``Authorization: Bearer <token>`` header (``b""`` without one)."""
    auth = headers.get(b"authorization", b"")
    return auth[7:].strip() if auth[:7].lower() == b"bearer " else b""


class Guard:
    """ASGI middleware: the checks above, in that order, before the app sees a request.

    Args:
        app: the ASGI app behind the guard.
        api_key: the key clients must send, or None for no check.
        max_body_bytes: larger bodies get 413 without being read further.
        bind_host: the address the server listens on; without an API key, a ``Host``
            header that does not name it gets 421 (``host_allowed``). None: no check.
        kv_view_key: the operator's key for ``OPERATOR_PREFIXES``, or None: those answer 403.
        admission: what says whether the server still admits requests (the ``AsyncEngine``): its
            ``stopping`` is None, or why it no longer does. None: it always does.
    """

    def __init__(self, app, api_key: str | None, max_body_bytes: int, bind_host: str | None = None,
                 kv_view_key: str | None = None, admission=None) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.bind_host = bind_host
        self.kv_view_key = kv_view_key.encode() if kv_view_key else None
        self.admission = admission

    def _operator_refusal(self, given: bytes) -> APIError | None:
        """None when ``given`` is the operator's key, else why not (403: the server has none; 401: wrong)."""
        if self.kv_view_key is None:
            return APIError("the live KV view's data is for the server's operator and this server has no "
                            "--kv-view-key, so nobody may read it", 403, code="kv_view_disabled")
        if hmac.compare_digest(given, self.kv_view_key):
            return None
        why = "wrong key" if given else "missing key"
        return APIError(f"{why}: the live KV view's data needs 'Authorization: Bearer <key>' with the operator's "
                        "key (--kv-view-key or PAGED_KV_VIEW_KEY; the API key does not open it)", 401,
                        code="invalid_api_key")

    def _too_big(self) -> APIError:
        return APIError(f"request body is larger than the limit of {self.max_body_bytes} bytes "
                        "(--max-request-bytes)", 413, code="request_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.admission is not None and self.admission.stopping is not None:
            return await stopping_error(self.admission.stopping).response()(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.api_key is None and self.bind_host is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            if not host_allowed(host, self.bind_host):
                err = APIError(f"Host {host!r} does not name this server ({self.bind_host}); without an API key "
                               "the server answers only requests addressed to the address it listens on",
                               421, code="misdirected_request")
                return await err.response()(scope, receive, send)
        if scope["path"].startswith(OPERATOR_PREFIXES):
            err = self._operator_refusal(bearer(headers))
            if err is not None:
                return await err.response(headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        elif self.api_key is not None and scope["path"].startswith(GUARDED_PREFIXES):
            given = bearer(headers)
            if not hmac.compare_digest(given, self.api_key):
                why = "wrong API key" if given else "missing API key"
                err = APIError(f"{why}: send the header 'Authorization: Bearer <key>' with the key the "
                               "server was started with (--api-key or PAGED_API_KEY)", 401, code="invalid_api_key")
                return await err.response(headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        limit = self.max_body_bytes
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._too_big().response()(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        content_type = headers.get(b"content-type")
        if content_type is None or not is_json(content_type):
            given = f"Content-Type {content_type.decode('latin-1')!r} is" if content_type else "a body without a " \
                "Content-Type is"
            err = APIError(f"{given} not accepted: send the body as JSON with 'Content-Type: application/json'",
                           415, code="unsupported_media_type")
            return await err.response()(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await self._too_big().response()(scope, receive, send)
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
