"""The ``shm`` resource kind: POSIX shared-memory segments (``/dev/shm``) a test left behind.

A segment is the test's when it appeared during the test, belongs to this user, and is tied to
this tree (the pytest process and its descendants):

* this process created it (each ``SharedMemory(create=True)`` is recorded with its call site,
  :mod:`pytest_shutdown.ownership.origins`, so a segment closed but never unlinked is named);
* a process of the tree maps it or has it open;
* nobody holds it and its name carries a pid of the tree (``psd_<pid>_...``: vLLM #51579);
* nobody on the host holds it, it appeared after the baseline, a process of the tree was
  started since, and no other recording process (an xdist worker) claims it.

Ownership (:meth:`ShmKind.targets`): a ``SharedMemory`` object stands for its segment, a
``SemLock`` for ``sem.<name>``. A snapshot is one ``fstat`` of ``/dev/shm``; the folder is
listed only when its modification time or size moved.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_shutdown._fast import cheap as _cheap
from pytest_shutdown._fast.cheap import process_name
from pytest_shutdown._fast.lazy_dataclass import FrozenRecord, lazy_dataclass
from pytest_shutdown._os import escaped
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.ownership import origins
from pytest_shutdown.resources.base import Extra, ObjectKind, left_findings

__all__ = [
    "ShmItem",
    "ShmKind",
    "ShmSnapshot",
    "holders_of",
    "new_segments",
    "segments",
    "take_shm_snapshot",
]

#: Never a test's: torch's shared-memory manager frees its own; loky's named semaphores belong to
#: its process-lifetime executor, and its resource tracker unlinks them.
NEVER_BLAMED: tuple[str, ...] = ("torch_*", "sem.loky-*")
#: The reference engine's segment names carry their creator's pid.
_CREATOR = re.compile(r"^psd_(\d+)_")

_listing: tuple[tuple[int, int] | None, Mapping[str, int]] | None = None


class ShmSnapshot(FrozenRecord):
    """``/dev/shm``'s state, its entries (name -> inode), and the wall clock when taken."""

    __slots__ = ("state", "entries", "taken")
    state: tuple[int, int] | None
    entries: Mapping[str, int]
    taken: float

    def __init__(
        self, state: tuple[int, int] | None, entries: Mapping[str, int], taken: float
    ) -> None:
        super().__init__(state, entries, taken)


@lazy_dataclass(frozen=True)
class ShmItem:
    name: str
    inode: int

    @property
    def path(self) -> str:
        return os.path.join(_cheap.SHM_DIR, self.name)

    def long_lived(self) -> dict[str, Any]:
        """What the session summary says about it when a module global owns it."""
        return {"kind": "shm", "name": self.name}


def segments() -> dict[str, int]:
    """name → inode of every entry in ``/dev/shm`` now."""
    found: dict[str, int] = {}
    try:
        with os.scandir(_cheap.SHM_DIR) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        found[entry.name] = entry.inode()
                except OSError:
                    continue
    except OSError:
        pass
    return found


def _listed(state: tuple[int, int] | None) -> Mapping[str, int]:
    global _listing
    cached = _listing
    if state is not None and cached is not None and cached[0] == state:
        return cached[1]
    found = segments()
    _listing = (state, found)
    return found


def take_shm_snapshot() -> ShmSnapshot:
    """The segments now; one ``fstat`` when ``/dev/shm`` did not change."""
    state = _cheap.shm_state()
    return ShmSnapshot(state, _listed(state), time.time())


def _never_blamed(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in NEVER_BLAMED)


