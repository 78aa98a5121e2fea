"""``python -m paged.bench tp_network`` end to end, on one small condition and one cut (two namespaces, as root).

The benchmark's whole table takes minutes; this runs the smallest case of
each of its two halves, and checks what its rows claim:

* ``rate:100mbit``: the link probe measures at most 100 Mbit/s (toleranced by
  ``TBF_RATE_RTOL``: the bucket's burst), and the two-host engine still
  decodes (tokens per second > 0, one plan broadcast per iteration);
* ``cut:reset`` while the server is idle: ``/health`` still answers 200 (the
  server has had no reason to look), the next stream ends with an error
  naming rank 1 and its host within ``NEXT_REQUEST_S`` — not after the
  collective's timeout (30 s here), which is what it took before the driver
  checked the heartbeats before each plan — both hosts exit non-zero and no
  process, namespace, qdisc or nft table is left.

Skipped, with the reason, without root, ``ip``, ``tc`` or ``nft``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paged.bench.netns import unavailable
from tests.tolerances import TBF_RATE_RTOL

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTED_TIMEOUT_S = 30  # what the next request would wait without the check before each plan
NEXT_REQUEST_S = 5.0  # the check, the fault grace's first poll, a loaded machine
LOST = "rank 1 on host 10.233.0.2 (node 1)"

pytestmark = pytest.mark.slow
_why = unavailable() or next((f"`{t}` is not installed" for t in ("tc", "nft") if shutil.which(t) is None), None)
if _why:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"two namespaces with link faults cannot be made here: {_why}")]


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def test_tp_network_measures_a_capped_link_and_an_idle_cut_fails_the_next_request_at_once():
    bench = subprocess.Popen([sys.executable, "-m", "paged.bench", "tp_network", "--no-local", "--faults",
                              "rate:100mbit,cut:reset", "--cut-when", "idle", "--num-seqs", "2", "--steps", "2",
                              "--rounds", "1", "--distributed-timeout", str(DISTRIBUTED_TIMEOUT_S), "--json"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = bench.communicate(timeout=900)
    assert bench.returncode == 0, stderr[-4000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    capped = out["results"]["tp=2 two hosts, tbf 100mbit"]
    assert 0 < capped["link"]["mbit_s"] <= 100 * (1 + TBF_RATE_RTOL), capped
    assert capped["tokens_per_s"] > 0 and capped["broadcast"]["calls"] == 1, capped
    cut = out["cuts"]["tp=2 two hosts, cut: nft reject with tcp reset, while idle"]
    assert cut["health_after_idle"] == 200, cut
    assert cut["hung"] is None and cut["streams_with_error"] == 1 and LOST in cut["error"], cut
    assert cut["streams_ended_s"][0] < NEXT_REQUEST_S, cut
    assert cut["server_exit"] not in (None, 0) and cut["headless_exit"] not in (None, 0), cut
    assert cut["left"] == [] and cut["probe"]["error"].startswith("ConnectionRefusedError"), cut
    ours = f"paged-{bench.pid % 100000}x"  # netns.TwoHosts names its namespaces after the creating process
    assert ours not in _namespaces()  # gone, and the qdiscs and nft tables inside them with them
