"""Which rank the error names, when several fail at once (no processes: synthetic reports).

A worker that dies or raises breaks the collectives of every other rank, so
the driver usually sees several failures: the root cause, and broken
connections that followed it. ``WorkerGroup._culprit`` must name the root
cause: a model error (even one reported later) before a death without a
report, before the earliest broken-connection report.
"""

from types import SimpleNamespace

import pytest

from paged.step06_tensor_parallel.group import is_communication_error
from paged.step06_tensor_parallel.worker_group import WorkerGroup, _describe_exit, _Worker

BROKEN = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5000"


def report(rank, what, at, from_collective):
    return ("error", rank, what, f"Traceback of {rank}\n", at, from_collective)


def group(*workers):
    g = WorkerGroup(list(workers))
    g.stopped = "test"  # nothing to stop at exit
    return g


def alive(rank, pid=100):
    return _Worker(rank, SimpleNamespace(exitcode=None, pid=pid + rank))


def dead(rank, code, pid=100):
    return _Worker(rank, SimpleNamespace(exitcode=code, pid=pid + rank))


def test_culprit_a_death_outranks_the_broken_connections_it_caused():
    w1, w2, w3 = dead(1, 1), dead(2, -9), dead(3, 1)
    w1.report = report(1, BROKEN, at=1.0, from_collective=True)
    w3.report = report(3, BROKEN, at=2.0, from_collective=True)
    rank, cause, certain = group(w1, w2, w3)._culprit()
    assert (rank, certain) == (2, True)
    assert cause == "(pid 102) was killed by signal SIGKILL (exit code -9)"


def test_culprit_a_model_error_outranks_earlier_broken_connections_and_deaths():
    w1, w2, w3 = dead(1, 1), dead(2, -15), dead(3, 1)
    w1.report = report(1, BROKEN, at=1.0, from_collective=True)
    w3.report = report(3, "ValueError: bad shape", at=5.0, from_collective=False)
    rank, cause, certain = group(w1, w2, w3)._culprit()
    assert (rank, certain) == (3, True)
    assert cause.startswith("raised ValueError: bad shape\n--- traceback of rank 3 ---\nTraceback of 3")


def test_culprit_only_broken_connections_names_the_earliest_uncertainly():
    w1, w2 = alive(1), alive(2)
    w1.report = report(1, BROKEN, at=3.0, from_collective=True)
    w2.report = report(2, BROKEN, at=2.0, from_collective=True)
    assert group(w1, w2)._culprit() == (2, f"raised {BROKEN}", False)


def test_culprit_none_while_everyone_is_healthy():
    assert group(alive(1), alive(2), _Worker(3))._culprit() is None  # _Worker(3): started by torchrun


@pytest.mark.parametrize("code, text", [(-9, "was killed by signal SIGKILL (exit code -9)"),
                                        (-2, "was killed by signal SIGINT (exit code -2)"),
                                        (1, "exited with code 1")])
def test_describe_exit(code, text):
    assert _describe_exit(code) == text


def test_communication_errors_are_told_from_model_errors():
    assert is_communication_error(RuntimeError(BROKEN))
    assert is_communication_error(RuntimeError("[gloo] Timed out waiting 300000ms for recv operation"))
    assert not is_communication_error(RuntimeError("injected fault"))
    assert not is_communication_error(ValueError("Connection closed"))  # not from a collective
