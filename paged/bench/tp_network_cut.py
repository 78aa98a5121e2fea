"""``tp_network``'s cut: the link between the two hosts cut, under running streams or while idle, and what
everyone sees.

The deployment is the real one: ``python -m paged.serve`` (the driver, the
OpenAI-compatible server) in host A, the headless rank in host B, and an
HTTP client in host A (``netns_client``). The link is cut
(``link_faults``: ``cut:reset`` answers every TCP packet with a reset,
``cut:silent`` drops every packet) at one of two moments:

* under ``CUT_STREAMS`` long greedy streams, once each has its first token;
* while the server is idle; ``IDLE_S`` later (the headless host has given
  up on the driver by then) ``/health`` is asked, and one stream is sent.

Reported, timed from the cut (the streams: from when they were sent):

* what each client got (an error event naming the lost rank, or nothing),
  and when its stream ended; while idle, what ``/health`` said first;
* when the server exited and with what code, and its last word;
* when the headless host exited and with what code, and its last word;
* what a new connection across the link gets now (``link_probe``);
* any process left in either namespace (none may be).

Every wait is bounded: a process that has not exited ``--distributed-timeout``
+ ``CLIENT_SLACK_S`` + ``EXIT_TIMEOUT_S`` seconds after the streams were
sent, or a stream that gets nothing for ``--distributed-timeout`` +
``CLIENT_SLACK_S``, is reported as hung, and killed when the namespaces go.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time

from paged.bench.link_faults import Fault, link_fault
from paged.bench.link_probe import measure_link
from paged.bench.netns import TwoHosts
from paged.bench.netns_client import StreamClient, health_status, wait_healthy
from paged.bench.tp_network_hosts import (EXIT_TIMEOUT_S, MASTER_PORT, ROOT, START_TIMEOUT_S, across_flags, env,
                                          pinned)

PORT = 8000  # the server's, inside host A
CUT_STREAMS = 4
IDLE_S = 10.0  # idle after the cut: longer than the headless host's wait for the driver (hosts.DRIVER_LOST_S)
LONG = 400  # tokens per stream: still running when the cut comes
CLIENT_SLACK_S = 60  # beyond --distributed-timeout: the fault grace, the stop, a loaded machine
PROMPTS = ["def add(a, b):", "for i in range(", "import os\n", "class Node:"]


def _last_word(log, *needles: str) -> str:
    """The last line of ``log`` holding the first of ``needles`` found, else its last line (200 characters)."""
    log.seek(0)
    lines = [line.strip() for line in log.read().splitlines() if line.strip()]
    for needle in needles:
        found = [line for line in lines if needle in line]
        if found:
            return found[-1][:200]
    return lines[-1][:200] if lines else ""


class ExitWatch:
    """Each process's exit code and the seconds from ``since`` to its exit, watched by a thread."""

    def __init__(self, procs: dict[str, subprocess.Popen], since: float) -> None:
        self.procs, self.since, self.exits = procs, since, {}
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while len(self.exits) < len(self.procs):
            for name, p in self.procs.items():
                if name not in self.exits and p.poll() is not None:
                    self.exits[name] = (p.returncode, time.monotonic() - self.since)
            time.sleep(0.02)

    def wait(self, until: float) -> dict[str, tuple[int | None, float]]:
        """Every exit, waiting until the ``time.monotonic()`` ``until``; (None, seconds) for a process still running."""
        while len(self.exits) < len(self.procs) and time.monotonic() < until:
            time.sleep(0.02)
        still = time.monotonic() - self.since
        return {name: self.exits.get(name, (None, still)) for name in self.procs}


