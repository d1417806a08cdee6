"""The ``fds`` resource kind: file descriptors a test opened in the pytest process and left open.

The fingerprint is one ``fstat`` of ``/proc/self/fd`` (the kernel counts the open descriptors in
its size) and the lowest free number (a ``dup``, closed again); the folder is listed only when
one moved. A descriptor is *new* when its number was not open before; it is named by its
``/proc/self/fd`` link (a path, a pipe end, a socket with its addresses, an eventfd, ...) and by
the Python object that wraps it. Never blamed: descriptors a library keeps for the process's
lifetime (``/dev/urandom``, GPU device files), those a test tool holds, and this package's own.
Not seen: a new descriptor that took the number of one the test closed, with the count and the
lowest free number as they were (docs/limits.md).
"""

from __future__ import annotations

import fnmatch
import gc
import io
import os
import select
import socket
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_shutdown._fast import cheap as _cheap
from pytest_shutdown._fast.cheap import socket_inode
from pytest_shutdown._fast.held_open import held_open_fds
from pytest_shutdown._fast.lazy_dataclass import FrozenRecord, lazy_dataclass
from pytest_shutdown._fast.moments import reading
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources.base import Extra, ObjectKind, left_findings

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.resources.sockets import SocketInfo

__all__ = [
    "FdItem",
    "FdKind",
    "FdSnapshot",
    "describe_fd",
    "kept_by_libraries",
    "FdFingerprint",
    "new_fds",
    "open_fds",
    "still_open",
    "take_fd_snapshot",
]

#: Link targets of descriptors opened lazily for the process's lifetime: never a test's leak.
PROCESS_LIFETIME_TARGETS: tuple[str, ...] = (
    "/dev/urandom",
    "/dev/random",
    "/dev/nvidia*",
    "/dev/dri/*",
    "/dev/kfd",
    "/dev/null",
    "/proc/self/fd",
    "/proc/*/fd",
)


class FdSnapshot(FrozenRecord):
    """Open descriptors when the snapshot was taken: their count, and their numbers."""

    __slots__ = ("count", "fds")
    count: int | None
    fds: frozenset[int]

    def __init__(self, count: int | None, fds: frozenset[int]) -> None:
        super().__init__(count, fds)


@lazy_dataclass(frozen=True)
class FdItem:
    """One descriptor opened after a snapshot: its number, link target and identity."""

    fd: int
    target: str
    identity: tuple[int, int]  # (st_dev, st_ino): the same open file, not a reuse of its number

    def long_lived(self) -> dict[str, Any]:
        """What the session summary says about it when a module global owns it."""
        return {"kind": "fd", "fd": self.fd, "name": self.target}


def open_fds() -> frozenset[int]:
    """The descriptor numbers open in this process now (lists ``/proc/self/fd``)."""
    try:
        names = os.listdir(_cheap.FD_DIR)
    except OSError:
        return frozenset()
    numbers = sorted(int(n) for n in names if n.isdigit())
    # the folder's own descriptor, open while it was listed, is gone again
    return frozenset(numbers) - _transient(numbers)


def _transient(numbers: Sequence[int]) -> frozenset[int]:
    """The folder's own descriptor, listed and closed again. It took the lowest free number,
    so it lies in the unbroken run 0, 1, 2, ... the sorted listing starts with, most often at
    its top (no gap below it): that number is asked first, then each in order."""
    run = 0
    while run < len(numbers) and numbers[run] == run:
        run += 1
    for number in ([run - 1] if run else []) + list(numbers):
        try:
            os.fstat(number)
        except OSError:
            return frozenset({number})
    return frozenset()


def _listed() -> frozenset[int]:
    """The descriptor numbers now, listed once per moment (the fds and ports kinds share it).

    Never kept from one snapshot to the next on an unchanged count: a test that closes one
    descriptor and opens another leaves the count as it was, and the old listing would then
    hold a number the next test's leak may reuse (the leak unseen) and lack the new one
    (blamed on the next test that moves the count)."""
    return reading("fd_listing", open_fds)


#: The count and the lowest free number, or (the kernel not counting) the numbers.
FdFingerprint = tuple[int, int | None] | frozenset[int]


