"""A graceful stop: on SIGTERM (or Ctrl-C) admit nothing new, let what runs finish, end the rest properly, exit 0.

uvicorn on its own stops by closing its sockets and cancelling whatever still
runs after a few seconds: a stream then ends with no error event, a
non-streamed request gets a plain-text 500, and the process re-raises the
signal, so it exits as killed. ``GracefulServer`` replaces the first SIGTERM
or SIGINT with this, in order:

1. **Stop admission.** ``AsyncEngine.stop_admission``: every new request gets
   a 503 with ``Retry-After`` (the guard answers it before any route, and a
   request already past the guard is refused when it reaches the engine), so
   a client or a load balancer tries elsewhere; ``/health`` is 503 too.
2. **Drain.** The requests already running go on until they finish, for at
   most ``--shutdown-timeout`` seconds (vLLM's option name).
3. **End the rest.** ``AsyncEngine.end_all``: each request still running gets
   the server's 503 error, a stream as its last event (then ``[DONE]``), a
   non-streamed request as its JSON answer, and its blocks are freed.
4. **Exit.** Once those answers are sent, uvicorn closes the connections and
   the process exits with status 0: the stop was asked for and went as asked.

A second signal during the drain stops at once, as uvicorn does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import uvicorn

logger = logging.getLogger("paged.serve")

DEFAULT_SHUTDOWN_TIMEOUT_S = 25.0  # below Kubernetes' 30 s grace period, after which it sends SIGKILL
ANSWER_GRACE_S = 5.0  # after ending the rest: the time their handlers get to send the error
POLL_S = 0.05


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` with the graceful stop above.

    Args:
        config: uvicorn's ``Config``.
        engine: the ``AsyncEngine`` (``stop_admission``, ``num_streams``, ``end_all``).
        shutdown_timeout: seconds the running requests get to finish after the signal.
        on_start: called with the event loop once it runs (e.g. to install an exception handler).
    """

    def __init__(self, config: uvicorn.Config, engine, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
                 on_start=None) -> None:
        super().__init__(config)
        self.engine = engine
        self.shutdown_timeout = shutdown_timeout
        self.on_start = on_start
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        if self.on_start is not None:
            self.on_start(self._loop)
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        """The signal handler: the first SIGTERM / SIGINT starts the drain; anything else is uvicorn's."""
        if self.draining or self._loop is None or sig not in (signal.SIGTERM, signal.SIGINT):
            return super().handle_exit(sig, frame)
        self.draining = True  # not recorded as uvicorn's captured signal: the process is not re-killed by it
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self.drain(signal.Signals(sig).name)))

    async def drain(self, why: str) -> None:
        """Steps 1-4 of the module's docstring."""
        engine = self.engine
        engine.stop_admission(f"the server is stopping ({why}) and takes no new requests; retry shortly, "
                              "here once it is back or on another server")
        deadline = time.monotonic() + self.shutdown_timeout
        logger.info("%s: no new requests; %d running get up to %g s to finish (--shutdown-timeout)",
                    why, engine.num_streams, self.shutdown_timeout)
        while engine.num_streams and time.monotonic() < deadline and not self.should_exit:
            await asyncio.sleep(POLL_S)
        if engine.num_streams:
            logger.warning("ending %d request(s) still running after --shutdown-timeout %g s", engine.num_streams,
                           self.shutdown_timeout)
            engine.end_all(f"the server is stopping ({why}) and ended this request after --shutdown-timeout "
                           f"{self.shutdown_timeout:g} s; retry it, here once the server is back or on another")
        grace = time.monotonic() + ANSWER_GRACE_S
        while self.server_state.tasks and time.monotonic() < grace:  # uvicorn's request tasks, not this one
            await asyncio.sleep(POLL_S)  # the ended requests' handlers send their error
        self.should_exit = True