def cut(args, fault: Fault, model: str, idle: bool) -> dict:
    """Start the server across the two hosts, cut the link under streams (or while idle), report (see above)."""
    flags = ["--model", model, "--served-model-name", "m", "--dtype", "float32", "--device", "cpu",
             "--attention-backend", "reference", "--block-size", "16", "--num-blocks", "512"]
    with TwoHosts() as hosts, tempfile.TemporaryFile("w+") as log_a, tempfile.TemporaryFile("w+") as log_b:
        across = [*across_flags(hosts, MASTER_PORT), "--distributed-timeout", str(args.distributed_timeout),
                  "--join-timeout", str(START_TIMEOUT_S)]
        worker = hosts.popen("b", [sys.executable, "-m", "paged.serve", *flags, *across, "--node-rank", "1",
                                   "--headless"], stdout=log_b, stderr=subprocess.STDOUT, env=env(), cwd=ROOT,
                             preexec_fn=pinned("b"))
        server = hosts.popen("a", [sys.executable, "-m", "paged.serve", *flags, "--port", str(PORT), *across],
                             stdout=log_a, stderr=subprocess.STDOUT, env=env(), cwd=ROOT, preexec_fn=pinned("a"))
        wait_healthy(hosts, PORT, [server, worker], START_TIMEOUT_S)
        bodies = [{"model": "m", "prompt": p, "max_tokens": LONG, "temperature": 0, "stream": True,
                   "ignore_eos": True} for p in PROMPTS[:1 if idle else CUT_STREAMS]]
        wait_s = args.distributed_timeout + CLIENT_SLACK_S
        if not idle:
            client = StreamClient(hosts, bodies, PORT, wait_s, env=env())
            client.wait_first(len(bodies))
        with link_fault(hosts, fault):
            cut_at = time.monotonic()
            watch = ExitWatch({"server": server, "headless": worker}, cut_at)
            health = None
            if idle:
                time.sleep(IDLE_S)
                health = health_status(hosts, PORT)
                client = StreamClient(hosts, bodies, PORT, wait_s, env=env())
            sent_at = cut_at if not idle else time.monotonic()
            exits = watch.wait(sent_at + wait_s + EXIT_TIMEOUT_S)
            try:  # the events were timed as they arrived
                ends, hung = client.results(), None
            except TimeoutError as exc:
                ends, hung = [], str(exc)
            probe = measure_link(hosts)
        left = [pid for side in "ab" for pid in hosts.pids(side)]
        errors = [e["error"] for e in ends if e["error"]]
        return {
            "fault": str(fault), "idle_s": IDLE_S if idle else None, "health_after_idle": health,
            "streams": len(bodies), "hung": hung, "streams_with_error": len(errors),
            "error": errors[0] if errors else None, "tokens": [e["tokens"] for e in ends],
            "streams_ended_s": [e["t"] - sent_at for e in ends],
            "server_exit": exits["server"][0], "server_exit_s": exits["server"][1],
            "server_said": _last_word(log_a, "error:"),
            "headless_exit": exits["headless"][0], "headless_exit_s": exits["headless"][1],
            "headless_said": _last_word(log_b, "lost the driver", "Error"), "probe": probe, "left": left,
        }


def _exit_text(code: int | None, seconds: float) -> str:
    return f"still running {seconds:.0f} s after the cut (then killed)" if code is None else \
        f"exit code {code}, {seconds:.1f} s after the cut"


def describe(c: dict) -> list[str]:
    """The report of one cut as the table's lines."""
    if "skipped" in c or "error" in c and "streams" not in c:
        return [f"skipped: {c['skipped']}" if "skipped" in c else f"error: {c['error']}"]
    ended = c["streams_ended_s"]
    since = "the cut" if c["idle_s"] is None else "it was sent"
    clients = (f"HUNG: {c['hung']}" if c["hung"] else
               f"{c['streams_with_error']} of {c['streams']} stream(s) ended with an error event "
               f"{min(ended):.1f}-{max(ended):.1f} s after {since}")
    if c["idle_s"] is not None:
        clients = f"idle {c['idle_s']:.0f} s, then GET /health: {c['health_after_idle']}; the next stream: {clients}"
    probe = c["probe"]
    return [
        f"clients:  {clients}",
        f"          {(c['error'] or '').splitlines()[0] if c['error'] else '(no error message)'}",
        f"server:   {_exit_text(c['server_exit'], c['server_exit_s'])}: {c['server_said']}",
        f"headless: {_exit_text(c['headless_exit'], c['headless_exit_s'])}: {c['headless_said']}",
        f"link:     a new connection gets {probe.get('error', 'through')} after {probe.get('after_s', 0):.3f} s",
        f"left:     {'no process in either namespace' if not c['left'] else c['left']}",
    ]