def fd_fingerprint() -> FdFingerprint:
    """The descriptor count (one ``fstat``) and the lowest free number (see
    :func:`~pytest_shutdown._fast.cheap.lowest_free_fd`), or where the kernel does not
    count them the numbers themselves."""
    count = _cheap.fd_count()
    return (count, _cheap.lowest_free_fd()) if count is not None else open_fds()


def take_fd_snapshot() -> FdSnapshot:
    """The open descriptors now: their count and their numbers (a listing)."""
    return FdSnapshot(_cheap.fd_count(), _listed())


def _item(fd: int) -> FdItem | None:
    path = f"{_cheap.FD_DIR}/{fd}"
    try:
        target = os.readlink(path)
        st = os.stat(path)
    except OSError:
        return None
    return FdItem(fd, target, (st.st_dev, st.st_ino))


def helper_fds() -> frozenset[int]:
    """Descriptors the process-lifetime helpers of multiprocessing (and its forks) hold: a
    resource tracker's pipe, a fork server's lifeline (see
    :func:`~pytest_shutdown.resources.primitives.process_lifetime_helpers`)."""
    from pytest_shutdown.resources.primitives import (  # noqa: PLC0415 - only when something is new
        helper_numbers,
        process_lifetime_helpers,
    )

    found: set[int] = set()
    for helper in process_lifetime_helpers():
        found.update(helper_numbers(helper, "fd"))
        if type(helper).__name__ == "_ResourceSharer":
            found.update(_resource_sharer_fds(helper))
    return frozenset(found)


def _resource_sharer_fds(sharer: object) -> set[int]:
    """Descriptors a ``resource_sharer`` holds for a child to fetch (a registered ``DupFd`` stays
    until fetched), and its listener's."""
    found: set[int] = set()
    for entry in list((getattr(sharer, "_cache", None) or {}).values()):
        for function in entry if isinstance(entry, tuple) else ():
            for cell in getattr(function, "__closure__", None) or ():
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                number = value if isinstance(value, int) else _fileno(value)
                if isinstance(number, int) and not isinstance(number, bool) and number >= 0:
                    found.add(number)
    listener = getattr(sharer, "_listener", None)
    sock = getattr(getattr(listener, "_listener", None), "_socket", None)
    number = _fileno(sock) if sock is not None else None
    if number is not None:
        found.add(number)
    return found


