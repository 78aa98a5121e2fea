"""Tensor parallelism across two hosts, over a real (virtual) network on one machine (paper §4.6).

Two network namespaces joined by a veth pair (``paged.bench.netns``) are two
hosts: host A (10.233.0.1) runs the driver — ``python -m paged.serve
--tensor-parallel-size 2 --nnodes 2 --master-addr 10.233.0.1`` — and host B
(10.233.0.2) the headless worker — the same with ``--node-rank 1 --headless``.
Each sees only its end of the link, so every plan and every all-reduce
crosses it. The HTTP client runs inside A (``paged/bench/netns_client.py``).

What must hold:

* greedy completions of tp = 2 across the hosts equal tp = 1 (a server of
  its own in A), text for text — in float64, where the all-reduce's other
  summation order cannot flip a greedy choice on these prompts (the same
  level as ``test_tensor_parallel.py``);
* a stream runs to ``[DONE]`` while other requests load the server;
* killing the remote rank (SIGKILL), or cutting the link (``ip link set
  down``), mid-stream ends every open stream with an error that names rank 1
  and host 10.233.0.2; the driver exits non-zero naming them, the headless
  host exits, and no process is left in either namespace. Every wait is
  bounded (``--distributed-timeout`` bounds the collective a cut link stalls).

Without root (or without iproute2) the test is skipped, with the reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from paged.bench import netns_client
from paged.bench.netns import TwoHosts, unavailable
from paged.bench.netns_client import StreamClient
from paged.demo import DEFAULT_MODEL_PATH

ROOT = Path(__file__).resolve().parents[2]
PORT, REF_PORT, MASTER_PORT = 8000, 8001, 29600  # inside fresh namespaces: nothing else listens there
STARTUP_TIMEOUT_S = 240  # three Python processes importing torch on a loaded 2-core machine
EXIT_TIMEOUT_S = 60  # the driver and the headless host, once the fault is noticed
DISTRIBUTED_TIMEOUT_S = 10  # a collective stalled by the cut link fails after this
CLIENT_TIMEOUT_S = 180
LONG = 400  # tokens per stream in the fault cases: still running when the fault comes
PROMPTS = ["def add(a, b):", "for i in range(", "import os\n", "class Node:"]
SERVER = ["--model", str(DEFAULT_MODEL_PATH), "--served-model-name", "m", "--dtype", "float64", "--device", "cpu",
          "--attention-backend", "reference", "--block-size", "8", "--num-blocks", "256", "--seed", "0"]
LOST = "rank 1 on host 10.233.0.2 (node 1)"

pytestmark = pytest.mark.slow
_why = unavailable()
if _why:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"two network namespaces cannot be made here: {_why}")]


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


class Proc:
    """A process in a namespace whose output goes to a file (read back for the asserts and the failures)."""

    def __init__(self, hosts: TwoHosts, side: str, cmd: list[str], log: Path) -> None:
        self.log_path = log
        self.log = open(log, "w+")
        self.proc = hosts.popen(side, cmd, stdout=self.log, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()


def start(hosts: TwoHosts, tmp: Path, name: str, tp: int, port: int = PORT) -> tuple[Proc, Proc | None]:
    """tp = 1: a server in A. tp = 2: the driver in A and the headless rank in B (B first: it waits)."""
    across = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", hosts.address["a"],
              "--master-port", str(MASTER_PORT), "--distributed-timeout", str(DISTRIBUTED_TIMEOUT_S),
              "--join-timeout", str(STARTUP_TIMEOUT_S)]
    worker = None
    if tp == 2:
        worker = Proc(hosts, "b", _python("-m", "paged.serve", *SERVER, *across, "--node-rank", "1", "--headless"),
                      tmp / f"{name}-b.log")
    driver = Proc(hosts, "a", _python("-m", "paged.serve", *SERVER, "--port", str(port), *(across if tp == 2 else [])),
                  tmp / f"{name}-a.log")
    return driver, worker


def wait_healthy(hosts: TwoHosts, driver: Proc, worker: Proc | None, port: int = PORT) -> None:
    try:
        netns_client.wait_healthy(hosts, port, [p.proc for p in (driver, worker) if p is not None], STARTUP_TIMEOUT_S)
    except RuntimeError as exc:
        logs = "\n".join(p.output()[-4000:] for p in (driver, worker) if p is not None)
        raise AssertionError(f"{exc}:\n{logs}") from None


def stream_client(hosts: TwoHosts, bodies: list[dict], port: int = PORT) -> StreamClient:
    """``netns_client.py`` in namespace A, sending ``bodies`` to ``port``."""
    return StreamClient(hosts, bodies, port, CLIENT_TIMEOUT_S, env=_env())


def greedy(prompt: str, stream: bool = False, max_tokens: int = 24) -> dict:
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
            "ignore_eos": True}


def assert_fault_contained(hosts: TwoHosts, client: StreamClient, driver: Proc, worker: Proc, cut: bool) -> str:
    """Every stream ended with an error naming the lost rank and host; both sides exited; nothing is left."""
    t = time.monotonic()
    outcomes = client.results()
    for o in outcomes:
        assert o["error"] and LOST in o["error"], o  # an error event (then [DONE]), naming the lost rank
    code = driver.proc.wait(EXIT_TIMEOUT_S)
    assert code != 0 and "error: the engine failed" in driver.output() and LOST in driver.output(), driver.output()
    worker_code = worker.proc.wait(EXIT_TIMEOUT_S)
    assert worker_code != 0, worker.output()
    if cut:
        assert "rank 1: lost the driver at 10.233.0.1" in worker.output(), worker.output()
    left = [(side, pid) for side in "ab" for pid in hosts.pids(side)]
    assert not left, [(s, p, psutil.Process(p).cmdline()) for s, p in left if psutil.pid_exists(p)]
    print(f"\n{'link cut' if cut else 'kill'}: {len(outcomes)} streams ended in {time.monotonic() - t:.1f} s with: "
          f"{outcomes[0]['error'].splitlines()[0]}\n  the driver exited {code}; the headless host exited {worker_code}")
    return outcomes[0]["error"]


def test_tp2_across_two_hosts_equals_tp1_streams_under_load_and_a_killed_remote_rank_is_named(tmp_path):
    """Token-identical greedy text (float64), a stream to [DONE] under load, then SIGKILL of rank 1 on host B."""
    t0 = time.monotonic()
    with TwoHosts() as hosts:
        # tp = 1 (its own server) and the tp = 2 pair start together; the reference answers, then stops
        ref, _ = start(hosts, tmp_path, "tp1", tp=1, port=REF_PORT)
        driver, worker = start(hosts, tmp_path, "tp2", tp=2)
        wait_healthy(hosts, ref, None, REF_PORT)
        reference = stream_client(hosts, [greedy(p) for p in PROMPTS], REF_PORT).results()
        assert [o["error"] for o in reference] == [None] * len(PROMPTS)
        expected = [o["text"] for o in reference]
        ref.proc.terminate()
        assert ref.proc.wait(30) is not None
        wait_healthy(hosts, driver, worker)
        got = stream_client(hosts, [greedy(p) for p in PROMPTS]).results()
        assert [o["error"] for o in got] == [None] * len(PROMPTS)
        assert [o["text"] for o in got] == expected

        # one stream under load: six other requests at once
        load = [greedy(p, max_tokens=16) for p in PROMPTS + PROMPTS[:2]]
        outcomes = stream_client(hosts, [greedy(PROMPTS[0], stream=True, max_tokens=32), *load]).results()
        assert outcomes[0]["done"] and outcomes[0]["error"] is None, outcomes[0]
        assert outcomes[0]["text"].startswith(expected[0]), (outcomes[0]["text"], expected[0])
        assert [(o["error"], o["tokens"]) for o in outcomes[1:]] == [(None, 16)] * len(load)

        # SIGKILL the remote rank mid-stream
        client = stream_client(hosts, [greedy(p, stream=True, max_tokens=LONG) for p in PROMPTS])
        client.wait_first(len(PROMPTS))
        assert hosts.pids("b") == [worker.proc.pid]  # `ip netns exec` execs: the headless host is rank 1 itself
        os.kill(worker.proc.pid, signal.SIGKILL)
        error = assert_fault_contained(hosts, client, driver, worker, cut=False)
        assert "was lost" in error, error
    print(f"  whole test: {time.monotonic() - t0:.0f} s")


def test_a_cut_link_mid_stream_ends_every_stream_naming_the_lost_host(tmp_path):
    """``ip link set down`` under four streams: errors name rank 1 on host B within the distributed timeout."""
    t0 = time.monotonic()
    with TwoHosts() as hosts:
        driver, worker = start(hosts, tmp_path, "cut", tp=2)
        wait_healthy(hosts, driver, worker)
        client = stream_client(hosts, [greedy(p, stream=True, max_tokens=LONG) for p in PROMPTS])
        client.wait_first(len(PROMPTS))
        hosts.link_down()
        assert_fault_contained(hosts, client, driver, worker, cut=True)
    print(f"  whole test: {time.monotonic() - t0:.0f} s")
