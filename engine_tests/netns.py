"""Network namespaces for the partition tests: each engine instance in a namespace of its own,
reaching the database over one veth link and its upstream over another, so a test can cut
either link (``ip link set … down``: packets vanish, connections hang) and heal it again.

Needs root and ``ip`` (iproute2); :func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import attrs

__all__ = ["Namespace", "namespaces", "unavailable"]

Link = Literal["db", "upstream"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need `ip` (iproute2)"
    probe = f"engine-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"cannot make a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


@attrs.frozen
class Namespace:
    """One namespace and its two links. ``db_host`` and ``upstream_host`` are the host's ends:
    listen there, and the namespace reaches you over that link."""

    name: str
    db_host: str
    upstream_host: str
    db_iface: str
    upstream_iface: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self, link: Link) -> None:
        """Take ``link`` down on the host's side: the namespace's packets on it are lost."""
        _ip("link", "set", "dev", self._iface(link), "down")

    def heal(self, link: Link) -> None:
        """Bring ``link`` back up."""
        _ip("link", "set", "dev", self._iface(link), "up")

    def _iface(self, link: Link) -> str:
        return self.db_iface if link == "db" else self.upstream_iface


def _make(index: int, tag: str) -> Namespace:
    name = f"engine-{tag}-{index}"
    _ip("netns", "add", name)
    _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
    hosts = []
    ifaces = []
    for subnet, kind in ((213, "d"), (214, "u")):
        iface = f"e{tag}{kind}{index}"  # at most 15 characters
        _ip("link", "add", iface, "type", "veth", "peer", "name", iface + "p")
        _ip("link", "set", iface + "p", "netns", name)
        _ip("addr", "add", f"10.{subnet}.{index}.1/24", "dev", iface)
        _ip("link", "set", iface, "up")
        _ip("netns", "exec", name, "ip", "addr", "add", f"10.{subnet}.{index}.2/24",
            "dev", iface + "p")  # fmt: skip
        _ip("netns", "exec", name, "ip", "link", "set", iface + "p", "up")
        hosts.append(f"10.{subnet}.{index}.1")
        ifaces.append(iface)
    return Namespace(name, hosts[0], hosts[1], ifaces[0], ifaces[1])


def _remove(ns: Namespace) -> None:
    for iface in (ns.db_iface, ns.upstream_iface):
        subprocess.run(["ip", "link", "del", iface], capture_output=True, timeout=10)
    subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=10)


@contextmanager
def namespaces(count: int) -> Iterator[list[Namespace]]:
    """``count`` namespaces with their links, removed on exit."""
    tag = f"{os.getpid() % 10000}"
    made: list[Namespace] = []
    try:
        for index in range(count):
            made.append(_make(index, tag))
        yield made
    finally:
        for ns in made:
            _remove(ns)
