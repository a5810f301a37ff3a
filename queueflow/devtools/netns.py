"""Hosts on one Linux machine: network namespaces on a bridge, and links cut while both ends live.

A :class:`NetLab` gives each simulated host its own network namespace and IPv4 address on a
/24 behind a bridge in the root namespace (whose address is the bridge's: a Kafka broker
listening there is reachable from every host)::

    root namespace:  bridge qf<tag>br 10.a.b.1/24 ── veth qf<tag>h<n> ─┐
    namespace qf-<tag>-<name>:                     veth qf<tag>n<n> ─┘ 10.a.b.<n+1>/24

Run a process on a host with ``ip netns exec`` (:meth:`NetLab.argv`). The nemesis cuts:

* :meth:`NetLab.isolate` / :meth:`NetLab.reconnect`: the host's link down / up (cut from
  everything, both directions);
* :meth:`NetLab.drop` / :meth:`NetLab.allow`: what the host *sends* to some addresses is
  dropped (a one-way cut: a ``clsact`` qdisc on the host's interface, a ``u32`` filter on the
  destination address whose action redirects the packet to a veth that stays down, so the
  kernel drops it; kernels without ``act_gact`` have no ``action drop``);
* :meth:`NetLab.cut_between` / :meth:`NetLab.join`: both directions between two hosts.

Needs root (``CAP_NET_ADMIN``) and iproute2's ``ip`` and ``tc``. Names carry a random tag, so
runs don't collide; :meth:`NetLab.close` deletes the namespaces (their veths go with them) and
the bridge, and :func:`sweep` removes what a killed run left. The command lines are built by
pure functions (``*_commands``), so they are tested without root. Nothing in queueflow's
runtime imports this module (docs/operations.md "Network partitions").
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Host",
    "NetLab",
    "NetLabError",
    "available",
    "bridge_commands",
    "drop_commands",
    "host_commands",
    "sweep",
]

#: Prefix of every name a :class:`NetLab` creates (interfaces, namespaces).
PREFIX = "qf"
#: Linux interface names have at most 15 characters (IFNAMSIZ - 1).
IFNAME_MAX = 15
#: ``tc`` filter priorities used for drops start here (one per dropped destination).
_FIRST_PRIO = 10

Command = list[str]


class NetLabError(RuntimeError):
    """A namespace command failed (not root, no ``ip``/``tc``, a name taken)."""


@dataclass(frozen=True)
class Host:
    """One simulated host.

    Attributes:
        name: the name given to :meth:`NetLab.add_host`.
        netns: its network namespace.
        ip: its IPv4 address (on the lab's /24).
        outer: its veth end in the root namespace (on the bridge).
        inner: its veth end in its namespace.
        sink: a veth in its namespace that stays down: dropped packets are redirected there.
        sink_peer: the other end of ``sink``.
    """

    name: str
    netns: str
    ip: str
    outer: str
    inner: str
    sink: str
    sink_peer: str


def bridge_commands(bridge: str, gateway: str, prefix_len: int = 24) -> list[Command]:
    """The commands that create ``bridge`` with address ``gateway/prefix_len`` and bring it up."""
    _check_ifname(bridge)
    return [
        ["ip", "link", "add", bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{gateway}/{prefix_len}", "dev", bridge],
        ["ip", "link", "set", bridge, "up"],
    ]


def host_commands(host: Host, bridge: str, gateway: str, prefix_len: int = 24) -> list[Command]:
    """The commands that create ``host``'s namespace, its veth pair on ``bridge``, its address
    and default route (via ``gateway``), and its drop sink."""
    for name in (host.outer, host.inner, host.sink, host.sink_peer):
        _check_ifname(name)
    inside = ["ip", "netns", "exec", host.netns]
    return [
        ["ip", "netns", "add", host.netns],
        ["ip", "link", "add", host.outer, "type", "veth", "peer", "name", host.inner],
        ["ip", "link", "set", host.inner, "netns", host.netns],
        ["ip", "link", "set", host.outer, "master", bridge, "up"],
        [*inside, "ip", "addr", "add", f"{host.ip}/{prefix_len}", "dev", host.inner],
        [*inside, "ip", "link", "set", "lo", "up"],
        [*inside, "ip", "link", "set", host.inner, "up"],
        [*inside, "ip", "route", "add", "default", "via", gateway],
        [*inside, "ip", "link", "add", host.sink, "type", "veth", "peer", "name", host.sink_peer],
        [*inside, "tc", "qdisc", "add", "dev", host.inner, "clsact"],
    ]


def drop_commands(host: Host, destination: str, prio: int) -> list[Command]:
    """The command that drops what ``host`` sends to ``destination`` (an IPv4 address), as
    ``tc`` filter priority ``prio`` on its interface's egress."""
    ipaddress.IPv4Address(destination)  # ValueError on anything else
    return [
        [
            *("ip", "netns", "exec", host.netns, "tc", "filter", "add", "dev", host.inner),
            *("egress", "protocol", "ip", "prio", str(prio), "u32"),
            *("match", "ip", "dst", f"{destination}/32"),
            *("action", "mirred", "egress", "redirect", "dev", host.sink),
        ]
    ]


def allow_commands(host: Host, prio: int) -> list[Command]:
    """The command that removes the drop at ``tc`` priority ``prio`` from ``host``."""
    return [
        [
            *("ip", "netns", "exec", host.netns, "tc", "filter", "del", "dev", host.inner),
            *("egress", "prio", str(prio)),
        ]
    ]


def _check_ifname(name: str) -> None:
    if not name or len(name) > IFNAME_MAX or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"not a valid interface name (1-{IFNAME_MAX} characters): {name!r}")


