"""Threads ``threading`` does not list (``thread-leak``): ``_thread.start_new_thread`` and
threads started in C, found in ``/proc/self/task`` (Linux only).

No task is created anywhere without moving ``ns_last_pid``: the task folder is listed only when
it moved. A new task that is no ``threading.Thread`` (by ``native_id``) and is not allowed is
named by its tid and kernel name (``comm``). Process-lifetime native pools are never blamed
(:data:`DEFAULT_ALLOWED` and the ini option ``shutdown_native_threads_allow``: globs of the
kernel name, and ``@openmp``: unnamed workers, named like their starter, while an OpenMP-style
runtime is loaded).
"""

from __future__ import annotations

import fnmatch
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown._fast.cheap import self_maps
from pytest_shutdown._os.forks import this_pid
from pytest_shutdown._os.own_threads import NATIVE_IDS
from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.origins import python_thread_tid
from pytest_shutdown.resources.base import Allowance, Extra, ObjectKind, after_grace
from pytest_shutdown.resources.primitives import last_pid, nothing_of_ours_since, own_tasks

__all__ = ["DEFAULT_ALLOWED", "NativeThreadKind"]

#: Kernel names (``comm``, 15 characters at most) of process-lifetime native pools that
#: libraries start lazily, once, and keep until exit. ``@openmp`` is the unnamed-worker rule.
DEFAULT_ALLOWED: tuple[str, ...] = (
    "@openmp",  # OpenMP / MKL / torch intra-op workers (unnamed), while such a runtime is loaded
    "pt_*",  # torch: autograd, inter-op pool ("pt_thread_pool", "pt_autograd_0")
    "torch_*",
    "c10*",
    "grpc_*",  # gRPC core: timer manager, executors, resolvers
    "grpcpp_*",
    "event_engine*",  # gRPC's EventEngine thread pool (the process-wide default engine)
    "gcs_client_io_s",  # Ray's core: the function-local static GCS client I/O context
    "default-executo",
    "resolver-execut",
    "timer_manager",
    "cuda-EvtHandlr",  # the CUDA driver's event and callback threads
    "cuda0*",
    "cudaEvt*",
    "nvml*",  # NVML / DCGM helpers
    "nv_queue",
    "tokio-runtime-w",  # Rust runtimes in Python wheels (tokenizers, safetensors...)
    "rayon-*",
    "jemalloc_bg_thd",
    "tbb*",
    "ZMQbg/*",  # pyzmq's I/O threads
    "gmain",  # GLib
    "gdbus",
)
#: Shared libraries whose presence makes unnamed workers an OpenMP/MKL-style pool.
#: ``openblas`` also matches numpy/scipy wheels' ``libscipy_openblas64_``.
_OPENMP_LIBRARIES = ("libgomp", "libiomp", "libomp", "libmkl", "libtbb", "openblas", "libblis")

_TASK = "/proc/self/task"


