"""Idle and slow connections are shed and connections are capped (``paged/serve/connections.py``).

In-process, the protocol runs under a real uvicorn on a free loopback port in front of an app that
answers ``ok``, with short limits:

* a connection that sends nothing is closed once the idle timeout has passed;
* a request head sent a byte at a time gets a 408 (OpenAI's error JSON) and is closed once the header
  timeout has passed — also the second head on a kept-alive connection — while a head sent in two
  parts within the timeout is served;
* so does a request body sent a byte at a time, once the body timeout has passed;
* a connection beyond the cap gets a 503 with ``Retry-After`` at once and is closed; once one closes,
  a new one is served;
* so does a connection beyond the per-client cap, while another address is served; the count of each
  address goes to zero as its connections close (here loopback addresses are counted: 127.0.0.2 is
  this machine too; a server counts only other machines');
* a burst of shed connections, or of failed ``accept`` s, is one log line;
* the cap stays below the descriptor limit.

Then the command line: ``python -m paged.serve`` with ``--idle-timeout``, ``--header-timeout``,
``--max-connections`` and ``--max-connections-per-client`` sheds the same way.
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import threading
import time

import httpx
import pytest
import uvicorn

from paged.serve.connections import FD_RESERVE, BurstLog, Shedding, client_key, connection_limits
from tests.serve.conftest import ROOT, Server, server_args

sys.path.insert(0, str(ROOT / "tools"))
from stall_check import machine_address  # noqa: E402  (tools/ is not a package; the measurement's own lookup)

REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
SLACK_S = 1.5  # how much later than its timeout a shed may come on a loaded machine


async def ok_app(scope, receive, send):
    if scope["type"] != "http":
        return
    while scope["method"] == "POST" and (await receive()).get("more_body"):  # the whole body first, as the guard
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class Running:
    """uvicorn with ``shedding`` serving ``ok_app`` on its own thread."""

    def __init__(self, shedding: Shedding) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(ok_app, host="127.0.0.1", port=self.port, http=shedding.protocol, lifespan="off",
                                log_level="warning", backlog=64)
        self.shedding = shedding
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        """A connection from ``source``: any 127.x.y.z is this machine, seen by the server as another client."""
        return socket.create_connection(("127.0.0.1", self.port), timeout=10, source_address=(source, 0))

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def read_answer(s: socket.socket) -> bytes:
    """One whole ``ok`` answer (the connection stays open)."""
    data = b""
    while not data.endswith(b"\r\n\r\nok"):
        data += s.recv(65536)
    return data


def read_all(s: socket.socket) -> bytes:
    """What the server sends until it closes the connection (at most 10 s)."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def trickle(s: socket.socket, data: bytes) -> bytes:
    """Send ``data`` a byte every 0.2 s until the server answers or closes; what it answered by then."""
    s.settimeout(0.2)
    answer = b""
    try:
        for byte in data:
            try:
                s.send(bytes([byte]))
                answer += s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if answer:
                break
    finally:
        s.settimeout(10)
    return answer


@pytest.fixture
def running(request):
    r = Running(request.param)
    yield r
    r.stop()


def shedding(**kw) -> Shedding:
    return Shedding(**{"max_connections": 100, "idle_timeout": 30.0, "header_timeout": 30.0, **kw})


@pytest.mark.parametrize("running", [shedding(idle_timeout=0.5)], indirect=True)
def test_a_silent_connection_is_closed_after_the_idle_timeout(running):
    silent, t0 = running.connect(), time.monotonic()
    assert read_all(silent) == b""  # closed, nothing said: it asked nothing
    assert 0.4 < time.monotonic() - t0 < 0.5 + SLACK_S
    prompt = running.connect()
    prompt.sendall(REQUEST)
    assert prompt.recv(65536).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("running", [shedding(header_timeout=1.0)], indirect=True)
