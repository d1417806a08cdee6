"""Finding every process of a tree under test, however it was re-parented (Linux ``/proc``).

A process belongs to a ``TreeLauncher``'s tree when its environment carries the launcher's marker,
when it descends from the launcher (a child subreaper), or when it is in the session of a root
the launcher started. Markers read from ``environ`` are cached per (pid, start time).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_shutdown._fast.cheap import process_name
from pytest_shutdown._os.proc_stat import TreeProcess, read_stat

#: Environment variable marking every process a launcher started (its value: the token).
TREE_MARKER_ENV = "PYTEST_SHUTDOWN_TREE"


_marker_cache: dict[tuple[int, int, str], bool] = {}


def _has_marker(proc: TreeProcess, marker: bytes, token: str) -> bool:
    key = (proc.pid, proc.start_ticks, token)
    known = _marker_cache.get(key)
    if known is not None:
        return known
    try:
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            found = marker in f.read()
    except OSError:
        return False  # gone, or not ours to read: not cached, it may become readable
    if len(_marker_cache) > 100_000:
        _marker_cache.clear()
    _marker_cache[key] = found
    return found


def all_pids() -> Iterable[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def scan_tree(
    token: str, launcher_pid: int, sessions: Iterable[int] = ()
) -> dict[int, TreeProcess]:
    """Every process of the launcher's tree now (the launcher itself left out), zombies too."""
    marker = f"{TREE_MARKER_ENV}={token}\0".encode()
    wanted_sessions = set(sessions)
    stats = {pid: proc for pid in all_pids() if (proc := read_stat(pid)) is not None}
    children: dict[int, list[int]] = {}
    for proc in stats.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    members: dict[int, TreeProcess] = {}
    stack = list(children.get(launcher_pid, ()))
    while stack:
        pid = stack.pop()
        if pid in members or pid not in stats:
            continue
        members[pid] = stats[pid]
        stack.extend(children.get(pid, ()))
    own = os.getpid()
    for pid, proc in stats.items():
        if pid in members or pid in (launcher_pid, own):
            continue
        if proc.session in wanted_sessions or _has_marker(proc, marker, token):
            members[pid] = proc
    return members


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Poll until none of ``pids`` runs (a zombie has ended); the ones still running."""
    left = set(pids)
    deadline = time.monotonic() + timeout
    while left:
        left = {p for p in left if (s := read_stat(p)) is not None and s.alive}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return sorted(left)


# --- what a tree holds besides processes: shared-memory segments, ports, socket files ---------


@dataclass
class TreeResources:
    """Segments, ports and socket files a tree held, to tell what its death left behind.

    ``before()`` lists ``/dev/shm`` before the tree starts; ``record(pids)`` (at the signal)
    notes what the tree's processes hold then: new segments they map or have open, and their
    bound sockets. ``left()`` names what is still there once nobody holds it; ``clean()`` removes
    it (nothing a check starts may outlive it).
    """

    shm_before: dict[str, int] = field(default_factory=dict)
    segments: dict[str, int] = field(default_factory=dict)  # name -> inode
    ports: list[dict[str, object]] = field(default_factory=list)
    socket_files: dict[str, int] = field(default_factory=dict)  # path -> inode of the file

    @classmethod
    def before(cls) -> TreeResources:
        from pytest_shutdown.resources.shm import segments  # noqa: PLC0415

        return cls(shm_before=segments())

    def record(self, pids: Iterable[int]) -> None:
        from pytest_shutdown.resources.ports import bound_sockets_of  # noqa: PLC0415
        from pytest_shutdown.resources.shm import holders_of, named_by, segments  # noqa: PLC0415

        pids = sorted(set(pids))
        new = {
            name: inode for name, inode in segments().items() if self.shm_before.get(name) != inode
        }
        held = holders_of(new, pids)
        for name, inode in new.items():
            if held[name] or named_by(name, pids):  # the shm kind's rule, one convention
                self.segments[name] = inode
        for item in bound_sockets_of(pids):
            info = item.info
            if info.protocol == "unix":
                if info.local.startswith("/"):
                    with contextlib.suppress(OSError):
                        self.socket_files[info.local] = os.stat(info.local).st_ino
                continue
            self.ports.append(
                {
                    "inode": item.inode,
                    "pid": item.pid,
                    "process": process_name(item.pid),
                    "protocol": info.protocol,
                    "address": info.local,
                    "port": info.port,
                    "what": info.describe(),
                }
            )

    def left(self, survivors: Iterable[int] = ()) -> dict[str, list[dict[str, object]]]:
        """What is still there: ``segments`` no process holds, ``ports`` still bound by a
        process that is not one of the tree's ``survivors`` (those are orphan findings
        already), ``socket_files`` still on disk."""
        from pytest_shutdown.resources.ports import socket_fds_of  # noqa: PLC0415
        from pytest_shutdown.resources.shm import (  # noqa: PLC0415
            ShmItem,
            describe,
            holders_of,
            still_present,
        )
        from pytest_shutdown.resources.sockets import read_socket_table  # noqa: PLC0415

        items = still_present(ShmItem(n, i) for n, i in self.segments.items())
        segments: list[dict[str, object]] = []
        if items:
            holders = holders_of([i.name for i in items], all_pids())
            segments = [describe(item, ()) for item in items if not holders[item.name]]
        table = read_socket_table() if self.ports else {}
        tree = set(survivors)
        ports = []
        for port in self.ports:
            inode = port["inode"]
            info = table.get(inode) if isinstance(inode, int) else None
            if info is None or not info.bound:
                continue
            holding = [pid for pid in all_pids() if info.inode in socket_fds_of(pid)]
            if not holding or not set(holding) <= tree:
                held = ", ".join(f"pid {p} ({process_name(p)})" for p in holding) or "no process"
                ports.append(
                    {**port, "holders": holding, "what": f"{port['what']}, still held by {held}"}
                )
        files: list[dict[str, object]] = []
        for path, inode in self.socket_files.items():
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_ino == inode and stat.S_ISSOCK(st.st_mode):
                files.append({"path": path, "what": f"socket file {path}"})
        return {"segments": segments, "ports": ports, "socket_files": files}

    def clean(self) -> None:
        """Unlink the tree's segments and socket files that are still there."""
        from pytest_shutdown.resources.shm import ShmItem, unlink  # noqa: PLC0415

        unlink(ShmItem(n, i) for n, i in self.segments.items())
        for path, inode in self.socket_files.items():
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == inode:
                    os.unlink(path)
