"""The ``ports`` resource kind: listening ports and bound unix sockets a test left behind.

A *port* is a listening TCP socket, a bound unconnected UDP socket, or a named unix socket, held
by the pytest process or by a process started during the test. The socket tables (``/proc/net/*``)
are read only when a socket descriptor is new here or a descendant was started; processes that
existed before the test (a session fixture's server) are not looked at.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from pytest_shutdown._fast import cheap as _cheap
from pytest_shutdown._fast.cheap import process_name, socket_inode
from pytest_shutdown._fast.lazy_dataclass import FrozenRecord, lazy_dataclass
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources.base import Extra, ObjectKind, left_findings
from pytest_shutdown.resources.fds import (
    FdFingerprint,
    FdKind,
    FdSnapshot,
    fd_fingerprint,
    new_fds,
    take_fd_snapshot,
)
from pytest_shutdown.resources.primitives import descendant_pids, multiprocessing_helper_pids

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.resources.sockets import SocketInfo

__all__ = ["PortItem", "PortKind", "PortSnapshot", "bound_sockets_of"]


class PortSnapshot(FrozenRecord):
    """This process's descriptors, and its descendants, when the snapshot was taken."""

    __slots__ = ("fds", "pids")
    fds: FdSnapshot
    pids: frozenset[int]

    def __init__(self, fds: FdSnapshot, pids: frozenset[int]) -> None:
        super().__init__(fds, pids)


@lazy_dataclass(frozen=True)
class PortItem:
    """A bound socket: who holds it (pid, and fd in the pytest process) and what it is."""

    pid: int
    inode: int
    info: SocketInfo
    fd: int | None = None

    def long_lived(self) -> dict[str, Any]:
        """What the session summary says about it when a module global owns it."""
        return {"kind": "port", "pid": self.pid, "name": self.info.describe()}

    def record(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "process": process_name(self.pid),
            "fd": self.fd,
            "protocol": self.info.protocol,
            "address": self.info.local,
            "port": self.info.port,
            "what": self.info.describe(),
        }


def socket_fds_of(pid: int | str) -> dict[int, int]:
    """inode → fd of the sockets ``pid`` holds (``/proc/PID/fd``); empty when it is gone."""
    found: dict[int, int] = {}
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for name in names:
        try:
            inode = socket_inode(os.readlink(f"{base}/{name}"))
        except OSError:
            continue
        if inode is not None:
            found.setdefault(inode, int(name))
    return found


def bound_sockets_of(pids: Iterable[int]) -> list[PortItem]:
    """The bound sockets (ports, named unix sockets) each of ``pids`` holds now."""
    return _bound({pid: socket_fds_of(pid) for pid in pids})


def _bound(held: Mapping[int, Mapping[int, int]]) -> list[PortItem]:
    """The bound sockets among ``held`` (pid -> inode -> fd)."""
    inodes = {inode for sockets in held.values() for inode in sockets}
    if not inodes:
        return []
    from pytest_shutdown.resources.sockets import read_socket_table  # noqa: PLC0415 - a socket

    table = read_socket_table(inodes)
    return [
        PortItem(pid, inode, info, fd)
        for pid, sockets in held.items()
        for inode, fd in sockets.items()
        if (info := table.get(inode)) is not None and info.bound
    ]


def take_port_snapshot() -> PortSnapshot:
    return PortSnapshot(take_fd_snapshot(), descendant_pids())


def new_ports(before: PortSnapshot) -> list[PortItem]:
    """Bound sockets opened since ``before`` in this process, and those of processes started
    since (not the fork server's: it listens for its lifetime)."""
    own = {
        inode: item.fd
        for item in new_fds(before.fds)
        if (inode := socket_inode(item.target)) is not None
    }
    fresh = descendant_pids() - before.pids
    if not fresh:
        return _bound({os.getpid(): own})
    fresh -= multiprocessing_helper_pids(fresh)
    # A fork inherits our sockets: one we held before the test (a wider fixture's listener) is
    # not the child's new port while we still hold it.
    ours_before = {i for i, fd in socket_fds_of(os.getpid()).items() if fd in before.fds.fds}
    children = {pid: socket_fds_of(pid) for pid in sorted(fresh)}
    for held in children.values():
        for inode in ours_before & held.keys():
            del held[inode]
    return _bound({os.getpid(): own, **children})


def still_bound(items: Iterable[PortItem]) -> list[PortItem]:
    left = []
    for item in items:
        if item.pid == os.getpid() and item.fd is not None:
            try:
                if socket_inode(os.readlink(f"/proc/self/fd/{item.fd}")) == item.inode:
                    left.append(item)
            except OSError:
                pass
        elif item.inode in socket_fds_of(item.pid):
            left.append(item)
    return left


