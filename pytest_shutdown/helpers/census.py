"""What this process holds right now, counted cheaply: the readings growth over cycles compares.

A :class:`Census` reads, after a full ``gc.collect()``:

* live objects by type (every object the garbage collector tracks, counted in C:
  ``collections.Counter(map(type, gc.get_objects()))``; the same population as
  ``objgraph.typestats``, at a fraction of its cost);
* Python threads (``threading.enumerate()``) and OS threads (``/proc/self/task``, native ones
  included);
* open file descriptors (``/proc/self/fd``; ``psutil`` elsewhere);
* the resident set size;
* device memory, where a reader exists (:mod:`pytest_shutdown.gpu.readers`).

Readings are plain ``dict[str, int]``: the garbage collector does not track a dict that holds
only strings and integers, so keeping one reading per cycle adds no object to the next count.
On failure, :meth:`Census.instance_ids` and :meth:`Census.one_instance_each` find an instance
of a grown type made by one more cycle.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pytest_shutdown.resources.primitives import own_tasks

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.gpu.readers import MemoryReader

#: The scalar metrics, in report order (``device-memory`` only where a reader exists).
THREADS = "threads"
OS_THREADS = "os-threads"
FDS = "fds"
RSS = "rss"
DEVICE_MEMORY = "device-memory"
SCALARS: tuple[str, ...] = (THREADS, OS_THREADS, FDS, RSS, DEVICE_MEMORY)
#: The metrics measured in bytes (the rest are counts).
BYTE_METRICS: frozenset[str] = frozenset({RSS, DEVICE_MEMORY})
#: The prefix of an object-count metric: ``objects:<type name>``.
OBJECTS = "objects"

#: ``device_memory="auto"``: pick a reader once torch is imported and the platform has a device.
AUTO = "auto"


def type_name(kind: type) -> str:
    """``module.QualName`` for a type (bare ``qualname`` for builtins): the census's key."""
    qualname = getattr(kind, "__qualname__", None) or getattr(kind, "__name__", "?")
    module = getattr(kind, "__module__", None)
    if not isinstance(module, str) or module == "builtins":
        return str(qualname)
    return f"{module}.{qualname}"


def short_name(name: str) -> str:
    """The qualname part of a census key: ``pkg.mod.Outer.Inner`` → ``Outer.Inner`` (the longest
    prefix that names an imported module is dropped)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:cut]) in sys.modules:
            return ".".join(parts[cut:])
    return name


def count_objects(objects: Iterable[object]) -> dict[str, int]:
    """Live objects by type name (two types of one name are summed)."""
    by_type = collections.Counter(map(type, objects))
    counts: dict[str, int] = {}
    for kind, number in by_type.items():
        name = type_name(kind)
        counts[name] = counts.get(name, 0) + number
    del by_type
    return counts


def own_records() -> dict[str, int]:
    """Objects the plugin's guard keeps for every process started or signalled while it is on
    (the bounded records of :mod:`pytest_shutdown.ownership.origins` and
    :mod:`pytest_shutdown.ownership.signals_sent`): the guard's, not the code's under test, so
    they are not counted. Read through ``sys.modules``: nothing is imported."""
    kept: list[object] = []
    origins = sys.modules.get("pytest_shutdown.ownership.origins")
    for entry in list(getattr(origins, "_processes", {}).values()):
        kept += (entry, *entry)
    sent = sys.modules.get("pytest_shutdown.ownership.signals_sent")
    for table in (getattr(sent, "_to_pids", {}), getattr(sent, "_to_groups", {})):
        for record in list(table.values()):
            kept += (record, *record)
    return count_objects(obj for obj in kept if gc.is_tracked(obj)) if kept else {}


def fd_numbers() -> list[int]:
    """This process's open file descriptors (the fds kind's listing; ``psutil`` where there is
    no ``/proc``)."""
    if os.path.isdir("/proc/self/fd"):
        from pytest_shutdown.resources.fds import open_fds  # noqa: PLC0415 - when counted

        return sorted(open_fds())
    import psutil  # noqa: PLC0415 - only where /proc is missing

    return list(range(psutil.Process().num_fds()))


def fd_target(fd: int) -> str | None:
    """What descriptor ``fd`` of this process is (its ``/proc/self/fd`` link), or None."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def describe_fds(fds: Iterable[int]) -> dict[str, str]:
    """``{fd: what it is}``: ``/proc/self/fd`` link targets (a path, ``pipe:[…]``, ...)."""
    return {str(fd): fd_target(fd) or "(closed)" for fd in fds}


def os_thread_ids() -> list[int]:
    """Ids of this process's OS threads (``/proc/self/task``, as the native threads kind reads
    them); one per Python thread, plus native ones (OpenMP, CUDA, gRPC, ...). Empty where
    ``/proc`` is missing."""
    return sorted(int(tid) for tid in own_tasks())


