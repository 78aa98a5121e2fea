"""Faults on the link between two namespaces: a bandwidth cap, packet loss, a delay, a cut.

    with TwoHosts() as hosts:
        with link_fault(hosts, Fault.parse("rate:10mbit")):   # tc tbf on both ends of the veth
            ...                                               # every packet between A and B is capped
        # here the qdisc is gone again, even if the body raised

Each fault is applied on both ends of the veth pair, so both directions see
it, and touches only the veth: the loopback inside each namespace (the HTTP
client and its server in A) stays clean. The kinds, and the kernel piece each
needs:

* ``rate:10mbit`` — ``tc qdisc … tbf``, a token bucket: a bandwidth cap.
* ``loss:5`` — an nftables rule ``numgen random mod 100 < 5 drop`` on the
  input hook: 5 % of the packets arriving from the other host are dropped
  (TCP retransmits them, after its retransmission timeout).
* ``delay:5ms`` — ``tc qdisc … netem delay``: needs the kernel's ``sch_netem``,
  which not every kernel has (then the fault is refused with tc's reason).
* ``cut:reset`` — nftables ``reject with tcp reset``: every TCP packet from
  the other host is answered with a reset, as a firewall that closes the path
  does; both ends learn at their next packet. The resets themselves are let in.
* ``cut:silent`` — nftables ``drop`` of every packet: the cable is pulled; no
  packet says so, and only timeouts notice.
* ``none`` — the link as it is.

Everything lives inside the two namespaces (a qdisc on a device, an nft table
of the namespace), so deleting the namespaces removes it too; ``link_fault``
removes it on leaving anyway and checks that nothing is left (``leftovers``),
so the next fault starts from a clean link.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass

from paged.bench.netns import CMD_TIMEOUT_S, NamespaceError, TwoHosts

TABLE = "paged_fault"  # the nft table (family inet) a fault adds in each namespace
KINDS = ("none", "rate", "loss", "delay", "cut")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
_UNIT_BITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_DELAY = re.compile(r"^\d+(?:\.\d+)?(us|ms|s)$")
TBF_LATENCY = "100ms"  # how long a packet may wait in the bucket's queue before tbf drops it
TBF_MIN_BURST = 32 * 1024  # bytes: at least a few full-size packets, or low rates cannot send one


@dataclass(frozen=True)
class Fault:
    """One link condition: ``kind`` in ``KINDS`` and its ``value`` (``10mbit``, ``5`` %, ``5ms``, ``reset``)."""

    kind: str
    value: str = ""

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``none``, ``rate:10mbit``, ``loss:5``, ``delay:5ms``, ``cut:reset`` or ``cut:silent``.

        Raises:
            ValueError: an unknown kind or a value out of its range, naming both.
        """
        kind, _, value = text.strip().partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown link fault {text!r}: the kinds are {', '.join(KINDS)} (e.g. rate:10mbit)")
        if kind == "none":
            if value:
                raise ValueError(f"link fault 'none' takes no value, got {text!r}")
        elif kind == "rate" and not _RATE.match(value):
            raise ValueError(f"rate must be a number and kbit, mbit or gbit (e.g. rate:100mbit), got {value!r}")
        elif kind == "loss" and not (value.isdigit() and 1 <= int(value) <= 99):
            raise ValueError(f"loss must be a whole percentage in [1, 99] (e.g. loss:5; every packet: cut:silent), "
                             f"got {value!r}")
        elif kind == "delay" and not _DELAY.match(value):
            raise ValueError(f"delay must be a number and us, ms or s (e.g. delay:5ms), got {value!r}")
        elif kind == "cut" and value not in ("reset", "silent"):
            raise ValueError(f"cut must be cut:reset (tcp resets) or cut:silent (every packet dropped), got {value!r}")
        return cls(kind, value)

    def __str__(self) -> str:
        return self.kind if self.kind == "none" else f"{self.kind}:{self.value}"

    @property
    def label(self) -> str:
        """How the table names it: the mechanism, not only the name."""
        cut = "reject with tcp reset" if self.value == "reset" else "drop all"
        return {"none": "none", "rate": f"tbf {self.value}", "loss": f"nft drop {self.value} %",
                "delay": f"netem delay {self.value}", "cut": f"cut: nft {cut}"}[self.kind]

    @property
    def tool(self) -> str | None:
        """The command this fault needs (``tc`` or ``nft``), None for ``none``."""
        return {"rate": "tc", "delay": "tc", "loss": "nft", "cut": "nft"}.get(self.kind)

    def unavailable(self) -> str | None:
        """Why this fault cannot be applied here (its tool is missing), or None."""
        if self.tool and shutil.which(self.tool) is None:
            package = "nftables" if self.tool == "nft" else "iproute2"
            return f"`{self.tool}` is not installed (Debian: apt-get install -y {package})"
        return None

    def tbf_burst(self) -> int:
        """Bytes the bucket holds: 10 ms at the rate, at least ``TBF_MIN_BURST``."""
        number, unit = _RATE.match(self.value).groups()
        return max(TBF_MIN_BURST, int(float(number) * _UNIT_BITS[unit] / 8 * 0.010))

    def nft_rules(self, dev: str) -> list[str]:
        """The input-hook rules on ``dev`` (the veth end), for ``loss`` and ``cut``."""
        if self.kind == "loss":
            return [f'iifname "{dev}" numgen random mod 100 < {self.value} drop']
        if self.value == "reset":  # the other end's resets must come in, or nobody learns of the cut
            return [f'iifname "{dev}" tcp flags & rst == rst accept',
                    f'iifname "{dev}" meta l4proto tcp reject with tcp reset',
                    f'iifname "{dev}" drop']
        return [f'iifname "{dev}" drop']