def finalizer_fds() -> frozenset[int]:
    """Descriptors multiprocessing closes when their ``Process`` object goes (its sentinel and
    pipe ends, ``util.Finalize(popen, util.close_fds, fds)``): the object's holder owns them."""
    from pytest_shutdown.resources.primitives import modules_named  # noqa: PLC0415

    found: set[int] = set()
    for name in modules_named("util"):  # multiprocessing's, and every fork's (multiprocess)
        util = sys.modules.get(name)
        registry = getattr(util, "_finalizer_registry", None)
        if not registry or not isinstance(registry, dict):
            continue
        closers = {getattr(util, "close_fds", None), os.close}
        for finalizer in list(registry.values()):
            if getattr(finalizer, "_callback", None) not in closers:
                continue
            for arg in getattr(finalizer, "_args", None) or ():
                values = arg if isinstance(arg, (list, tuple)) else (arg,)
                found.update(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return frozenset(found)


def _never_blamed(item: FdItem, helpers: frozenset[int]) -> bool:
    return (
        item.fd in held_open_fds()
        or item.fd in helpers
        or any(fnmatch.fnmatchcase(item.target, pattern) for pattern in PROCESS_LIFETIME_TARGETS)
    )


def new_fds(before: FdSnapshot) -> list[FdItem]:
    """Descriptors open now that were not open at ``before`` (process-lifetime ones left out)."""
    items = []
    helpers: frozenset[int] | None = None
    for fd in sorted(_listed() - before.fds):
        item = _item(fd)
        if item is None:
            continue
        if helpers is None:
            helpers = helper_fds()
        if not _never_blamed(item, helpers):
            items.append(item)
    return items


def still_open(items: Iterable[FdItem]) -> list[FdItem]:
    """The items whose descriptor is still the same open file."""
    left = []
    for item in items:
        now = _item(item.fd)
        if now is not None and now.identity == item.identity:
            left.append(item)
    return left


def settle(items: Sequence[FdItem], deadline: float) -> list[FdItem]:
    """What is still open at ``deadline`` (see :func:`~._cheap.settle_left`)."""
    return _cheap.settle_left(items, still_open, deadline)


def _fdinfo(fd: int, field: str, base: int = 10) -> list[int]:
    """The numbers on the ``field`` lines of ``/proc/self/fdinfo/FD`` (an epoll's ``tfd:``)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
            return [int(line.split()[1], base) for line in f if line.startswith(field)]
    except (OSError, ValueError, IndexError):
        return []


def describe_fd(item: FdItem, sockets: Mapping[int, SocketInfo] | None = None) -> dict[str, Any]:
    """What ``item`` is, as JSON-serialisable facts with a one-phrase ``what``."""
    target = item.target
    flags = (_fdinfo(item.fd, "flags:", 8) or [0])[0]
    record: dict[str, Any] = {"fd": item.fd, "target": target}
    inode = socket_inode(target)
    if inode is not None:
        info = (sockets or {}).get(inode)
        record.update(kind="socket", what=f"socket (inode {inode})")
        if info is not None:
            record.update(what=info.describe(), protocol=info.protocol, local=info.local)
            record.update(remote=info.remote, listening=info.listening)
    elif target.startswith("pipe:["):
        end = "write" if flags & 0o3 == os.O_WRONLY else "read"
        record.update(kind="pipe", what=f"pipe ({end} end) {target[5:]}")
    elif (name := _anon_kind(target)) is not None:
        record.update(kind=name, what={"eventpoll": "epoll instance"}.get(name, name))
    elif target.startswith("/dev/shm/"):
        record.update(kind="shm", what=f"shared-memory segment {target[8:]}")
    else:
        deleted = target.endswith(" (deleted)")
        path = target[: -len(" (deleted)")] if deleted else target
        kind = "file"
        try:
            mode = os.stat(f"{_cheap.FD_DIR}/{item.fd}").st_mode
            if stat.S_ISDIR(mode):
                kind = "directory"
            elif stat.S_ISCHR(mode):
                kind = "device"
        except OSError:
            pass
        access = {os.O_RDONLY: "read", os.O_WRONLY: "write", os.O_RDWR: "read/write"}
        what = f"{kind} {path} ({access.get(flags & 0o3, '?')}{', deleted' if deleted else ''})"
        record.update(kind=kind, what=what)
    return record


def _socket_table(items: Iterable[FdItem]) -> Mapping[int, SocketInfo]:
    inodes = [i for i in (socket_inode(item.target) for item in items) if i is not None]
    if not inodes:
        return {}
    from pytest_shutdown.resources.sockets import read_socket_table  # noqa: PLC0415 - a socket

    return read_socket_table(inodes)


def listening(items: Iterable[FdItem]) -> set[int]:
    """The descriptors among ``items`` that hold a port or a socket name (the ports kind's)."""
    items = list(items)
    bound = {inode for inode, info in _socket_table(items).items() if info.bound}
    return {item.fd for item in items if socket_inode(item.target) in bound}


_EXTRA_WRAPPERS = ("epoll", "devpoll", "kqueue")
#: type -> whether its instances can wrap a descriptor (decided once per type).
_WRAPPER_TYPES: dict[type, bool] = {}
#: The C base of every file object, ``io.IOBase`` and its subclasses included. Not the ``io``
#: ABCs: asked about every type of the heap, they would each cache an answer per type (some
#: five thousand weak references kept for the session, which every full collection then walks).
_IO_BASE: type = getattr(sys.modules.get("_io"), "_IOBase", io.IOBase)


def _is_wrapper_type(kind: type) -> bool:
    known = _WRAPPER_TYPES.get(kind)
    if known is None:
        try:
            known = (
                issubclass(kind, (_IO_BASE, socket.socket))
                or (kind.__name__ in _EXTRA_WRAPPERS and kind.__module__ == select.__name__)
                or (
                    kind.__name__ == "Connection"
                    and kind.__module__ == "multiprocessing.connection"
                )
            )
        except TypeError:
            known = False
        if len(_WRAPPER_TYPES) > 10_000:
            _WRAPPER_TYPES.clear()
        _WRAPPER_TYPES[kind] = known
    return known


def _fileno(obj: object) -> int | None:
    kind = type(obj)  # never obj.__class__: a proxy or a deprecated alias may warn or lie
    if not _is_wrapper_type(kind):
        return None
    try:
        if kind.__name__ == "Connection":
            number = obj._handle  # type: ignore[attr-defined]
        else:
            number = obj.fileno()  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError):
        return None
    return number if isinstance(number, int) else None


def wrappers_of(fds: Iterable[int]) -> dict[int, list[object]]:
    """fd → the Python objects that wrap it (file objects, sockets, epoll, Connections): one
    pass over the heap."""
    wanted = set(fds)
    found: dict[int, list[object]] = {}
    if not wanted:
        return found
    for obj in _cheap.heap_instances(_is_wrapper_type):
        number = _fileno(obj)
        if number is not None and number in wanted:
            found.setdefault(number, []).append(obj)
    return found


def wrappers_held_by_recent_owners(fds: Iterable[int]) -> dict[int, list[object]]:
    """fd -> the wrappers of it that a remembered owner (a module global or class attribute that
    owned something lately) reaches forwards: no pass over the heap."""
    wanted = set(fds)
    if not wanted:
        return {}
    from pytest_shutdown.ownership.owners import reached_by_recent_owners  # noqa: PLC0415

    def wraps_wanted(obj: object) -> bool:
        return _is_wrapper_type(type(obj)) and _fileno(obj) in wanted

    found: dict[int, list[object]] = {}
    for obj in reached_by_recent_owners(wraps_wanted):
        number = _fileno(obj)
        if number is not None:
            found.setdefault(number, []).append(obj)
    return found


def held_by_tools(wrapped: Mapping[int, Sequence[object]]) -> set[int]:
    """The descriptors (keys of ``wrapped``) one of whose wrappers a test tool holds directly
    (pytest's capture, its logging handlers, execnet): two heap passes, however many."""
    from pytest_shutdown.ownership.owners import _is_tool_object  # noqa: PLC0415

    fd_of = {id(obj): fd for fd, objs in wrapped.items() for obj in objs}
    if not fd_of:
        return set()
    referrers = gc.get_referrers(*(obj for objs in wrapped.values() for obj in objs))
    dicts = {id(ref): ref for ref in referrers if isinstance(ref, dict)}
    instance_of: dict[int, object] = {}
    if dicts:
        for owner in gc.get_referrers(*dicts.values()):
            namespace = getattr(owner, "__dict__", None)
            if namespace is not None and id(namespace) in dicts:
                instance_of[id(namespace)] = owner  # an instance's __dict__: the instance
    held: set[int] = set()
    for ref in referrers:
        holder = instance_of.get(id(ref), ref) if isinstance(ref, dict) else ref
        if _is_tool_object(holder):
            held.update(fd_of[id(t)] for t in gc.get_referents(ref) if id(t) in fd_of)
    return held


#: Native libraries with process-lifetime helpers of their own: (a name in ``/proc/self/maps``,
#: the library's name in findings, the Python module that loads it).
NATIVE_LIBRARIES: tuple[tuple[str, str, str], ...] = (("libzmq", "libzmq", "zmq"),)
#: The ``anon_inode`` kinds such libraries' helpers hold (a mailbox's eventfd, a poller).
_NATIVE_HELPER_KINDS = frozenset({"eventfd", "eventpoll"})

#: (len(sys.modules) when /proc/self/maps was read, the libraries loaded then)
_native_seen: tuple[int, tuple[str, ...]] | None = None


def loaded_native_libraries() -> tuple[str, ...]:
    """The :data:`NATIVE_LIBRARIES` loaded into this process (``/proc/self/maps`` is read again
    only after an import: that is how such a library comes in)."""
    global _native_seen
    count = len(sys.modules)
    seen = _native_seen
    if seen is not None and seen[0] == count:
        return seen[1]
    wanted = [entry for entry in NATIVE_LIBRARIES if entry[2] in sys.modules]
    loaded: tuple[str, ...] = ()
    if wanted:
        maps = _cheap.self_maps()
        loaded = tuple(name for mapped, name, _ in wanted if mapped.encode() in maps)
    _native_seen = (count, loaded)
    return loaded


#: Native libraries that keep unwrapped descriptors for the process's lifetime once used: (the
#: Python module that loads it, a name in ``/proc/self/maps``, the library's name in the summary,
#: globs of the link targets it keeps). Ray's core keeps gRPC's pollers, its GCS I/O context and
#: its log files after ``ray.shutdown()``.
PROCESS_LIFETIME_NATIVE: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "ray._raylet",
        "/ray/_raylet.so",
        "Ray's core (ray._raylet)",
        (
            "anon_inode:[[]eventpoll[]]",
            "anon_inode:[[]eventfd[]]",
            "anon_inode:[[]timerfd[]]",
            "socket:[[]*[]]",
            "*/session_*/logs/*",
        ),
    ),
)