def test_a_request_head_a_byte_at_a_time_gets_408_after_the_header_timeout(running):
    slow, t0 = running.connect(), time.monotonic()
    answer = trickle(slow, REQUEST)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    took = time.monotonic() - t0
    assert 0.9 < took < 1.0 + SLACK_S, took
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout" and "--header-timeout" in error["message"]
    halves = running.connect()  # a head in two parts, within the timeout, is served
    halves.sendall(REQUEST[:10])
    time.sleep(0.3)
    halves.sendall(REQUEST[10:])
    assert halves.recv(65536).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("running", [shedding(header_timeout=1.0)], indirect=True)
def test_the_next_head_on_a_kept_alive_connection_is_timed_too(running):
    s = running.connect()
    s.sendall(REQUEST)
    assert read_answer(s).startswith(b"HTTP/1.1 200")
    s.sendall(REQUEST[:5])  # and then nothing more
    t0 = time.monotonic()
    assert read_all(s).startswith(b"HTTP/1.1 408")
    assert 0.9 < time.monotonic() - t0 < 1.0 + SLACK_S


POST = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n"
BODY = b'{"prompt": "a body of forty bytes....."}'


@pytest.mark.parametrize("running", [shedding(body_timeout=1.0)], indirect=True)
def test_a_request_body_a_byte_at_a_time_gets_408_after_the_body_timeout(running):
    """The head comes at once, its body a byte every 0.2 s: a 408 naming ``--body-timeout`` comes once it has
    passed, and the connection is closed; a body sent in two parts within the timeout is served."""
    assert len(BODY) == 40
    slow = running.connect()
    slow.sendall(POST)
    t0 = time.monotonic()
    answer = trickle(slow, BODY)
    took = time.monotonic() - t0
    answer += read_all(slow)  # to the close
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.9 < took < 1.0 + SLACK_S, took
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout" and "--body-timeout" in error["message"]
    halves = running.connect()
    halves.sendall(POST + BODY[:10])
    time.sleep(0.3)
    halves.sendall(BODY[10:])
    assert read_answer(halves).startswith(b"HTTP/1.1 200")
    time.sleep(1.0 + SLACK_S)  # past the timeout: the connection served its request and stays open
    halves.sendall(REQUEST)
    assert read_answer(halves).startswith(b"HTTP/1.1 200")


def refused_at_once(running: Running) -> dict:
    """A new connection's answer, asserted to be the 503 ``too_many_connections`` with ``Retry-After: 1``,
    sent and closed within ``SLACK_S``: its OpenAI error object."""
    extra, t0 = running.connect(), time.monotonic()
    answer = read_all(extra)
    assert time.monotonic() - t0 < SLACK_S
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_connections"
    return error


@pytest.mark.parametrize("running", [shedding(max_connections=3, per_client=0)], indirect=True)
def test_connections_beyond_the_cap_get_503_at_once_and_closed(running):
    held = [running.connect() for _ in range(3)]
    time.sleep(0.2)
    refused_at_once(running)
    held.pop().close()
    time.sleep(0.2)
    assert httpx.get(f"http://127.0.0.1:{running.port}/", timeout=10).status_code == 200
    for s in held:
        s.close()


@pytest.mark.parametrize("running", [shedding(max_connections=10, per_client=2, count_loopback=True)], indirect=True)
def test_one_address_holds_at_most_its_share_and_others_are_served(running):
    """Exact counts: the third connection from 127.0.0.1 gets the 503 naming ``--max-connections-per-client``
    at once, while 127.0.0.2 is served; one of the two closed, 127.0.0.1 is served again; all closed, no
    address is counted (the table holds only the addresses connected now)."""
    held = [running.connect() for _ in range(2)]
    time.sleep(0.2)
    assert "--max-connections-per-client" in refused_at_once(running)["message"]
    assert running.shedding.burst_log.counts == {"over --max-connections-per-client": 1}  # its reason, logged later
    other = running.connect("127.0.0.2")
    other.sendall(REQUEST)
    assert read_answer(other).startswith(b"HTTP/1.1 200")
    assert running.shedding.held == {"127.0.0.1": 2, "127.0.0.2": 1}
    held.pop().close()
    time.sleep(0.2)
    again = running.connect()
    again.sendall(REQUEST)
    assert read_answer(again).startswith(b"HTTP/1.1 200")
    for s in held + [again, other]:
        s.close()
    deadline = time.monotonic() + 5
    while running.shedding.held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running.shedding.held == {}