def _run(hosts: TwoHosts, side: str, cmd: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*hosts.prefix(side), *cmd], input=stdin, capture_output=True, text=True,
                          timeout=CMD_TIMEOUT_S)


def _apply(hosts: TwoHosts, fault: Fault, side: str) -> None:
    dev = hosts.dev[side]
    if fault.kind == "rate":
        cmd = ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", fault.value, "burst",
               str(fault.tbf_burst()), "latency", TBF_LATENCY]
    elif fault.kind == "delay":
        cmd = ["tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", fault.value]
    else:
        rules = "\n".join(f"    {r}" for r in fault.nft_rules(dev))
        script = (f"table inet {TABLE} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n"
                  f"{rules}\n  }}\n}}\n")
        cmd = ["nft", "-f", "-"]
    r = _run(hosts, side, cmd, script if cmd[0] == "nft" else None)
    if r.returncode != 0:
        raise NamespaceError(f"{fault} on host {side} ({' '.join(cmd)}): {r.stderr.strip()}")


def _remove(hosts: TwoHosts, side: str) -> None:
    """Whatever a fault added on ``side``: the root qdisc back to the default, the nft table deleted."""
    if _root_qdisc(hosts, side) is not None:
        _run(hosts, side, ["tc", "qdisc", "del", "dev", hosts.dev[side], "root"])
    if TABLE in _nft_tables(hosts, side):
        _run(hosts, side, ["nft", "delete", "table", "inet", TABLE])


def _root_qdisc(hosts: TwoHosts, side: str) -> str | None:
    """The veth end's root qdisc if one was added (a veth has ``noqueue`` by default), else None."""
    if shutil.which("tc") is None:
        return None
    out = _run(hosts, side, ["tc", "qdisc", "show", "dev", hosts.dev[side]]).stdout
    first = out.strip().splitlines()[0] if out.strip() else ""
    return None if not first or first.startswith("qdisc noqueue") else first


def _nft_tables(hosts: TwoHosts, side: str) -> list[str]:
    """The nft tables of namespace ``side`` (``inet paged_fault`` reads as ``paged_fault``)."""
    if shutil.which("nft") is None:
        return []
    out = _run(hosts, side, ["nft", "list", "tables"]).stdout
    return [line.split()[-1] for line in out.splitlines() if line.startswith("table")]


def leftovers(hosts: TwoHosts) -> list[str]:
    """What a fault left on the link: ``"a: qdisc tbf …"``, ``"b: nft table paged_fault"``; [] when clean."""
    left = []
    for side in "ab":
        qdisc = _root_qdisc(hosts, side)
        if qdisc:
            left.append(f"{side}: {qdisc}")
        left += [f"{side}: nft table {t}" for t in _nft_tables(hosts, side)]
    return left


@contextmanager
def link_fault(hosts: TwoHosts, fault: Fault):
    """Apply ``fault`` on both ends of the link for the ``with`` body; remove it on leaving, even after an error.

    Raises:
        NamespaceError: the fault cannot be applied (its tool is missing, the kernel lacks the qdisc), or
            something of it is still there after removal (the body's own error, if any, comes first).
    """
    why = fault.unavailable()
    if why:
        raise NamespaceError(f"{fault}: {why}")
    failed = False
    try:
        if fault.kind != "none":
            for side in "ab":
                _apply(hosts, fault, side)
        yield fault
    except BaseException:
        failed = True
        raise
    finally:
        for side in "ab":
            _remove(hosts, side)
        left = leftovers(hosts)
        if left and not failed:
            raise NamespaceError(f"{fault} was not removed from the link: {left}")
        if left:  # the body's error is the one to see; this one is only reported
            print(f"warning: {fault} was not removed from the link: {left}", file=sys.stderr)