def kept_by_libraries(items: Sequence[FdItem]) -> dict[FdItem, str]:
    """item -> the library that keeps it for the process's lifetime
    (:data:`PROCESS_LIFETIME_NATIVE`: its module imported, its shared object mapped, the link
    target one it keeps, no Python object wrapping it): listed as long-lived, not a finding."""
    wanted = [entry for entry in PROCESS_LIFETIME_NATIVE if entry[0] in sys.modules]
    if not wanted or not items:
        return {}
    maps = _cheap.self_maps()
    loaded = [entry for entry in wanted if entry[1].encode() in maps]
    if not loaded:
        return {}
    matched = {}
    for item in still_open(items):
        for _, _, library, patterns in loaded:
            if any(fnmatch.fnmatchcase(item.target, p) for p in patterns):
                matched[item] = library
                break
    if not matched:
        return {}
    wrapped = wrappers_of(item.fd for item in matched)
    return {item: library for item, library in matched.items() if not wrapped.get(item.fd)}


def _anon_kind(target: str) -> str | None:
    return target[len("anon_inode:") :].strip("[]") if target.startswith("anon_inode:") else None


def native_owners(items: Sequence[FdItem]) -> dict[int, tuple[object, str]]:
    """fd -> (the Python object whose native code holds it, what it is to that object), for
    descriptors no Python object wraps."""
    if "libzmq" not in loaded_native_libraries():
        return {}
    from pytest_shutdown.resources._zmq_contexts import zmq_owners  # noqa: PLC0415 - libzmq's

    return zmq_owners({item.fd: _anon_kind(item.target) for item in items})