def test_the_per_client_share_defaults_to_a_quarter_of_the_cap_and_counts_other_machines_only():
    """Exact: the default is max_connections // 4 (at least 1); 0 counts no address; this machine's
    addresses (loopback, also mapped into IPv6) and a Unix socket's peer are not counted."""
    assert Shedding(max_connections=1000).per_client == 250
    assert Shedding(max_connections=3).per_client == 1
    server = Shedding(max_connections=10)
    assert server.client_of(FakeTransport(("203.0.113.7", 5))) == "203.0.113.7"
    assert server.client_of(FakeTransport(("2001:db8::7", 5, 0, 0))) == "2001:db8::/64"
    for local in (("127.0.0.1", 5), ("127.0.0.9", 5), ("::1", 5, 0, 0), ("::ffff:127.0.0.1", 5, 0, 0), ""):
        assert server.client_of(FakeTransport(local)) is None, local
    assert Shedding(max_connections=10, count_loopback=True).client_of(FakeTransport(("::1", 5, 0, 0))) == "::1"
    assert Shedding(max_connections=10, per_client=0).client_of(FakeTransport(("203.0.113.7", 5))) is None


def test_a_client_is_an_ipv4_address_or_an_ipv6_64():
    """Exact: one IPv4 address is one client (also mapped into IPv6); the addresses of one IPv6 /64 are one
    client, another /64 another; loopback and link-local IPv6 addresses (whose /64 a whole link shares)
    count alone; a name that is no address (a Unix socket's) stays as it is."""
    assert client_key("203.0.113.7") == client_key("::ffff:203.0.113.7") == "203.0.113.7"
    assert client_key("203.0.113.8") == "203.0.113.8"
    assert client_key("2001:db8:1:2::7") == client_key("2001:db8:1:2:ffff:1:2:3") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::7") == "2001:db8:1:3::/64"
    assert client_key("::1") == "::1"
    assert client_key("fe80::1%eth0") == "fe80::1" != client_key("fe80::2")
    assert client_key("/run/paged.sock") == "/run/paged.sock"


class FakeTransport:
    def __init__(self, peer) -> None:
        self.peer = peer

    def get_extra_info(self, name: str):
        return self.peer if name == "peername" else None


def test_a_burst_of_shed_connections_is_one_log_line():
    lines: list[str] = []
    burst = BurstLog(window_s=0.5, log=lambda fmt, *args: lines.append(fmt % args))
    running = Running(Shedding(max_connections=2, idle_timeout=30.0, header_timeout=30.0, burst_log=burst,
                              per_client=0))
    try:
        held = [running.connect() for _ in range(2)]
        time.sleep(0.2)
        refused = [running.connect() for _ in range(30)]
        for s in refused:
            read_all(s)
        time.sleep(0.8)
        assert len(lines) == 1 and "30 over --max-connections" in lines[0], lines
        for s in held + refused:
            s.close()
    finally:
        running.stop()


def test_failed_accepts_are_counted_not_logged_one_by_one():
    """The event loop's 'out of system resource' errors (no descriptor left) go to the burst log."""
    import asyncio

    lines: list[str] = []
    s = Shedding(burst_log=BurstLog(window_s=0.1, log=lambda fmt, *args: lines.append(fmt % args)))

    async def burst():
        loop = asyncio.get_running_loop()
        for _ in range(2000):
            s.exception_handler(loop, {"message": "socket.accept() out of system resource",
                                       "exception": OSError(24, "Too many open files")})
        await asyncio.sleep(0.3)

    asyncio.run(burst())
    assert lines == ["shed 2000 connection(s) in the last 0 s: 2000 not accepted: no file descriptor left"]