class PortKind(ObjectKind):
    """The ``ports`` resource kind (see the module docstring)."""

    name = "ports"
    allow_key = "ports"
    #: The fd fingerprint and the descendants: what :meth:`fingerprint` reads (see base).
    fingerprinted_by = ("fds", "processes")

    def fingerprint(self) -> tuple[FdFingerprint, frozenset[int]]:
        return (fd_fingerprint(), descendant_pids())

    def snapshot(self) -> PortSnapshot:
        return take_port_snapshot()

    def unmoved_since(self, before: PortSnapshot, moved: AbstractSet[str]) -> bool:
        """The fd fingerprint did not move and the descendants are ``before``'s: the processes
        kind's ``ns_last_pid`` moves with any pid allocated on the host, and a listing of every
        descendant's descriptors is paid only when a descendant came or went."""
        return "fds" not in moved and descendant_pids() == before.pids

    def new_since(self, before: PortSnapshot, allow: object = None) -> list[PortItem]:
        if allow is True:
            return []
        return new_ports(before)

    def absorb(
        self, before: PortSnapshot, start: PortSnapshot | None, end: PortSnapshot | None = None
    ) -> PortSnapshot:
        """What a wider-scope fixture bound or started between ``start`` and ``end`` (now, when
        None) is no test's (its descendants are left out of the test's check)."""
        if start is None:
            return before
        fds = FdKind().absorb(before.fds, start.fds, end.fds if end is not None else None)
        pids = end.pids if end is not None else descendant_pids()
        return PortSnapshot(fds, before.pids | (pids - start.pids))

    def targets(self, items: Sequence[PortItem]) -> dict[PortItem, object]:
        """The socket object of a port of this process; the Process/Popen object of a port of a
        descendant (its owner owns the port)."""
        from pytest_shutdown.ownership.owners import objects_of  # noqa: PLC0415
        from pytest_shutdown.resources.fds import _innermost, wrappers_of  # noqa: PLC0415

        me = os.getpid()
        own = [item for item in items if item.pid == me and item.fd is not None]
        wrapped = wrappers_of(item.fd for item in own if item.fd is not None)
        found: dict[PortItem, object] = {
            item: _innermost(wrapped[item.fd])
            for item in own
            if item.fd is not None and wrapped.get(item.fd)
        }
        others = [item for item in items if item.pid != me]
        if others:
            from pytest_shutdown.resources.processes import parent_pids  # noqa: PLC0415

            pids = tuple(sorted({item.pid for item in others}))
            objects = objects_of((), pids, parent_pids(pids))
            found.update({item: objects[item.pid] for item in others if item.pid in objects})
        return found

    def settle(self, items: Sequence[PortItem], deadline: float) -> list[PortItem]:
        return _cheap.settle_left(items, still_bound, deadline)

    def settle_long_lived(
        self, items: Sequence[PortItem], deadline: float, *, thorough: bool = False
    ) -> list[PortItem]:
        return _cheap.settle_listed(items, still_bound, deadline, thorough=thorough)

    def describe(self, items: Sequence[PortItem]) -> list[dict[str, Any]]:
        records = [item.record() for item in items]
        if "zmq" in sys.modules:  # a ZMQ socket's bound endpoint: named by the socket
            from pytest_shutdown.resources.zmq_sockets import name_descriptors  # noqa: PLC0415

            name_descriptors([r for r in records if r["pid"] == os.getpid()])
        return records

    def findings(
        self, items: Sequence[PortItem], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        records = self.describe(items)
        _name_holders(items, records)
        count = len(records)
        s = "s" if count != 1 else ""
        return left_findings(
            "port-leak",
            "ports",
            records,
            [f"{r['what']} held by {r['holder']}" for r in records],
            f"{count} port{s} or socket name{s} bound in {subject} still held",
            grace=grace,
            extra=extra,
        )

    def restore(self, items: Sequence[PortItem]) -> None:
        """Nothing: the socket is its holder's (the process kind kills a leaked process)."""


def _name_holders(items: Sequence[PortItem], records: list[dict[str, Any]]) -> None:
    """Each record's ``holder``: the attribute holding this process's socket object (``Server._sock
    in this process``), else this process; a descendant's process (its object and start call)."""
    from pytest_shutdown.resources.fds import fd_holders  # noqa: PLC0415
    from pytest_shutdown.resources.labels import process_label  # noqa: PLC0415
    from pytest_shutdown.resources.primitives import _process_record  # noqa: PLC0415

    me = os.getpid()
    names = fd_holders(item.fd for item in items if item.pid == me and item.fd is not None)
    for item, record in zip(items, records, strict=True):
        if item.pid != me:
            record["holder"] = f"pid {process_label(_process_record(item.pid))}"
            continue
        name = names.get(item.fd) if item.fd is not None else None
        record["holder"] = f"{name} in this process" if name else "this process"