#: Attribute names under which pure-Python code keeps a raw descriptor number (multiprocessing's
#: heap ``Arena.fd``, a resource tracker's ``_fd``, a selector's ``_fileno``...).
_FD_ATTRIBUTES = ("fd", "_fd", "fileno_", "_fileno", "_fd_number")


def same_file_fds(fds: Iterable[int]) -> dict[int, list[int]]:
    """fd -> the other descriptors open on the same regular file, for a file this process maps
    (``mmap.mmap`` keeps a duplicate of the descriptor it maps: multiprocessing's heap arena).
    Only mapped files: two descriptors of one log file are two things."""
    keys: dict[tuple[int, int], list[int]] = {}
    wanted: dict[int, tuple[int, int]] = {}
    mapped: set[int] | None = None
    for fd in fds:
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        if mapped is None:
            mapped = _mapped_inodes()
        if info.st_ino in mapped:
            wanted[fd] = (info.st_dev, info.st_ino)
    if not wanted:
        return {}
    targets = set(wanted.values())
    for fd in sorted(open_fds()):
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        key = (info.st_dev, info.st_ino)
        if key in targets:
            keys.setdefault(key, []).append(fd)
    return {fd: [o for o in keys.get(key, ()) if o != fd] for fd, key in wanted.items()}


#: Packages whose objects keep descriptor numbers as records of what others opened, never as
#: their holders.
_RECORD_PACKAGES = frozenset({"pytest_shutdown", "_pytest", "pytest", "pluggy", "xdist"})


def _is_our_record(obj: object) -> bool:
    module = getattr(type(obj), "__module__", None) or ""
    return module.partition(".")[0] in _RECORD_PACKAGES


