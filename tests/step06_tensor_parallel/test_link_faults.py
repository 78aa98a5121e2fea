"""Faults on the link between two namespaces: each one does what it says, and none outlives its ``with``.

``paged.bench.link_faults`` puts a bandwidth cap (``tc tbf``), packet loss and
cuts (nftables) on the veth between two namespaces, for ``python -m
paged.bench tp_network``. What must hold, measured with a TCP connection
across the link (``link_probe``), no model and no torch process involved:

* a 10 Mbit/s cap carries at most ``TBF_RATE_RTOL`` more than 10 Mbit/s, and
  once its ``with`` is left the link carries far more again;
* ``cut:reset`` refuses a connection at once; ``cut:silent`` leaves it to
  time out; ``loss:5`` is a rule of the kernel's on each end's device (that
  TCP then loses 5 % of the packets is the kernel's word, not checked here);
* no qdisc and no nft table is left after the ``with``, also when the body
  raised or the fault failed half-way (one end applied, the other refused),
  and no namespace or veth is left after ``TwoHosts``.

Bad fault names are refused with the kind and the bound (no root needed).
Without root, ``ip``, ``tc`` or ``nft`` the link tests skip, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from paged.bench.link_faults import TABLE, Fault, leftovers, link_fault
from paged.bench.link_probe import CONNECT_TIMEOUT_S, measure_link
from paged.bench.netns import NamespaceError, TwoHosts, unavailable
from tests.tolerances import TBF_RATE_RTOL

PROBE_S = 0.5  # seconds of bulk sending per measurement
FREE_LINK_MBIT = 50  # an uncapped veth carries Gbit/s; anything under this means a cap was left on
REFUSED_WITHIN_S = 1.0  # a reset comes back in one round trip (~0.1 ms), plus a loaded machine's scheduling

_why = unavailable() or next((f"`{t}` is not installed (Debian: apt-get install -y "
                              f"{'nftables' if t == 'nft' else 'iproute2'})" for t in ("tc", "nft")
                              if shutil.which(t) is None), None)
needs_link = pytest.mark.skipif(_why is not None, reason=f"link faults cannot be applied here: {_why}")


@pytest.mark.parametrize("text, message", [
    ("rate:10", "rate must be a number and kbit, mbit or gbit"),
    ("rate:fast", "rate must be a number and kbit, mbit or gbit"),
    ("loss:0", r"loss must be a whole percentage in \[1, 99\]"),
    ("loss:100", r"loss must be a whole percentage in \[1, 99\] \(e.g. loss:5; every packet: cut:silent\)"),
    ("loss:2.5", r"loss must be a whole percentage in \[1, 99\]"),
    ("delay:5", "delay must be a number and us, ms or s"),
    ("cut:down", "cut must be cut:reset"),
    ("none:1", "'none' takes no value"),
    ("jitter:5ms", "unknown link fault 'jitter:5ms': the kinds are none, rate, loss, delay, cut"),
])
def test_fault_parse_refuses_a_bad_fault_naming_the_kind_and_the_bound(text, message):
    with pytest.raises(ValueError, match=message):
        Fault.parse(text)


def test_fault_parse_reads_back_what_it_prints():
    for text in ("none", "rate:1gbit", "rate:8.5mbit", "loss:5", "delay:500us", "cut:reset", "cut:silent"):
        assert str(Fault.parse(text)) == text


@needs_link
def test_a_10mbit_cap_carries_at_most_10mbit_and_the_link_is_free_again_after():
    """Toleranced: the bucket's burst and the first-to-last-arrival clock add up to ``TBF_RATE_RTOL``."""
    with TwoHosts() as hosts:
        with link_fault(hosts, Fault.parse("rate:10mbit")):
            capped = measure_link(hosts, PROBE_S)
        free = measure_link(hosts, PROBE_S)
    assert 5 < capped["mbit_s"] <= 10 * (1 + TBF_RATE_RTOL), capped
    assert free["mbit_s"] > FREE_LINK_MBIT, free


@needs_link
def test_a_reset_cut_refuses_at_once_and_a_silent_cut_times_out():
    with TwoHosts() as hosts:
        with link_fault(hosts, Fault.parse("cut:reset")):
            reset = measure_link(hosts, PROBE_S)
        with link_fault(hosts, Fault.parse("cut:silent")):
            silent = measure_link(hosts, PROBE_S)
    assert reset["error"].startswith("ConnectionRefusedError") and reset["after_s"] < REFUSED_WITHIN_S, reset
    assert silent["error"].startswith("TimeoutError") and silent["after_s"] >= 0.9 * CONNECT_TIMEOUT_S, silent


@needs_link
def test_loss_is_a_kernel_rule_on_each_end_of_the_link_only():
    with TwoHosts() as hosts, link_fault(hosts, Fault.parse("loss:5")):
        for side in "ab":
            rules = subprocess.run([*hosts.prefix(side), "nft", "list", "table", "inet", TABLE], capture_output=True,
                                   text=True, check=True).stdout
            assert f'iifname "{hosts.dev[side]}" numgen random mod 100 < 5 drop' in rules, rules
            assert rules.count("drop") == 1, rules  # nothing else: the namespace's loopback stays clean


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def _root_links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


@needs_link
def test_nothing_is_left_after_a_failing_body_a_half_applied_fault_or_the_hosts():
    with TwoHosts() as hosts:
        for fault in ("rate:10mbit", "cut:reset"):  # one qdisc, one nft table
            with pytest.raises(RuntimeError, match="the run failed"):
                with link_fault(hosts, Fault.parse(fault)):
                    assert len(leftovers(hosts)) == 2, leftovers(hosts)  # one per end: leftovers sees them
                    raise RuntimeError("the run failed")
            assert leftovers(hosts) == []
        # host B's end already has a root qdisc: the cap goes on A's end, then B's `tc` refuses
        subprocess.run([*hosts.prefix("b"), "tc", "qdisc", "add", "dev", hosts.dev["b"], "root", "tbf", "rate",
                        "1mbit", "burst", "32kb", "latency", "100ms"], check=True)
        with pytest.raises(NamespaceError, match="rate:10mbit on host b"):
            with link_fault(hosts, Fault.parse("rate:10mbit")):
                pass
        assert leftovers(hosts) == []
        assert measure_link(hosts, PROBE_S)["mbit_s"] > FREE_LINK_MBIT
        names = list(hosts.ns.values()) + list(hosts.dev.values())
        assert all(n in _namespaces() + _root_links() for n in hosts.ns.values())
    assert not [n for n in names if n in _namespaces() or n in _root_links()]
