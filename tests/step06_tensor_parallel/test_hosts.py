"""Across hosts without a second host: placement, refusals, the join wait, heartbeats, the culprit's name.

Cheap checks of ``paged.step06_tensor_parallel.hosts`` and the flags of
``python -m paged.serve`` that start it; the two-namespace test
(``test_across_hosts.py``) runs the whole thing over a link.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from paged.demo import DEFAULT_MODEL_PATH
from paged.serve.cli import check_nodes, parser
from paged.step06_tensor_parallel import LLM, WorkerError, free_loopback_port
from paged.step06_tensor_parallel import hosts
from paged.step06_tensor_parallel.hosts import BEAT_KEY, HOST_KEY, Heartbeats, Nodes, wait_for_nodes
from paged.step06_tensor_parallel.worker_group import WorkerGroup, _Worker


def test_nodes_place_ranks_in_order_and_refuse_an_uneven_split():
    nodes = Nodes(nnodes=2, master_addr="10.0.0.1")
    assert [list(nodes.ranks_of(n, 4)) for n in (0, 1)] == [[0, 1], [2, 3]]
    assert [nodes.node_of(r, 4) for r in range(4)] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not split over 2 nodes"):
        nodes.check(3)
    with pytest.raises(ValueError, match=r"node rank must be in \[0, 1\]"):
        nodes.check(4, node_rank=2)
    with pytest.raises(ValueError, match=r"master port must be in \[1, 65535\]"):
        Nodes(2, "10.0.0.1", 70000).check(2)


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "--tensor-parallel-size", "2"],
     "--node-rank must be in [0, 1]"),
    (["--nnodes", "2", "--master-addr", "a", "--tensor-parallel-size", "3"], "does not split over --nnodes 2"),
    (["--nnodes", "2", "--master-addr", "a", "--tensor-parallel-size", "2", "--headless"],
     "--headless is for the worker hosts"),
    (["--nnodes", "2", "--master-addr", "a", "--tensor-parallel-size", "2", "--node-rank", "1"], "add --headless"),
    (["--nnodes", "2", "--tensor-parallel-size", "2"], "--nnodes > 1 needs --master-addr"),
], ids=["node-rank-out-of-range", "uneven-split", "headless-node-0", "worker-node-not-headless", "no-master-addr"])
def test_serve_refuses_an_inconsistent_placement_before_starting(argv, message, capsys):
    p = parser()
    with pytest.raises(SystemExit) as e:
        check_nodes(p, p.parse_args(argv))
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_accepts_the_two_documented_commands():
    p = parser()
    for argv in (["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "10.0.0.1"],
                 ["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                  "--headless"]):
        check_nodes(p, p.parse_args(argv))  # no SystemExit


def _store():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def test_wait_for_nodes_names_the_first_node_missing_with_its_own_ranks_and_how_to_start_it():
    """Six ranks over three nodes; only rank 2 (of node 1) joined: node 1's rank 3 is named, not node 2's."""
    store, nodes = _store(), Nodes(3, "10.0.0.1", 29501)
    store.set(HOST_KEY.format(rank=2), '{"node": 1, "address": "10.0.0.2"}')
    t = time.monotonic()
    with pytest.raises(WorkerError) as e:
        wait_for_nodes(store, nodes, 6, timedelta(seconds=0.3))
    assert time.monotonic() - t < 5
    assert e.value.rank == 3
    text = str(e.value)
    assert "node 1 (rank 3) did not join at 10.0.0.1:29501 within 0 s" in text, text
    assert ("python -m paged.serve --headless --tensor-parallel-size 6 --nnodes 3 --node-rank 1 "
            "--master-addr 10.0.0.1 --master-port 29501") in text, text
    for r in (3, 4, 5):
        store.set(HOST_KEY.format(rank=r), '{"node": 1, "address": "10.0.0.2"}')
    assert sorted(wait_for_nodes(store, nodes, 6, timedelta(seconds=5))) == [2, 3, 4, 5]


def test_the_driver_gives_up_on_a_node_that_never_joins_within_the_join_timeout():
    """Through ``paged.LLM``: node 1 is never started; the error names it within the bound, nothing is left."""
    t = time.monotonic()
    with pytest.raises(WorkerError, match=r"node 1 \(rank 1\) did not join at 127\.0\.0\.1:\d+ within 1 s"):
        LLM(str(DEFAULT_MODEL_PATH), tensor_parallel_size=2, nnodes=2, master_addr="127.0.0.1",
            master_port=free_loopback_port(), join_timeout=1.0)
    assert time.monotonic() - t < 30


def test_heartbeats_call_a_silent_rank_lost_and_a_beating_one_alive(monkeypatch):
    monkeypatch.setattr(hosts, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(hosts, "LOST_AFTER_S", 0.5)
    store, stop = _store(), threading.Event()

    def beat():
        while not stop.wait(0.05):
            store.add(BEAT_KEY.format(rank=1), 1)

    threading.Thread(target=beat, daemon=True).start()
    beats = Heartbeats(store, [1, 2])
    try:
        time.sleep(1.2)
        assert beats.lost() == [2]
        assert beats.silent_for(1) < 0.5 < beats.silent_for(2)
    finally:
        stop.set()
        beats.stop()


def test_a_lost_remote_rank_is_named_with_its_host_and_node():
    class Silent:
        def lost(self):
            return [1]

        def silent_for(self, rank):
            return 12.0

    g = WorkerGroup([_Worker(1, host="10.233.0.2", node=1)])
    g.stopped, g.heartbeats = "test", Silent()
    assert g._poll(remote=True) is False  # lost is not "bad" by itself: only a failed collective asks
    rank, cause, certain = g._culprit()
    assert (rank, certain) == (1, True)
    assert cause.startswith("was lost: no heartbeat for 12 s"), cause
    assert g.workers[0].where() == "rank 1 on host 10.233.0.2 (node 1)"


def test_heartbeats_confirm_a_silent_rank_by_reading_its_counter_again(monkeypatch):
    """A sampler that has not run lately must not call a beating rank lost: ``lost(confirm=True)`` re-reads."""
    monkeypatch.setattr(hosts, "HEARTBEAT_S", 3600.0)  # the sampler never samples within this test
    monkeypatch.setattr(hosts, "LOST_AFTER_S", 0.2)
    store = _store()
    beats = Heartbeats(store, [1, 2])
    try:
        time.sleep(0.3)
        store.add(BEAT_KEY.format(rank=1), 1)  # rank 1 beat; rank 2 did not
        assert beats.lost() == [1, 2]  # the stale view
        assert beats.lost(confirm=True) == [2]
        assert beats.lost() == [2]  # the re-read is remembered
    finally:
        beats.stop()


def test_a_plan_for_a_rank_already_lost_fails_at_once_instead_of_waiting_out_the_collective():
    """An idle server whose remote host went silent (a cut link): the next plan names the rank now; before, the
    broadcast into the cut link waited for the whole ``--distributed-timeout`` (300 s by default)."""
    class Silent:
        def lost(self, confirm=False):
            return [1]

        def silent_for(self, rank):
            return 21.0

        def stop(self):
            pass

    class CutLink:
        broadcasts = 0

        def broadcast_object(self, obj, timeout=None):
            CutLink.broadcasts += 1
            time.sleep(2.0)  # a stand-in for the distributed timeout
            raise RuntimeError("[gloo] Timed out waiting 10000ms for send operation to complete")

        def close(self):
            pass

    g = WorkerGroup([_Worker(1, host="10.233.0.2", node=1)])
    g.group, g.heartbeats = CutLink(), Silent()
    t = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 on host 10\.233\.0\.2 \(node 1\) was lost: no heartbeat for 21 s"):
        g.send(("plan",))
    assert CutLink.broadcasts == 0 and time.monotonic() - t < 1.0
    assert g.stopped == "a worker failed"