def _mapped_inodes() -> set[int]:
    """The inodes of the files this process maps (``/proc/self/maps``' fifth column)."""
    found: set[int] = set()
    for line in _cheap.self_maps().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) > 4 and fields[4].isdigit() and fields[4] != b"0":
            found.add(int(fields[4]))
    return found


def int_fd_holders(fds: Iterable[int]) -> dict[int, tuple[object, str]]:
    """fd -> (the object, the attribute) that keeps descriptor ``fd`` as a plain number
    (multiprocessing's heap keeps each arena's as ``Arena.fd``): one heap pass; a number held by
    two objects is nobody's."""
    wanted = set(fds)
    if not wanted:
        return {}
    found: dict[int, tuple[object, str]] = {}
    twice: set[int] = set()
    for obj in gc.get_objects():
        if issubclass(type(obj), type) or _is_our_record(obj):
            continue
        try:
            namespace = object.__getattribute__(obj, "__dict__")
        except Exception:  # noqa: BLE001 - no __dict__, or a hostile one: not a holder
            continue
        if type(namespace) is not dict:
            continue
        for attribute in _FD_ATTRIBUTES:
            value = namespace.get(attribute)
            if type(value) is int and value in wanted:
                if value in found and found[value][0] is not obj:
                    twice.add(value)
                found[value] = (obj, attribute)
    for fd in twice:
        del found[fd]
    return found


def _python_name(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}".replace("builtins.", "").replace("_io.", "io.")


def _native_phrase(record: Mapping[str, Any], libraries: Sequence[str], holder: str | None) -> str:
    """What a descriptor no Python object wraps is, and who may hold it: never a guess that the
    test's own code opened it."""
    kind = record.get("kind") or "descriptor"
    noun = {"eventpoll": "epoll instance"}.get(kind, kind)
    phrase = f"no Python object wraps this {noun}: native code or a raw os call holds it"
    if holder is not None:
        return f"no Python object wraps this {noun}: it is {holder}"
    if libraries and kind in _NATIVE_HELPER_KINDS:
        phrase += f"; likely held by {libraries[0]}'s native code"
    return phrase


def _native_note(records: Sequence[Mapping[str, Any]]) -> str:
    """The finding's last sentence when some descriptors have no Python object."""
    native = [r for r in records if r.get("native") and "zmq_context" not in r]
    if not native:
        return ""
    count = len(native)
    which = (
        "it has"
        if len(records) == 1
        else (f"{count} of them have" if count != len(records) else "they have")
    )
    libraries = sorted({r["likely_library"] for r in native if r.get("likely_library")})
    likely = "".join(f"; likely held by {lib}'s native code" for lib in libraries)
    return (
        f" {which[0].upper()}{which[1:]} no Python object (native code or a raw os call){likely}."
        " If only the first test that uses a library shows it, it is a process-wide resource"
        " created on first use."
    )


def fd_holders(fds: Iterable[int]) -> dict[int, str]:
    """fd -> the attribute that holds its Python object as its user names it (``Client._sock``),
    where one does: a heap pass and a referrer pass, made only when a finding is reported."""
    from pytest_shutdown.ownership.holder_names import holder_names  # noqa: PLC0415

    wrapped = wrappers_of(fds)
    names = holder_names([obj for objects in wrapped.values() for obj in objects])
    held = {}
    for fd, objects in wrapped.items():  # a file's text wrapper, its buffer or its raw file
        name = next((names[id(obj)] for obj in objects if id(obj) in names), None)
        if name is not None:
            held[fd] = name
    return held


def _innermost(objects: Sequence[object]) -> object:
    """The object every other wrapper of a descriptor reaches (the raw file or the socket)."""
    for obj in objects:
        if isinstance(obj, (io.FileIO, socket.socket)) or not isinstance(obj, io.IOBase):
            return obj
    return objects[0]


def _held_by(record: Mapping[str, Any]) -> str:
    return f" held by {record['holder']}" if record.get("holder") else ""