def available() -> str | None:
    """``None`` when namespaces can be made here, else why not (for a clear error)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"iproute2's {' and '.join(missing)} not found on PATH"
    return None


def _run(command: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(command), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetLabError(f"{' '.join(command)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _used_subnets() -> set[str]:
    out = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    return {str(ipaddress.IPv4Interface(m).network) for m in re.findall(r"inet (\S+)", out)}


@dataclass
class NetLab:
    """A bridge and the hosts on it (see the module docstring). Use it as a context manager,
    or call :meth:`close` (in a ``finally`` or a fixture finalizer).

    Args:
        tag: names' distinguishing part: 4 lowercase hex digits (default: random).
        second_octet: the lab's /24 is ``10.<second_octet>.<third>.0`` (third picked free).
    """

    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    second_octet: int = 213
    hosts: dict[str, Host] = field(default_factory=dict)
    _drops: dict[tuple[str, str], int] = field(default_factory=dict)
    _network: ipaddress.IPv4Network | None = None
    _created: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{4}", self.tag):
            raise ValueError(
                f"tag must be 4 lowercase hex digits (names fit 15 characters), got {self.tag!r}"
            )
        if not 0 <= self.second_octet <= 255:
            raise ValueError(f"second_octet must be 0-255, got {self.second_octet}")

    @property
    def bridge(self) -> str:
        """The bridge's interface name in the root namespace."""
        return f"{PREFIX}{self.tag}br"

    @property
    def gateway(self) -> str:
        """The bridge's address: where the root namespace's services listen for the hosts."""
        if self._network is None:
            raise NetLabError("the lab is not created yet (call create())")
        return str(self._network.network_address + 1)

    def create(self) -> NetLab:
        """Create the bridge on a free /24.

        Raises:
            NetLabError: not root, no ``ip``/``tc``, or a command failed.
        """
        why = available()
        if why is not None:
            raise NetLabError(why)
        used = _used_subnets()
        for third in range(int(self.tag, 16) % 200 + 20, 256):
            network = ipaddress.IPv4Network(f"10.{self.second_octet}.{third}.0/24")
            if str(network) not in used:
                self._network = network
                break
        else:
            raise NetLabError(f"no free /24 in 10.{self.second_octet}.0.0/16")
        self._created = True
        for command in bridge_commands(self.bridge, self.gateway):
            _run(command)
        return self

    def __enter__(self) -> NetLab:
        return self.create()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add_host(self, name: str) -> Host:
        """A new host ``name`` (letters and digits) with the next address.

        Raises:
            NetLabError: the lab is not created, or a command failed.
            ValueError: ``name`` is taken or not alphanumeric.
        """
        if self._network is None:
            raise NetLabError("the lab is not created yet (call create())")
        if name in self.hosts or not name.isalnum():
            raise ValueError(f"host name must be new and alphanumeric, got {name!r}")
        n = len(self.hosts)
        host = Host(
            name=name,
            netns=f"{PREFIX}-{self.tag}-{name}",
            ip=str(self._network.network_address + 2 + n),
            outer=f"{PREFIX}{self.tag}h{n}",
            inner=f"{PREFIX}{self.tag}n{n}",
            sink=f"{PREFIX}{self.tag}s{n}",
            sink_peer=f"{PREFIX}{self.tag}t{n}",
        )
        self.hosts[name] = host
        for command in host_commands(host, self.bridge, self.gateway):
            _run(command)
        return host

    def argv(self, host: Host, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host`` (``ip netns exec``; the process keeps this one's pid: ``ip``
        execs it)."""
        return ["ip", "netns", "exec", host.netns, *argv]

    # -- the nemesis ----------------------------------------------------------------------

    def isolate(self, host: Host) -> None:
        """Cut ``host`` from everything (its link down on the bridge side)."""
        _run(["ip", "link", "set", host.outer, "down"])

    def reconnect(self, host: Host) -> None:
        """Undo :meth:`isolate` (its link up)."""
        _run(["ip", "link", "set", host.outer, "up"])

    def drop(self, host: Host, destinations: Iterable[str]) -> None:
        """Drop what ``host`` sends to each address in ``destinations`` (one-way)."""
        for destination in destinations:
            if (host.name, destination) in self._drops:
                continue
            prio = _FIRST_PRIO + len(self._drops)
            while prio in self._drops.values():
                prio += 1
            for command in drop_commands(host, destination, prio):
                _run(command)
            self._drops[(host.name, destination)] = prio

    def allow(self, host: Host, destinations: Iterable[str] | None = None) -> None:
        """Undo :meth:`drop` for ``destinations`` (default: every drop of ``host``)."""
        for (name, destination), prio in list(self._drops.items()):
            if name == host.name and (destinations is None or destination in destinations):
                for command in allow_commands(host, prio):
                    _run(command)
                del self._drops[(name, destination)]

    def cut_between(self, a: Host, b: Host) -> None:
        """Drop everything between ``a`` and ``b``, both ways (others still reach both)."""
        self.drop(a, [b.ip])
        self.drop(b, [a.ip])

    def join(self, a: Host, b: Host) -> None:
        """Undo :meth:`cut_between`."""
        self.allow(a, [b.ip])
        self.allow(b, [a.ip])

    def heal(self) -> None:
        """Every link up and every drop removed."""
        for host in self.hosts.values():
            self.reconnect(host)
            self.allow(host)

    def wait_reachable(self, host: Host, address: str, port: int, timeout_s: float = 10.0) -> float:
        """Wait until a TCP connection from ``host`` to ``address:port`` succeeds (after a
        heal: the bridge forwards again). Returns the seconds waited.

        Raises:
            NetLabError: not reachable within ``timeout_s``.
        """
        started = time.monotonic()
        probe = (
            f"import socket,sys;socket.create_connection(({address!r},{port}),timeout=1).close()"
        )
        python = shutil.which("python3") or "python3"
        while time.monotonic() - started < timeout_s:
            if _run(self.argv(host, [python, "-c", probe]), check=False).returncode == 0:
                return time.monotonic() - started
        raise NetLabError(f"{address}:{port} not reachable from {host.name} in {timeout_s} s")

    def close(self) -> None:
        """Delete every namespace (their veths go with them) and the bridge; idempotent."""
        for host in list(self.hosts.values()):
            _run(["ip", "link", "del", host.outer], check=False)
            _run(["ip", "netns", "del", host.netns], check=False)
        self.hosts.clear()
        self._drops.clear()
        if self._created:
            _run(["ip", "link", "del", self.bridge], check=False)
            self._created = False


def sweep(tag: str | None = None) -> list[str]:
    """Delete the namespaces, veths and bridges of :class:`NetLab` runs (only ``tag``'s, or
    every lab's) that a killed process left behind. Returns what it deleted."""
    if available() is not None:
        return []
    deleted: list[str] = []
    mark = f"{PREFIX}-{tag}-" if tag else f"{PREFIX}-"
    out = _run(["ip", "netns", "list"], check=False).stdout
    for name in re.findall(r"^(\S+)", out, re.MULTILINE):
        if name.startswith(mark) and re.fullmatch(rf"{PREFIX}-[0-9a-f]{{4}}-\w+", name):
            _run(["ip", "netns", "del", name], check=False)
            deleted.append(name)
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    pattern = rf"{PREFIX}{tag or '[0-9a-f]{4}'}(?:br|h\d+)"
    for name in re.findall(rf"^\d+: ({pattern})[@:]", links, re.MULTILINE):
        _run(["ip", "link", "del", name], check=False)
        deleted.append(name)
    return deleted


def free_port(address: str) -> int:
    """A free TCP port on ``address`` (e.g. the lab's gateway)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])