def test_the_cap_and_backlog_stay_below_the_descriptor_limit():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_limits(10)[0] == 10
    cap, backlog = connection_limits(10**9)
    assert 0 < backlog and cap + backlog + FD_RESERVE <= resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= soft  # raised, never lowered


# -- the command line -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def limited(model_path):
    s = Server(model_path, server_args() + ["--idle-timeout", "1", "--header-timeout", "2", "--body-timeout", "2",
                                            "--max-connections", "8", "--max-connections-per-client", "5"])
    yield s
    s.stop()


def shed_reasons(server: Server) -> set[str]:
    """The reasons of the server's one burst log line (waited for: it comes ``BURST_S`` after the burst began)."""
    deadline = time.monotonic() + 15
    while "shed " not in server.output() and time.monotonic() < deadline:
        time.sleep(0.5)
    shed = [line for line in server.output().splitlines() if "shed " in line]
    assert len(shed) == 1, shed
    return set(shed[0].split(" s: ", 1)[1].split(", "))


def test_the_server_sheds_by_its_options(limited):
    """Exact statuses and reasons. ``--idle-timeout 1``: a silent socket is closed; this machine's connections are not counted per
    client (six from 127.0.0.1 under ``--max-connections-per-client 5``, and a seventh is served);
    ``--max-connections 8``: the ninth gets a 503; the log says so in one line."""
    port = limited.port
    silent, t0 = socket.create_connection(("127.0.0.1", port), timeout=10), time.monotonic()
    assert read_all(silent) == b"" and time.monotonic() - t0 < 1 + SLACK_S
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(6)]
    time.sleep(0.3)
    assert httpx.get(limited.url + "/health", timeout=10).status_code == 200  # the seventh, from loopback
    held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    time.sleep(0.3)
    r = httpx.get(limited.url + "/health", timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections"
    assert "(--max-connections)" in r.json()["error"]["message"]
    for s in held:
        s.close()
    time.sleep(0.3)
    assert httpx.get(limited.url + "/health", timeout=10).status_code == 200
    assert shed_reasons(limited) == {"1 over --max-connections", "1 idle before a first request"}


def test_a_server_on_the_network_counts_each_other_machine(model_path):
    """Exact statuses. ``--host`` this machine's network address, ``--max-connections-per-client 2``: the address
    connecting to it is not loopback, so it is counted: the third connection gets the 503 naming the
    option at once; one closed, it is served again."""
    address = machine_address()
    if address is None:
        pytest.skip("this machine has no network address besides loopback, so every client is uncounted loopback")
    server = Server(model_path, server_args() + ["--max-connections-per-client", "2"], host=address)
    try:
        held = [socket.create_connection((address, server.port), timeout=10) for _ in range(2)]
        time.sleep(0.3)
        r = httpx.get(server.url + "/health", timeout=10)
        assert r.status_code == 503 and "--max-connections-per-client" in r.json()["error"]["message"], r.text
        held.pop().close()
        time.sleep(0.3)
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        for s in held:
            s.close()
    finally:
        server.stop()


def test_the_server_times_a_body_by_its_option(limited):
    """``--body-timeout 2``: a completion whose body stops halfway gets the 408 after 2 s, and is closed."""
    body = json.dumps({"model": "test-model", "prompt": "x", "max_tokens": 1}).encode()
    s = socket.create_connection(("127.0.0.1", limited.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
    t0 = time.monotonic()
    answer = read_all(s)
    assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer, answer
    assert 1.9 < time.monotonic() - t0 < 2 + SLACK_S