def _ours(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.getuid()
    except OSError:
        return False


def new_segments(before: ShmSnapshot) -> list[ShmItem]:
    """This user's segments that appeared since ``before`` (a name reused counts as new)."""
    state = _cheap.shm_state()
    if state is not None and state == before.state:
        return []
    now = _listed(state)
    items = []
    for name, inode in sorted(now.items()):
        if before.entries.get(name) == inode or _never_blamed(name):
            continue
        item = ShmItem(name, inode)
        if _ours(item.path):
            items.append(item)
    return items


def still_present(items: Iterable[ShmItem]) -> list[ShmItem]:
    left = []
    for item in items:
        try:
            if os.stat(item.path).st_ino == item.inode:
                left.append(item)
        except OSError:
            pass
    return left


def _holds(pid: int | str, paths: Mapping[str, str], inodes: Mapping[int, str]) -> set[str]:
    """Which of ``paths`` (path → name) ``pid`` maps or has open. A mapping matches by path or
    by inode (``inodes``): glibc's ``sem_open`` maps a temporary file it then links under the
    semaphore's name, so the map shows ``/dev/shm/sem.XXXXXX (deleted)``."""
    found: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                if "/dev/shm/" in line:
                    fields = line.rstrip("\n").split(None, 5)
                    path = fields[-1].removesuffix(" (deleted)")
                    if path in paths:
                        found.add(paths[path])
                    elif inodes and len(fields) == 6 and fields[4].isdigit():
                        name = inodes.get(int(fields[4]))
                        if name is not None:
                            found.add(name)
    except OSError:
        pass
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return found
    for fd in names:
        try:
            target = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        if target in paths:
            found.add(paths[target])
    return found


def holders_of(names: Iterable[str], pids: Iterable[int]) -> dict[str, list[int]]:
    """name → the pids among ``pids`` that map the segment or hold it open."""
    paths = {os.path.join(_cheap.SHM_DIR, name): name for name in names}
    found: dict[str, list[int]] = {name: [] for name in paths.values()}
    inodes: dict[int, str] = {}
    for path, name in paths.items():
        try:
            inodes[os.stat(path).st_ino] = name
        except OSError:
            pass
    for pid in pids:
        for name in _holds(pid, paths, inodes):
            found[name].append(pid)
    return found


_NAME_PARTS = re.compile(r"[_.\-]")


def named_by(name: str, pids: Iterable[int]) -> bool:
    """Whether the segment's name carries one of ``pids`` as a whole part between separators
    (``psd_<pid>_...``); digits inside a random suffix are no pid."""
    wanted = {str(pid) for pid in pids}
    return any(part in wanted for part in _NAME_PARTS.split(name))


def attribute(
    items: Sequence[ShmItem], tree: Iterable[int]
) -> tuple[list[ShmItem], dict[str, list[int]]]:
    """The items that are this tree's (a process of ``tree`` holds it, or its name carries a pid
    of the tree), and name → holders in the tree."""
    tree = set(tree)
    holders = holders_of([item.name for item in items], sorted(tree))
    mine = [item for item in items if holders[item.name] or named_by(item.name, tree)]
    return mine, holders


def created_here(items: Sequence[ShmItem]) -> tuple[list[ShmItem], list[ShmItem]]:
    """The items this process created (a recorded ``SharedMemory(create=True)``), and the rest."""
    pid = os.getpid()
    mine: list[ShmItem] = []
    rest: list[ShmItem] = []
    for item in items:
        record = origins.recorded_segment(item.name)
        (mine if record is not None and record[2] == pid else rest).append(item)
    return mine, rest


#: A segment's change time and the wall clock of the baseline are compared with this slack.
_WINDOW_SLACK_S = 0.05


def left_by_descendants(
    items: Sequence[ShmItem], tree: Iterable[int], since: float
) -> list[ShmItem]:
    """Of ``items`` (held by no process of ``tree``, named by none of its pids), those a
    descendant created and left: a recorded process was started and the segment appeared since
    ``since``, no other recording process claims it, and no process on the host holds it (every
    process is looked at only when the rest holds)."""
    if not items or since <= 0:
        return []
    started = {pid for pid, at in origins.recorded_processes().items() if at >= since}
    if not started:
        return []
    ours = {os.getpid(), *tree, *started}
    candidates = []
    for item in items:
        claim = origins.segment_claim(item.name)
        if claim is not None and claim not in ours:
            continue  # another pytest process (an xdist worker) created it
        if _names_a_live_stranger(item.name, ours):
            continue  # its name carries the pid of a running process not ours (its creator's)
        try:
            changed = os.stat(item.path).st_ctime
        except OSError:
            continue
        if changed >= since - _WINDOW_SLACK_S:
            candidates.append(item)
    if not candidates:
        return []
    outside = [int(n) for n in escaped._listing() if n.isdigit() and int(n) not in ours]
    held = holders_of([item.name for item in candidates], outside)
    return [item for item in candidates if not held[item.name]]


def _names_a_live_stranger(name: str, ours: set[int]) -> bool:
    """Whether a number in ``name`` is the pid of a running process not one of ``ours``."""
    for token in re.split(r"[^0-9A-Za-z]+", name):  # whole numbers only, not a uuid's digits
        if not token.isdigit() or len(token) > 9:
            continue
        pid = int(token)
        if pid > 1 and pid not in ours and os.path.exists(f"/proc/{pid}/stat"):
            return True
    return False


_SHM_MODULE = "multiprocessing.shared_memory"
_SYNC_MODULE = "multiprocessing.synchronize"


def _object_name(obj: object) -> str | None:
    """The ``/dev/shm`` name a ``SharedMemory`` or ``SemLock`` object stands for."""
    shm = sys.modules.get(_SHM_MODULE)
    if shm is not None and issubclass(type(obj), shm.SharedMemory):
        name = getattr(obj, "_name", None)
        return str(name).lstrip("/") if name else None
    sync = sys.modules.get(_SYNC_MODULE)
    if sync is not None and issubclass(type(obj), sync.SemLock):
        try:
            name = obj._semlock.name  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - a half-made or unpickled lock
            return None
        return "sem." + str(name).lstrip("/") if name else None
    return None


def _segment_objects(names: Iterable[str]) -> dict[str, list[object]]:
    """name → the ``SharedMemory`` (``sem.<name>``: ``SemLock``) objects attached to it: recorded
    creations, then what a recent owner reaches, then one heap pass for the rest."""
    wanted = set(names)
    found: dict[str, list[object]] = {}
    for name in list(wanted):
        record = origins.recorded_segment(name)
        if record is not None and record[0] is not None and _object_name(record[0]) == name:
            found[name] = [record[0]]
            wanted.discard(name)
    kinds = tuple(
        kind
        for kind in (
            getattr(sys.modules.get(_SHM_MODULE), "SharedMemory", None),
            getattr(sys.modules.get(_SYNC_MODULE), "SemLock", None),
        )
        if kind is not None
    )
    if not wanted or not kinds:
        return found
    from pytest_shutdown.ownership.owners import reached_by_recent_owners  # noqa: PLC0415

    def stands_for_wanted(obj: object) -> bool:
        return issubclass(type(obj), kinds) and _object_name(obj) in wanted

    for obj in reached_by_recent_owners(stands_for_wanted):
        reached = _object_name(obj)
        if reached is not None:
            found.setdefault(reached, []).append(obj)
    wanted.difference_update(found)
    if not wanted:
        return found
    for obj in _cheap.heap_instances(lambda kind: issubclass(kind, kinds)):
        named = _object_name(obj)
        if named is not None and named in wanted:
            found.setdefault(named, []).append(obj)
    return found


def describe(item: ShmItem, holders: Sequence[int]) -> dict[str, Any]:
    try:
        size: int | None = os.stat(item.path).st_size
    except OSError:
        size = None
    record = origins.recorded_segment(item.name)
    match = _CREATOR.match(item.name)
    creator: dict[str, Any] | None = None  # the process that created it, responsible for it
    created_at = site = created_by = None
    if record is not None:
        origin, pid = record[1], record[2]
        created_at = origins.render_origin(origin)
        created_by = origins.start_site(origin)
        if origin.frames:
            filename, lineno = origin.frames[0][0], origin.frames[0][1]
            site = f"{filename}:{lineno}"
    elif match:
        pid = int(match.group(1))
    if record is not None or match:
        alive = os.path.exists(f"/proc/{pid}")
        creator = {"pid": pid, "alive": alive, "process": process_name(pid) if alive else None}
    kind = "semaphore" if item.name.startswith("sem.") else "segment"
    held = [{"pid": pid, "process": process_name(pid)} for pid in holders]
    if held:
        who = "held by " + ", ".join(f"pid {h['pid']} ({h['process']})" for h in held)
    elif creator is not None and not creator["alive"]:
        did = "created" if record is not None else "named"
        who = f"no process holds it; pid {creator['pid']}, which {did} it, is gone"
    elif record is not None and creator is not None:
        who = (
            f"no process holds it: pid {creator['pid']} ({creator['process']}) created it and "
            "closed it without unlinking it"
        )
    else:
        who = "no process holds it (its creator exited or closed it without unlinking it)"
    sized = f", {size} bytes" if size is not None else ""
    where = f", created by {created_by}" if created_by is not None else ""
    return {
        "name": item.name,
        "kind": kind,
        "size": size,
        "holders": held,
        "creator": creator,
        "site": site,
        "created_at": created_at,
        "what": f"{kind} /dev/shm/{item.name}{sized}{where}, {who}",
    }


def unlink(items: Iterable[ShmItem]) -> list[str]:
    """Unlink the segments (the ones still the same file); the names unlinked."""
    done = []
    for item in still_present(items):
        try:
            os.unlink(item.path)
            done.append(item.name)
        except OSError:
            pass
    return done


class ShmKind(ObjectKind):
    """The ``shm`` resource kind (see the module docstring)."""

    name = "shm"
    allow_key = "shm"
    mark = "shm_state"

    def fingerprint(self) -> tuple[int, int] | None:
        return _cheap.shm_state()  # None: no /dev/shm here, nothing to find

    def snapshot(self) -> ShmSnapshot:
        return take_shm_snapshot()

    def new_since(self, before: ShmSnapshot, allow: object = None) -> list[ShmItem]:
        if allow is True:
            return []
        items = new_segments(before)
        if not items:
            return items
        from pytest_shutdown.resources.primitives import descendant_pids  # noqa: PLC0415

        created, rest = created_here(items)
        tree = [os.getpid(), *descendant_pids()]
        held = attribute(rest, tree)[0] if rest else []
        unexplained = [item for item in rest if item not in held]
        left = left_by_descendants(unexplained, tree, before.taken)
        mine = set(created) | set(held) | set(left)
        return [item for item in items if item in mine]

    def absorb(
        self, before: ShmSnapshot, start: ShmSnapshot | None, end: ShmSnapshot | None = None
    ) -> ShmSnapshot:
        """Segments a wider-scope fixture created between ``start`` and ``end`` (now, when
        None) join the baseline."""
        if start is None:
            return before
        end = end if end is not None else take_shm_snapshot()
        if start.state == end.state:
            return before
        entries = dict(before.entries)
        for name, inode in end.entries.items():
            if start.entries.get(name) != inode:
                entries[name] = inode
        return ShmSnapshot(before.state, entries, before.taken)

    def targets(self, items: Sequence[ShmItem]) -> dict[ShmItem, object]:
        """The object that stands for each segment (see :func:`_segment_objects`)."""
        objects = _segment_objects(item.name for item in items)
        return {item: objects[item.name][0] for item in items if objects.get(item.name)}

    def settle(self, items: Sequence[ShmItem], deadline: float) -> list[ShmItem]:
        return _cheap.settle_left(items, still_present, deadline)

    def settle_long_lived(
        self, items: Sequence[ShmItem], deadline: float, *, thorough: bool = False
    ) -> list[ShmItem]:
        return _cheap.settle_listed(items, still_present, deadline, thorough=thorough)

    def describe(self, items: Sequence[ShmItem]) -> list[dict[str, Any]]:
        from pytest_shutdown.resources.primitives import descendant_pids  # noqa: PLC0415

        holders = holders_of([i.name for i in items], [os.getpid(), *descendant_pids()])
        return [describe(item, holders.get(item.name, ())) for item in items]

    def findings(
        self, items: Sequence[ShmItem], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        records = self.describe(items)
        count = len(records)
        return left_findings(
            "shm-leak",
            "segments",
            records,
            [r["what"] for r in records],
            f"{count} shared-memory segment{'s' if count != 1 else ''} created in {subject} "
            "still present",
            grace=grace,
            extra=extra,
        )

    def restore(self, items: Sequence[ShmItem]) -> None:
        """Fail mode unlinks nothing: a segment no process maps now can still be opened by name
        later (a reused executor's named semaphore, ``sem.loky-*``), and unlinking it under the
        library deadlocked the next test. The finding names each segment to clean."""
