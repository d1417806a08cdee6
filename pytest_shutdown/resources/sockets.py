"""The kernel's socket tables (``/proc/net/{tcp,tcp6,udp,udp6,unix}``), matched by inode.

A socket descriptor reads as ``socket:[INODE]`` in ``/proc/PID/fd``; the tables say what that
inode is. They are read only when a socket has to be described or a bound one found.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping

from pytest_shutdown._fast.cheap import socket_inode
from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass

__all__ = ["SocketInfo", "read_socket_table", "socket_inode"]

#: TCP state LISTEN and UDP state CLOSE (an unconnected bound UDP socket) in the tables.
_TCP_LISTEN = "0A"
_UDP_UNCONNECTED = "07"
#: ``__SO_ACCEPTCON``: a listening unix socket.
_UNIX_ACCEPTCON = 0x10000


@lazy_dataclass(frozen=True)
class SocketInfo:
    """One socket as the kernel's tables show it."""

    inode: int
    protocol: str  # "tcp", "tcp6", "udp", "udp6", "unix"
    local: str  # "127.0.0.1:8000", "[::1]:8000", a unix path, "@abstract" or ""
    remote: str = ""
    listening: bool = False
    port: int | None = None

    @property
    def bound(self) -> bool:
        """A listening TCP socket, a bound unconnected UDP socket, or a unix socket with a
        name: what holds a port or a socket file."""
        if self.protocol == "unix":
            return bool(self.local)
        return self.listening

    def describe(self) -> str:
        if self.protocol == "unix":
            state = "listening " if self.listening else ""
            name = self.local or "unnamed"
            peer = "" if not self.remote else f" -> {self.remote}"
            return f"{state}unix socket {name}{peer}"
        if self.listening:
            verb = "listening on" if self.protocol.startswith("tcp") else "bound to"
            return f"{self.protocol.upper()} socket {verb} {self.local}"
        remote = f" -> {self.remote}" if self.remote else ""
        return f"{self.protocol.upper()} socket {self.local}{remote}"


def _address(text: str, v6: bool) -> tuple[str, int]:
    host_hex, _, port_hex = text.partition(":")
    port = int(port_hex, 16)
    raw = bytes.fromhex(host_hex)
    if v6:
        # four little-endian 32-bit words
        packed = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        host = f"[{ipaddress.IPv6Address(packed)}]"
    else:
        host = socket.inet_ntoa(raw[::-1])
    return host, port


def _rows(path: str) -> list[str]:
    """The rows of a ``/proc/net`` table (its header left out); none when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()[1:]
    except OSError:
        return []


def _inet(path: str, protocol: str, wanted: set[int] | None) -> Iterable[SocketInfo]:
    v6 = protocol.endswith("6")
    for line in _rows(path):
        fields = line.split()
        if len(fields) < 10:
            continue
        try:
            inode = int(fields[9])
        except ValueError:
            continue
        if wanted is not None and inode not in wanted:
            continue
        try:
            host, port = _address(fields[1], v6)
            rhost, rport = _address(fields[2], v6)
        except ValueError:
            continue
        state = fields[3]
        listening = (
            state == _TCP_LISTEN
            if protocol.startswith("tcp")
            else state == _UDP_UNCONNECTED and port != 0 and rport == 0
        )
        remote = f"{rhost}:{rport}" if rport else ""
        yield SocketInfo(inode, protocol, f"{host}:{port}", remote, listening, port)


def _unix(path: str, wanted: set[int] | None) -> Iterable[SocketInfo]:
    for line in _rows(path):
        fields = line.split(None, 7)
        if len(fields) < 7:
            continue
        try:
            inode = int(fields[6])
            flags = int(fields[3], 16)
        except ValueError:
            continue
        if wanted is not None and inode not in wanted:
            continue
        name = fields[7].strip() if len(fields) > 7 else ""
        yield SocketInfo(inode, "unix", name, "", bool(flags & _UNIX_ACCEPTCON), None)


def read_socket_table(inodes: Iterable[int] | None = None) -> Mapping[int, SocketInfo]:
    """inode → SocketInfo for the sockets of this process's network namespace (only ``inodes``
    when given). Sockets the tables do not show (netlink, packet...) are left out."""
    wanted = None if inodes is None else set(inodes)
    if wanted is not None and not wanted:
        return {}
    base = "/proc/self/net"
    found: dict[int, SocketInfo] = {}
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        for info in _inet(os.path.join(base, protocol), protocol, wanted):
            found[info.inode] = info
    for info in _unix(os.path.join(base, "unix"), wanted):
        found[info.inode] = info
    return found
