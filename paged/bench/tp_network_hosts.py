"""``tp_network``'s two-host setups: the deployment that measures under each fault, and where the cuts go.

A measuring deployment is this benchmark's driver (``--role driver``: an
``LLM`` with ``nnodes=2``) in host A and a headless rank (``python -m
paged.serve --headless``) in host B. It starts once and measures under one
fault after the other; the link is changed from here between measurements
(``link_faults``), and ``link_probe`` measures the link under each first. If
the engine fails under a fault, the row says why and the next fault gets a
fresh deployment. The cuts end their deployment by design: each runs one of
its own (``tp_network_cut``).

The two "hosts" share this machine's cores; each is pinned to a core of its
own (when there are two), so neither starts more threads than it has cores
and the rows compare the link, not a fight over the CPU.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from paged.bench.link_faults import Fault, link_fault
from paged.bench.link_probe import measure_link
from paged.bench.netns import NamespaceError, TwoHosts
from paged.bench.netns_client import JsonLines

ROOT = Path(__file__).resolve().parents[2]
MASTER_PORT = 29610  # inside fresh namespaces: nothing else listens there
START_TIMEOUT_S = 600  # two processes importing torch and loading the model on a loaded machine
MEASURE_TIMEOUT_S = 600  # one fault's measurement (a lossy link retransmits after 200 ms and more)
EXIT_TIMEOUT_S = 60


def cpu_name() -> str:
    """``lscpu``'s model name, family and model (``AMD EPYC, family 25 model 17``), else the platform's."""
    fields = {}
    for line in open("/proc/cpuinfo"):
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    return f"{fields['model name']}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}, " \
           f"{os.cpu_count()} cores"


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def pinned(side: str):
    """A ``preexec_fn`` that pins host ``side``'s process to a core of its own (None on one core)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    core = cores[0] if side == "a" else cores[1]
    return lambda: os.sched_setaffinity(0, {core})


def across_flags(hosts: TwoHosts, master_port: int) -> list[str]:
    return ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", hosts.address["a"],
            "--master-port", str(master_port)]


class Measuring:
    """The driver in host A and the headless rank in host B, ready to measure (``measure``) until ``close``."""

    def __init__(self, args, hosts: TwoHosts, model: str) -> None:
        self.log = tempfile.TemporaryFile("w+")  # host B's output, for the reason it failed
        self.worker = hosts.popen("b", [sys.executable, "-m", "paged.serve", "--model", model, "--dtype", "float32",
                                        "--device", "cpu", *across_flags(hosts, MASTER_PORT), "--node-rank", "1",
                                        "--headless"], stdout=self.log, stderr=subprocess.STDOUT, env=env(),
                                  cwd=ROOT, preexec_fn=pinned("b"))
        self.driver = hosts.popen("a", [sys.executable, "-m", "paged.bench", "tp_network", "--role", "driver",
                                        "--master-addr", hosts.address["a"], "--master-port", str(MASTER_PORT),
                                        "--model", model, "--num-seqs", str(args.num_seqs), "--steps",
                                        str(args.steps)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env(), cwd=ROOT, preexec_fn=pinned("a"))
        self.lines = JsonLines(self.driver, MEASURE_TIMEOUT_S, "the two-host driver")
        try:
            self.lines.next(START_TIMEOUT_S)  # {"ready": true}
        except TimeoutError as exc:
            self.close()
            raise RuntimeError(f"the two-host deployment did not start: {exc}; host B said:\n{self.tail()}") from None

    def tail(self) -> str:
        self.log.seek(0)
        return "".join(self.log.readlines()[-20:])

    def measure(self, fault: Fault) -> dict:
        """One measurement on the link as it is now; ``{"error": …}`` if the engine failed (then it is gone)."""
        try:
            self.driver.stdin.write(f"{fault}\n")
            self.driver.stdin.flush()
            out = self.lines.next()
        except (TimeoutError, BrokenPipeError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        out.pop("t", None)
        out.pop("fault", None)
        return out

    def close(self) -> None:
        try:
            self.driver.stdin.close()
        except BrokenPipeError:
            pass
        for p in (self.driver, self.worker):
            try:
                p.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.log.close()


def combine(runs: list[dict]) -> dict:
    """One row from several rounds of one setup: each figure's median over the rounds, the slowest step of all."""
    def med(get):
        return statistics.median(get(r) for r in runs)

    out = {"rounds": len(runs), "iterations": runs[0]["iterations"], "step_ms": med(lambda r: r["step_ms"]),
           "median_step_ms": med(lambda r: r["median_step_ms"]), "max_step_ms": max(r["max_step_ms"] for r in runs),
           "tokens_per_s": med(lambda r: r["tokens_per_s"])}
    if "link" in runs[0]:
        out["link"] = {k: med(lambda r: r["link"][k]) for k in ("rtt_ms", "mbit_s")}
    for kind in ("broadcast", "all_reduce", "all_gather"):
        if kind in runs[0]:
            out[kind] = {**runs[0][kind], "ms": med(lambda r: r[kind]["ms"])}
    return out


def measure_faults(args, faults: list[Fault], model: str) -> dict[str, dict]:
    """One row per fault: the link probe's round trip and throughput, then ``tp_network.measure``'s figures.

    The faults take turns, ``args.rounds`` times over (none, 1gbit, …, none, 1gbit, …), and each row holds
    the medians over its rounds (``combine``): a load that comes and goes on the machine spreads over all
    the rows instead of landing on one.
    """
    runs: dict[Fault, list[dict]] = {f: [] for f in faults}
    ended: dict[Fault, dict] = {}  # a fault that could not be applied, or under which the engine failed
    queue = [f for _ in range(args.rounds) for f in faults]
    while queue:
        with TwoHosts() as hosts:
            deployment = Measuring(args, hosts, model)
            try:
                while queue:
                    fault = queue.pop(0)
                    if fault in ended:
                        continue
                    try:
                        with link_fault(hosts, fault):
                            link = measure_link(hosts)
                            m = deployment.measure(fault)
                    except NamespaceError as exc:
                        ended[fault] = {"fault": str(fault), "skipped": str(exc)}
                        continue
                    if "error" in m:
                        ended[fault] = {"fault": str(fault), "link": link, **m}
                        break  # the engine is stopped; the next fault starts a fresh deployment
                    runs[fault].append({"link": link, **m})
            finally:
                deployment.close()
    return {f"tp=2 two hosts, {f.label}": ended.get(f) or {"fault": str(f), **combine(runs[f])} for f in faults}