def _comm(tid: int, missing: str | None = "?") -> str | None:
    try:
        with open(f"{_TASK}/{tid}/comm", "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError:
        return missing


#: (len(sys.modules) when /proc/self/maps was read, whether a runtime was loaded then)
_openmp_seen: tuple[int, bool] | None = None


def _openmp_loaded() -> bool:
    """Whether an OpenMP-style runtime is loaded (one is never unloaded; while none is, the
    maps are read again only after an import)."""
    global _openmp_seen
    modules = len(sys.modules)
    seen = _openmp_seen
    if seen is not None and (seen[1] or seen[0] == modules):
        return seen[1]
    maps = self_maps()
    if not maps:
        return False
    loaded = any(lib.encode() in maps for lib in _OPENMP_LIBRARIES)
    _openmp_seen = (modules, loaded)
    return loaded


class NativeThreadKind(ObjectKind):
    """Tasks of this process (tids) that ``threading`` does not know."""

    name = "native-threads"
    allow_key = "threads"
    mark = "last_pid"

    def __init__(self, settings: Any = None) -> None:
        extra = tuple(getattr(settings, "native_threads_allow", ()) or ())
        self.allowed = DEFAULT_ALLOWED + extra
        self.enabled = sys.platform.startswith("linux") and os.path.isdir(_TASK)
        #: ns_last_pid at the last listing, and that listing (a dead tid in it is harmless: it is
        #: reused only after the pids wrapped around, which moves the marker)
        self._listed_marker: bytes | None = None
        self._listed: frozenset[int] = frozenset()
        self._pid = this_pid()
        #: ns_last_pid at a snapshot -> how many threads this process had started then
        self._started_at: dict[bytes, int] = {}

    def _tids(self) -> frozenset[int]:
        return frozenset(int(t) for t in own_tasks())

    def _no_own_task_since_listing(self, marker: bytes) -> bool:
        listed_at = self._listed_marker
        if listed_at is None:
            return False
        started = self._started_at.get(listed_at)
        # No descendants given: a descendant's task is no native thread of this process.
        return started is not None and nothing_of_ours_since(
            listed_at, started, marker, frozenset()
        )

    def fingerprint(self) -> bytes | frozenset[int] | None:
        if not self.enabled:
            return None
        marker = last_pid()  # no task was created anywhere while it does not move
        return marker if marker is not None else self._tids()

    def snapshot(self) -> tuple[bytes | None, frozenset[int]] | None:
        if not self.enabled:
            return None
        started = origins.threads_started()  # before the marker: a thread started now is new
        marker = last_pid()  # read before listing: a task created meanwhile moves it
        if (
            marker is None
            or this_pid() != self._pid
            or (marker != self._listed_marker and not self._no_own_task_since_listing(marker))
        ):
            self._listed = self._tids()
            self._pid = this_pid()
        self._listed_marker = marker
        if marker is not None and marker not in self._started_at:
            if len(self._started_at) >= 16:
                del self._started_at[next(iter(self._started_at))]
            self._started_at[marker] = started
        return (marker, self._listed)

    def absorb(self, before: Any, start: Any, end: Any) -> Any:
        if before is None:
            return before
        new = frozenset(self.new_since(start)) if start is not None else frozenset()
        return (before[0], before[1] | new) if new else before

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[int]:
        if before is None or allow is True:
            return ()
        marker = last_pid()
        if marker is not None and marker == before[0]:
            return ()  # no task created anywhere since: the common case, no listing
        started = self._started_at.get(before[0]) if before[0] is not None else None
        if marker is not None and started is not None and this_pid() == self._pid:
            if nothing_of_ours_since(before[0], started, marker, frozenset()):
                return ()  # each task created since is a thread it started, or another's
        now = self._tids()
        self._listed, self._listed_marker, self._pid = now, marker, this_pid()
        fresh = now - before[1]
        if not fresh:
            return ()
        known = {t.native_id for t in threading.enumerate()} | NATIVE_IDS
        known.add(threading.get_native_id())
        fresh = frozenset(t for t in fresh if t not in known and not python_thread_tid(t))
        if not fresh:
            return ()
        return self._not_allowed(sorted(fresh), allow if isinstance(allow, tuple) else ())

    def _not_allowed(self, tids: Sequence[int], extra: Sequence[Any] = ()) -> tuple[int, ...]:
        """The tasks among ``tids`` still there whose kernel name no allowed pattern matches."""
        patterns = [p for p in self.allowed if not p.startswith("@")]
        patterns.extend(p for p in extra if isinstance(p, str))
        main_name = _comm(os.getpid())
        openmp: bool | None = None if "@openmp" in self.allowed else False  # looked up lazily
        found = []
        for tid in tids:
            name = _comm(tid, None)
            if name is None:
                continue  # ended since the listing (a joined thread's task lingers a moment)
            if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                continue
            if name == main_name and openmp is not False:
                if openmp is None:
                    openmp = _openmp_loaded()
                if openmp:
                    continue
            found.append(tid)
        return tuple(found)

    def targets(self, items: Sequence[int]) -> Mapping[Any, object]:
        """The object each ``_thread.start_new_thread`` thread runs for (none for a C thread)."""
        found = {}
        for tid in items:
            obj = origins.native_thread_runs(tid)
            if obj is not None:
                found[tid] = obj
        return found

    def settle(self, items: Sequence[int], deadline: float) -> Sequence[int]:
        left = tuple(items)
        delay = 0.001  # a joined thread's task ends a moment after join() returned
        while left:
            left = tuple(t for t in left if os.path.exists(f"{_TASK}/{t}"))
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.02)
        if left:
            # A Python thread caught before its bootstrap set its native id is threading's now:
            # the threads kind answers for it.
            known = {t.native_id for t in threading.enumerate()}
            left = tuple(t for t in left if t not in known)
        if left:
            # A native thread names itself once it runs (libzmq's ZMQbg/Reaper, torch's pt_*):
            # caught before that it had its starter's name; its name now may be an allowed one.
            left = self._not_allowed(left)
        return left

    def findings(
        self, items: Sequence[int], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        if not items:
            return []
        records: list[dict[str, Any]] = [
            {"tid": tid, "name": _comm(tid), "native": True, "stack": ""} for tid in items
        ]
        listed = set(threading._active)  # type: ignore[attr-defined]
        python_stacks = [
            "".join(traceback.format_stack(frame)[-40:])
            for ident, frame in sys._current_frames().items()
            if ident not in listed
        ]
        if len(records) == len(python_stacks) == 1:  # a _thread.start_new_thread thread
            records[0]["stack"] = python_stacks[0]
        names = ", ".join(f"{r['tid']} ({r['name']})" for r in records)
        count = len(records)
        return [
            Finding(
                "thread-leak",
                f"{count} native thread{'s' if count != 1 else ''} (not listed by threading) "
                f"started in {subject} still running {after_grace(grace)}: {names}.",
                {
                    "threads": records,
                    "python_stacks_not_listed_by_threading": python_stacks,
                    "grace_s": grace,
                    **dict(extra or {}),
                },
            )
        ]