def _texts(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One text per descriptor, but one for all those a zmq context holds (``fds 5, 6, 9: zmq
    Context created at ...``)."""
    texts: list[str] = []
    contexts: set[str] = set()
    for r in records:
        context = r.get("zmq_context")
        if context is None:
            texts.append(f"fd {r['fd']}: {r['what']}" + _held_by(r))
        elif r["what"] not in contexts:
            contexts.add(r["what"])
            fds = context["fds"]
            texts.append(f"fd{'s' if len(fds) > 1 else ''} {', '.join(map(str, fds))}: {r['what']}")
    return texts


class FdKind(ObjectKind):
    """The ``fds`` resource kind (see the module docstring). A listening or bound socket is the
    ``ports`` kind's."""

    name = "fds"
    allow_key = "fds"
    mark = "fd_count"

    def __init__(self) -> None:
        #: fd -> the wrappers' type names (holding the objects would keep a dropped socket open)
        self._types: dict[int, list[str]] = {}
        #: fd -> what holds it, for those no Python object wraps (see :meth:`targets`)
        self._native: dict[int, str] = {}

    def fingerprint(self) -> FdFingerprint:
        return fd_fingerprint()

    def snapshot(self) -> FdSnapshot:
        return take_fd_snapshot()

    def new_since(self, before: FdSnapshot, allow: object = None) -> list[FdItem]:
        if allow is True:
            return []
        items = new_fds(before)
        if not items:
            return items
        skip = listening(items) | finalizer_fds()
        items = [item for item in items if item.fd not in skip]
        if not items:
            return items
        # What a test dropped in a cycle closes when collected: the young generations first
        # (cheap), so that the heap scans below run only for what something still holds.
        _cheap.collect_young()
        items = still_open(items)
        if not items:
            return items
        # A reusable pool's new pipes: its remembered owner reaches them (no heap pass).
        known = self._known_wrappers()
        known.update(wrappers_held_by_recent_owners(item.fd for item in items))
        rest = [item for item in items if item.fd not in known]
        wrapped = {**known, **(self._wrappers(item.fd for item in rest) if rest else {})}
        self._types.update(
            {fd: sorted(_python_name(o) for o in objs) for fd, objs in wrapped.items()}
        )
        tools = held_by_tools({item.fd: wrapped[item.fd] for item in rest if item.fd in wrapped})
        mine = [item for item in items if item.fd not in tools]
        del wrapped
        return mine

    def absorb(
        self, before: FdSnapshot, start: FdSnapshot | None, end: FdSnapshot | None = None
    ) -> FdSnapshot:
        """What a wider-scope fixture opened between ``start`` and ``end`` (now, when None) joins
        the baseline, and the count moves by as much."""
        if start is None:
            return before
        end = end if end is not None else take_fd_snapshot()
        opened, closed = end.fds - start.fds, start.fds - end.fds
        count = before.count
        if count is not None and end.count is not None and start.count is not None:
            count += end.count - start.count
        return FdSnapshot(count, (before.fds - closed) | opened)

    @staticmethod
    def _wrappers(fds: Iterable[int]) -> dict[int, list[object]]:
        """``wrappers_of(fds)``, the heap scanned once per moment (which ends before any grace)."""
        wanted = frozenset(fds)
        known = FdKind._known_wrappers()
        found = {fd: known[fd] for fd in wanted & known.keys()}
        rest = wanted - known.keys()
        if not rest:
            return found
        scanned, wrapped = reading("fd_wrappers", lambda: (rest, wrappers_of(rest)))
        if not rest <= scanned:
            wrapped = wrappers_of(rest)
        found.update({fd: objs for fd, objs in wrapped.items() if fd in rest})
        return found

    @staticmethod
    def _known_wrappers() -> dict[int, list[object]]:
        """The wrappers found this moment without a heap scan (from remembered owners)."""
        return reading("fd_known_wrappers", dict)

    def targets(self, items: Sequence[FdItem]) -> dict[FdItem, object]:
        """The wrapper of each descriptor; for one no Python object wraps, the object whose native
        code holds it (:func:`native_owners`), or that keeps it as a number or a copy."""
        wrapped = self._wrappers(item.fd for item in items)
        found: dict[FdItem, object] = {
            item: _innermost(wrapped[item.fd]) for item in items if wrapped.get(item.fd)
        }
        bare = [item for item in items if item not in found]
        if bare:
            owners = native_owners(bare)
            for item in bare:
                if item.fd in owners:
                    obj, what = owners[item.fd]
                    found[item] = obj
                    self._native[item.fd] = f"{what} {_python_name(obj)}"
        bare = [item for item in items if item not in found]
        if bare:  # kept as a number, or a copy of one kept (mmap dups the descriptor it maps)
            siblings = same_file_fds(item.fd for item in bare)
            others = {fd for fds in siblings.values() for fd in fds}
            holders = int_fd_holders({item.fd for item in bare} | others)
            held = self._wrappers(others) if others else {}
            for item in bare:
                for fd in (item.fd, *siblings.get(item.fd, ())):
                    if fd in holders:
                        obj, attribute = holders[fd]
                        what = f"kept as {_python_name(obj)}.{attribute}"
                    elif held.get(fd):
                        obj = _innermost(held[fd])
                        what = f"a copy of fd {fd}, wrapped by {_python_name(obj)}"
                    else:
                        continue
                    found[item] = obj
                    self._native[item.fd] = what if fd == item.fd else f"{what} (as fd {fd})"
                    break
        return found

    def settle(self, items: Sequence[FdItem], deadline: float) -> list[FdItem]:
        return settle(items, deadline)

    def kept_by_libraries(self, items: Sequence[FdItem]) -> dict[FdItem, str]:
        return kept_by_libraries(items)

    def settle_long_lived(
        self, items: Sequence[FdItem], deadline: float, *, thorough: bool = False
    ) -> list[FdItem]:
        """What a remembered owner still reaches is open for good (no collection asked); the rest
        as :func:`~pytest_shutdown._fast.cheap.settle_listed` finds it."""
        left = still_open(items)
        held = wrappers_held_by_recent_owners(item.fd for item in left) if left else {}
        alive = [item for item in left if item.fd in held]
        rest = [item for item in left if item.fd not in held]
        if rest:
            rest = _cheap.settle_listed(rest, still_open, deadline, thorough=thorough)
        return alive + rest

    def describe(self, items: Sequence[FdItem]) -> list[dict[str, Any]]:
        table = _socket_table(items)
        holders = fd_holders(item.fd for item in items if self._types.get(item.fd))
        records = []
        for item in items:
            record = describe_fd(item, table)
            held = self._types.get(item.fd) or []
            record["python_objects"] = held
            if item.fd in holders:
                record["holder"] = holders[item.fd]
            if held:
                record["opened_by"] = f"held by {', '.join(held)}"
            else:
                libraries = loaded_native_libraries()  # cached until the next import
                record["opened_by"] = _native_phrase(record, libraries, self._native.get(item.fd))
                record["native"] = True
                if libraries and record["kind"] in _NATIVE_HELPER_KINDS:
                    record["likely_library"] = libraries[0]
            records.append(record)
        if "zmq" in sys.modules:
            from pytest_shutdown.resources.zmq_sockets import name_descriptors  # noqa: PLC0415

            name_descriptors(records)
            self._name_context_holders(records)
            # the sockets' names lead, then their contexts'
            records.sort(key=lambda r: ("zmq_socket" not in r, "zmq_context" not in r))
        return records

    def _name_context_holders(self, records: Sequence[dict[str, Any]]) -> None:
        """A descriptor a zmq context was named for is no longer a guess at a library (the owner
        search, where it ran, named the context's Python class already)."""
        from pytest_shutdown.resources._zmq_contexts import CONTEXT_ROLE  # noqa: PLC0415

        for record in records:
            context = record.get("zmq_context")
            if context is None:
                continue
            record.pop("likely_library", None)
            if record["fd"] not in self._native:
                holder = f"{CONTEXT_ROLE} {context['type']}"
                record["opened_by"] = _native_phrase(record, (), holder)

    def findings(
        self, items: Sequence[FdItem], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        records = self.describe(items)
        self._types.clear()
        self._native.clear()
        count = len(records)
        return left_findings(
            "fd-leak",
            "fds",
            records,
            _texts(records),
            f"{count} file descriptor{'s' if count != 1 else ''} opened in {subject} still open",
            grace=grace,
            extra=extra,
            note=_native_note(records),
        )

    def restore(self, items: Sequence[FdItem]) -> None:
        """Nothing: closing a descriptor under its holder could make their next write land in a
        file the next test opens."""
        self._types.clear()
        self._native.clear()
