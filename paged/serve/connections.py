"""The socket layer: idle and slow connections are shed, and connections are capped with a clean 503.

uvicorn closes a connection idle *between* requests (its keep-alive timeout)
but not one that never sends a request, nor one that sends its request head a
byte at a time, and it caps nothing: 2 000 silent sockets stayed open for good,
and at the process's descriptor limit every new client was refused while the
event loop logged a traceback for each failed ``accept``. So the server runs
uvicorn's own h11 protocol with five additions (``SheddingProtocol``), all
in the transport, before a request reaches the app:

* **idle timeout** (``--idle-timeout``): a connection that sends no byte of a
  first request within it is closed;
* **header timeout** (``--header-timeout``): a request head (the request line
  and the headers) must be complete within it of its first byte, else a 408
  and the connection is closed;
* **body timeout** (``--body-timeout``): a request's body (its size is bounded
  by the guard) must be complete within it of the head's end, else a 408 and
  the connection is closed: a body sent a byte at a time would otherwise hold
  its connection for good; the time after the body is the request's own;
* **connection cap** (``--max-connections``): a connection beyond it is
  answered at once with a 503 (OpenAI's error JSON, ``Retry-After``) and
  closed. The cap is kept below the process's descriptor limit (raised to
  its hard limit when the cap needs it), so ``accept`` does not run out
  (``connection_limits``);
* **per-client cap** (``--max-connections-per-client``): the connections one
  address (the peer's IP) may hold at once; beyond it, the same 503. Without
  it one client could hold every connection (1 000 kept alive, a request on
  each every 3 s) and every other client was refused. The default, a quarter
  of the cap, leaves three quarters to the others. Connections from this
  machine (loopback: a local benchmark opening a thousand streams, a proxy
  on the same host) and on a Unix socket are not counted; behind a proxy on
  another host every client has the proxy's address, so raise it (or 0).

What is shed is logged as one line per burst (``BurstLog``: counts per
reason, at most one line every ``BURST_S`` seconds), and so are the event
loop's ``accept`` failures, should the descriptors still run out.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import resource
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("paged.serve")

DEFAULT_MAX_CONNECTIONS = 1000
PER_CLIENT_SHARE = 4  # by default one address may hold a quarter of --max-connections
DEFAULT_IDLE_TIMEOUT_S = 10.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0  # 4 MiB (the default body limit) in 34 s at 1 Mbit/s
MAX_BACKLOG = 511  # connections the kernel queues (nginx's default), fewer when descriptors are short
FD_RESERVE = 64  # descriptors the process holds besides its connections (model files, pipes, the loop's own)
BURST_S = 10.0  # a burst's counts are logged once, this long after its first event
IPV6_CLIENT_PREFIX = 64  # an IPv6 client is its /64: the usual share of one host or site (a LAN, a VM)
RETRY_OVER_CAP_S = 1  # a refused client may try again this soon: connections come and go quickly


def raw_response(status: int, reason: str, message: str, code: str, headers: dict | None = None) -> bytes:
    """A whole HTTP/1.1 response carrying OpenAI's error JSON, closing the connection (no h11 state needed)."""
    body = json.dumps({"error": {"message": message, "type": "service_unavailable" if status == 503 else
                                 "invalid_request_error", "param": None, "code": code}}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def connection_limits(wanted: int) -> tuple[int, int]:
    """``(cap, backlog)``: ``wanted`` connections, or fewer when the descriptor limit cannot hold them (raised to
    its hard limit first when that helps), and the listen backlog that leaves room for.

    asyncio accepts up to a backlog's worth of connections in one go before the cap can refuse any, so the
    limit must hold the cap, the backlog and the process's own descriptors (``FD_RESERVE``) at once.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + MAX_BACKLOG + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted, MAX_BACKLOG
    backlog = min(MAX_BACKLOG, soft // 8)
    return max(1, min(wanted, soft - backlog - FD_RESERVE)), backlog


def _ip(host: str):
    """``host`` (a peer's address, an IPv6 one perhaps with ``%zone``) as an ``ipaddress`` object; None if
    it is no IP address (a Unix socket's path)."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def client_key(host: str) -> str:
    """Whom a peer's address counts as, for ``--max-connections-per-client`` and the fair share of the
    device: an IPv4 address itself (also mapped into IPv6); an IPv6 address as its /64
    (``IPV6_CLIENT_PREFIX``), which one host or one site usually holds whole, so that a client cannot
    become thousands of clients by changing the address's last bits — except loopback and link-local
    addresses, whose /64 every host on the link shares, which count alone; anything else as given."""
    ip = _ip(host)
    if ip is None:
        return host
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.is_loopback or ip.is_link_local:
        return str(ip)
    return str(ipaddress.ip_network(f"{ip}/{IPV6_CLIENT_PREFIX}", strict=False))


def is_loopback(host: str) -> bool:
    """Is ``host`` (a peer's IP) this machine: 127.0.0.0/8, ::1, or an IPv4 loopback mapped into IPv6?"""
    ip = _ip(host)
    return ip is not None and (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


class BurstLog:
    """Counts of shed connections, logged as one line per burst instead of one per socket."""

    def __init__(self, window_s: float = BURST_S, log=logger.warning) -> None:
        self.window_s = window_s
        self.log = log
        self.counts: Counter = Counter()
        self._handle = None

    def note(self, loop, reason: str) -> None:
        self.counts[reason] += 1
        if self._handle is None:
            self._handle = loop.call_later(self.window_s, self.flush)

    def flush(self) -> None:
        self._handle = None
        if self.counts:
            total = sum(self.counts.values())
            self.log("shed %d connection(s) in the last %.0f s: %s", total, self.window_s,
                     ", ".join(f"{n} {reason}" for reason, n in self.counts.most_common()))
            self.counts.clear()


class Shedding:
    """The limits every connection of one server is held to, and the burst log they share.

    Args:
        max_connections: connections served at once; beyond it a 503 (see ``connection_limits``).
        per_client: connections one address may hold at once; beyond it a 503 (default: a
            ``PER_CLIENT_SHARE``-th of ``max_connections``; 0: no per-client cap).
        count_loopback: count this machine's addresses too (the tests do; a server does not).
        idle_timeout: seconds a new connection may wait before the first byte of a request.
        header_timeout: seconds a request head may take from its first byte to its end.
        body_timeout: seconds a request body may take from the head's end to its own.
        burst_log: the ``BurstLog`` (a fresh one by default).
    """

    def __init__(self, max_connections: int = DEFAULT_MAX_CONNECTIONS, idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S,
                 header_timeout: float = DEFAULT_HEADER_TIMEOUT_S, body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
                 burst_log: BurstLog | None = None, per_client: int | None = None,
                 count_loopback: bool = False) -> None:
        self.max_connections = max_connections
        self.per_client = max(1, max_connections // PER_CLIENT_SHARE) if per_client is None else per_client
        self.count_loopback = count_loopback
        self.held: Counter = Counter()  # address -> connections it holds (those served, not those refused)
        self.idle_timeout = idle_timeout
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.burst_log = burst_log or BurstLog()
        self.over_cap = raw_response(503, "Service Unavailable", f"the server has {max_connections} connections "
                                     "open (--max-connections); try again shortly", "too_many_connections",
                                     {"Retry-After": RETRY_OVER_CAP_S})
        self.over_client_cap = raw_response(503, "Service Unavailable", f"this address has {self.per_client} "
                                            "connections open, the most one client may hold "
                                            "(--max-connections-per-client); close one, or try again shortly",
                                            "too_many_connections", {"Retry-After": RETRY_OVER_CAP_S})
        self.too_slow = raw_response(408, "Request Timeout", f"the request head (request line and headers) did "
                                     f"not arrive within {header_timeout:g} s of its first byte (--header-timeout)",
                                     "request_timeout")
        self.body_too_slow = raw_response(408, "Request Timeout", f"the request body did not arrive within "
                                          f"{body_timeout:g} s of the request head (--body-timeout)",
                                          "request_timeout")

    def client_of(self, transport) -> str | None:
        """The client a connection is counted under: the peer's IP (``client_key``); ``None`` (not counted) with no
        per-client cap, on a Unix socket, or from this machine (unless ``count_loopback``)."""
        peer = transport.get_extra_info("peername")
        if not self.per_client or not isinstance(peer, tuple) or not peer:
            return None
        return client_key(peer[0]) if self.count_loopback or not is_loopback(peer[0]) else None

    def protocol(self, *args, **kwargs) -> SheddingProtocol:
        """uvicorn's ``http=`` factory: one ``SheddingProtocol`` per connection."""
        return SheddingProtocol(*args, shedding=self, **kwargs)

    def exception_handler(self, loop, context: dict) -> None:
        """The event loop's handler: a failed ``accept`` (no descriptor left) is counted, anything else logged
        as asyncio would."""
        if context.get("message", "").startswith("socket.accept() out of system resource"):
            self.burst_log.note(loop, "not accepted: no file descriptor left")
        else:
            loop.default_exception_handler(context)


class SheddingProtocol(H11Protocol):
    """uvicorn's h11 protocol, with the idle, header and body timeouts and the connection caps of ``Shedding``."""

    def __init__(self, *args, shedding: Shedding, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shedding = shedding
        self.refused = False
        self.counted_as: str | None = None  # the address it counts under in ``shedding.held`` (uvicorn has ``client``)
        self._timer = None  # the idle, head or body deadline, while one runs
        self._reading_head = self._reading_body = False

    def connection_made(self, transport) -> None:
        shedding = self.shedding
        client = shedding.client_of(transport)
        if len(self.connections) >= shedding.max_connections:
            self._refuse(transport, shedding.over_cap, "over --max-connections")
            return
        if client is not None and shedding.held[client] >= shedding.per_client:
            self._refuse(transport, shedding.over_client_cap, "over --max-connections-per-client")
            return
        if client is not None:
            self.counted_as = client
            shedding.held[client] += 1
        super().connection_made(transport)
        self._timer = self.loop.call_later(self.shedding.idle_timeout, self._shed, b"",
                                           "idle before a first request")

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.conn.their_state is h11.IDLE and not self._reading_head:  # the first byte of a request head
            self._reading_head = True
            self._cancel_timer()
            self._timer = self.loop.call_later(self.shedding.header_timeout, self._shed, self.shedding.too_slow,
                                               "request head slower than --header-timeout")
        super().data_received(data)
        if self._reading_head and self.conn.their_state is not h11.IDLE:  # h11 has the whole head
            self._reading_head = False
            self._cancel_timer()
            if self.conn.their_state is h11.SEND_BODY:  # a body follows
                self._reading_body = True
                self._timer = self.loop.call_later(self.shedding.body_timeout, self._shed,
                                                   self.shedding.body_too_slow, "request body slower than "
                                                   "--body-timeout")
        elif self._reading_body and self.conn.their_state is not h11.SEND_BODY:  # the whole body is here
            self._reading_body = False
            self._cancel_timer()

    def connection_lost(self, exc) -> None:
        self._cancel_timer()
        if self.counted_as is not None:
            held = self.shedding.held
            held[self.counted_as] -= 1
            if not held[self.counted_as]:
                del held[self.counted_as]  # the table holds only the addresses connected now
            self.counted_as = None
        if not self.refused:
            super().connection_lost(exc)

    def _refuse(self, transport, answer: bytes, reason: str) -> None:
        self.refused = True
        transport.write(answer)
        transport.close()
        self.shedding.burst_log.note(self.loop, reason)

    def eof_received(self) -> None:
        if not self.refused:
            super().eof_received()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _shed(self, answer: bytes, reason: str) -> None:
        self._timer = None
        if answer and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # no answer of the app's begun
            self.transport.write(answer)
        self.transport.close()
        self.shedding.burst_log.note(self.loop, reason)
