"""Two "hosts" on one machine: two network namespaces joined by a veth pair (iproute2, as root).

    with TwoHosts() as hosts:                     # 10.233.0.1 (driver side) <-> 10.233.0.2
        hosts.popen("a", [python, "-m", "paged.serve", ...])
        hosts.link_down()                         # `ip link set ... down`: the cable is cut

Each namespace has its own loopback and its own routing table and sees
only its end of the veth, so the traffic between the two sides crosses a
real (virtual) link and stays inside the pair. Names carry the pid and a
counter, so concurrent runs do not collide. Leaving the ``with`` kills every
process still in either namespace and deletes both (the veth goes with
them, and any qdisc or nft table in them), even after an error. Bandwidth
caps, loss and cuts on the link: ``link_faults.py``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import time

_count = itertools.count()
ADDRESS = {"a": "10.233.0.1", "b": "10.233.0.2"}
CMD_TIMEOUT_S = 30  # any one `ip` / `tc` call


class NamespaceError(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2, no permission); the message says which."""


def unavailable() -> str | None:
    """Why two namespaces cannot be made here, or None when they can (tries one, then deletes it)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root to test across hosts"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (Debian: apt-get install -y iproute2)"
    name = f"paged-probe-{os.getpid()}-{next(_count)}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=CMD_TIMEOUT_S)
    return None


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if r.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class TwoHosts:
    """Namespaces ``a`` and ``b`` with addresses ``ADDRESS["a"]`` and ``ADDRESS["b"]`` on a veth pair."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}x{next(_count)}"
        self.ns = {"a": f"paged-{tag}-a", "b": f"paged-{tag}-b"}
        self.dev = {"a": f"pg{tag}a", "b": f"pg{tag}b"}  # interface names: 15 characters at most
        self.address = dict(ADDRESS)

    def __enter__(self) -> TwoHosts:
        why = unavailable()
        if why:
            raise NamespaceError(why)
        try:
            for side in "ab":
                _ip("netns", "add", self.ns[side])
            _ip("link", "add", self.dev["a"], "netns", self.ns["a"], "type", "veth",
                "peer", "name", self.dev["b"], "netns", self.ns["b"])
            for side in "ab":
                _ip("-n", self.ns[side], "addr", "add", f"{self.address[side]}/24", "dev", self.dev[side])
                _ip("-n", self.ns[side], "link", "set", self.dev[side], "up")
                _ip("-n", self.ns[side], "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running things on a "host" ------------------------------------------------------
    def prefix(self, side: str) -> list[str]:
        """The command prefix that runs a program in namespace ``side``."""
        return ["ip", "netns", "exec", self.ns[side]]

    def popen(self, side: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen([*self.prefix(side), *cmd], **kwargs)

    def pids(self, side: str) -> list[int]:
        """Every process in namespace ``side``."""
        r = subprocess.run(["ip", "netns", "pids", self.ns[side]], capture_output=True, text=True,
                           timeout=CMD_TIMEOUT_S)
        return [int(p) for p in r.stdout.split()]

    # -- the link ----------------------------------------------------------------------------
    def link_down(self) -> None:
        """Cut the cable: both ends down, so nothing crosses either way."""
        for side in "ab":
            _ip("-n", self.ns[side], "link", "set", self.dev[side], "down")

    # -- the end ---------------------------------------------------------------------------------
    def kill_all(self) -> list[int]:
        """SIGKILL every process left in either namespace; returns their pids."""
        left = [p for side in "ab" for p in self.pids(side)]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(self.pids(s) for s in "ab"):
            time.sleep(0.05)
        return left

    def close(self) -> None:
        self.kill_all()
        for side in "ab":
            subprocess.run(["ip", "netns", "del", self.ns[side]], capture_output=True, timeout=CMD_TIMEOUT_S)