def describe_os_threads(tids: Iterable[int]) -> dict[str, str]:
    """``{tid: name}`` of OS threads (``/proc/self/task/<tid>/comm``)."""
    from pytest_shutdown.resources.native_threads import _comm  # noqa: PLC0415 - failure path

    return {str(tid): str(_comm(tid, "(ended)")) for tid in tids}


def describe_threads(threads: Iterable[threading.Thread]) -> dict[str, str]:
    """``{name: what it runs}`` for Python threads (the target's qualified name)."""
    described: dict[str, str] = {}
    for thread in threads:
        target = getattr(thread, "_target", None)
        what = getattr(target, "__qualname__", None) or type(thread).__qualname__
        module = getattr(target, "__module__", None) if target is not None else None
        described[thread.name] = f"{module}.{what}" if module else str(what)
    return described


def pick_device_reader(spec: object) -> tuple[MemoryReader | None, str]:
    """The device-memory reader for ``device_memory=``, and a note saying why there is none.

    ``None`` measures no device memory; a reader (anything with ``name`` and ``used_bytes()``)
    is used as given; ``"auto"`` detects the platform, but only once torch has been imported
    (nothing is imported for a process that does not use it): on CUDA or ROCm the best reader
    of device 0 (:func:`pytest_shutdown.devices.memory_reader`: this process and its
    descendants where the library can tell), on the CPU none.
    """
    if spec is None:
        return None, "not measured (device_memory=None)"
    auto = isinstance(spec, str) and spec == AUTO
    if not auto and (isinstance(spec, str) or not callable(getattr(spec, "used_bytes", None))):
        raise ValueError(
            f"device_memory: expected 'auto', None or a reader with used_bytes(), got {spec!r}"
        )
    if not auto:
        return spec, ""  # type: ignore[return-value]
    if "torch" not in sys.modules:
        return None, "not measured: torch is not imported"
    from pytest_shutdown.devices import detect_platform, memory_reader  # noqa: PLC0415

    platform = detect_platform()
    if platform == "cpu":
        return None, "not measured: no device (the CPU platform)"
    try:
        return memory_reader(platform), ""
    except Exception as exc:  # noqa: BLE001 - no reader works: say so, measure the rest
        return None, f"not measured: {exc}"


class Census:
    """Counts what this process holds; one instance per growth check.

    ``device_reader`` is read when given (``None``: no device memory). Each count is taken after
    ``gc.collect()``; :meth:`read` returns the object counts and the scalar metrics.
    """

    def __init__(self, device_reader: MemoryReader | None = None) -> None:
        import psutil  # noqa: PLC0415

        self._process = psutil.Process()
        self.device_reader = device_reader

    def read(self) -> tuple[dict[str, int], dict[str, int]]:
        """Collect garbage, then count: ``(objects by type, scalar metrics)``."""
        gc.collect()
        scalars = self.read_scalars()
        objects = self.read_objects()
        return objects, scalars

    def read_objects(self) -> dict[str, int]:
        """Live (GC-tracked) objects by type name, less pytest-shutdown's own records."""
        objects = gc.get_objects()
        counts = count_objects(objects)
        del objects
        for name, number in own_records().items():
            counts[name] = counts.get(name, 0) - number
        return counts

    def read_scalars(self) -> dict[str, int]:
        """Threads, OS threads, fds, RSS and (with a reader) device memory."""
        scalars = {
            THREADS: threading.active_count(),
            OS_THREADS: len(own_tasks()),
            FDS: len(fd_numbers()),
            RSS: int(self._process.memory_info().rss),
        }
        if self.device_reader is not None:
            scalars[DEVICE_MEMORY] = int(self.device_reader.used_bytes())
        return scalars

    @staticmethod
    def instance_ids(names: Iterable[str]) -> set[int]:
        """The ids of the live instances of the named types (failure path only)."""
        return {id(obj) for obj in instances_of(names)}

    @staticmethod
    def one_instance_each(names: Iterable[str], old_ids: set[int]) -> dict[str, Any]:
        """For each type name, one live instance: preferably one whose id is not in ``old_ids``
        (made since they were taken), the most recently tracked first. Used on failure only;
        the caller drops the result as soon as it is done."""
        chosen: dict[str, Any] = {}
        fallback: dict[str, Any] = {}
        for obj in reversed(instances_of(names)):  # a full collection appends survivors
            name = type_name(type(obj))
            if name not in chosen and id(obj) not in old_ids:
                chosen[name] = obj
            elif name not in fallback:
                fallback[name] = obj
        for name, obj in fallback.items():
            chosen.setdefault(name, obj)
        return chosen


def instances_of(names: Iterable[str]) -> list[object]:
    """The live (GC-tracked) instances of the named types, oldest first. Failure path only:
    the caller drops the list as soon as it is done."""
    wanted = set(names)
    objects = gc.get_objects()
    kinds = {kind for kind in set(map(type, objects)) if type_name(kind) in wanted}
    return [obj for obj in objects if type(obj) in kinds]
