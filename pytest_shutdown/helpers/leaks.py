"""``no_leaks``: what a block of code leaves behind, seen through the guard's resource kinds.

The helper walks the kinds the guard walks after a test (:data:`pytest_shutdown.resources.KINDS`:
Python threads, native threads, descendant processes, a ``gc.freeze()``), with their snapshots,
their diffs, their grace and their findings: a helper and the guard see the same things. Like the
guard in warn mode it only observes: it never becomes a child subreaper, reaps, kills or unfreezes.
The primitives those kinds share (:mod:`pytest_shutdown.resources.primitives`) are importable from
here as before.

:func:`assert_device_memory_released` checks the ``device-memory-held`` contract against any
reader with ``name`` and ``used_bytes()`` (see :class:`pytest_shutdown.devices.MemoryReader`).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from pytest_shutdown._base.arguments import require_instance
from pytest_shutdown._base.hidden import contextmanager  # no contextlib frame on failure
from pytest_shutdown._fast.lazy_exports import lazy_exports
from pytest_shutdown.findings.finding import Finding, ShutdownContractError
from pytest_shutdown.helpers.report import is_seconds
from pytest_shutdown.resources.primitives import (
    AllowRule,
    LeakSnapshot,
    ThreadFilter,
    last_pid,
    thread_filter,
)

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.devices import MemoryReader
    from pytest_shutdown.resources.base import ResourceKind

__all__ = [
    "AllowRule",
    "LeakSnapshot",
    "ThreadFilter",
    "assert_device_memory_released",
    "no_leaks",
    "thread_filter",
]

#: The other primitives, importable from here as before they moved (issue 47).
__getattr__ = lazy_exports(
    __name__,
    dict.fromkeys(
        "FOREIGN_LOOKUPS HELPER_MODULE_NAMES OWN_THREAD_PREFIX STACK_LIMIT Started await_exit "
        "cached_descendants child_state descendant_pids descendants_if_nothing_of_ours "
        "helper_module_names helper_numbers kill_process_trees leak_findings modules_named "
        "multiprocessing_helper_pids nothing_of_ours_since own_tasks process_lifetime_helpers "
        "process_running started_since take_snapshot thread_name".split(),
        "pytest_shutdown.resources.primitives",
    ),
    globals(),
)[0]

#: Where ``no_leaks``'s findings say things were started.
SUBJECT = "the no_leaks() block"


def _kinds(
    threads: bool, processes: bool, gc_freeze: bool, tools: ThreadFilter
) -> list[ResourceKind]:
    """The guard's kinds that ``no_leaks`` checks, in the registry's order (its findings')."""
    from pytest_shutdown.resources import KINDS, load_kind  # noqa: PLC0415

    wanted = {"threads": threads, "native-threads": threads, "processes": processes}
    wanted["gc-freeze"] = gc_freeze
    return [load_kind(name, tools=tools) for name in KINDS if wanted.get(name)]


def _mark() -> Callable[[], None] | None:
    """Put a marker of the block's own in the environment and watch for it, as the guard does
    for its session (:mod:`pytest_shutdown._os.escaped`): a process that leaves the block's tree
    (a daemon's double fork) is found by it, not adopted. Nothing to do where a marker is
    watched already (a guarded session), where orphans come back to this process (a
    subreaper), or off Linux. Returns the undo, or None."""
    global _blocks, _undo_marker, _marker_pid
    from pytest_shutdown._os import escaped  # noqa: PLC0415
    from pytest_shutdown.ownership.containment import (  # noqa: PLC0415
        SESSION_MARKER_ENV,
        _subreaper_now,
    )

    env = SESSION_MARKER_ENV
    with _blocks_lock:
        if _blocks:  # another thread's block put the marker: it stays until the last one ends
            _blocks += 1
            return _end_block
        if not sys.platform.startswith("linux") or escaped.watching() or _subreaper_now():
            return None
        since = last_pid()  # before the marker: a process that can carry it is numbered after
        token, old = os.urandom(8).hex(), os.environ.get(env)
        os.environ[env] = token
        previous = escaped.watch_marker(env, token, since)

        def undo() -> None:
            escaped.restore_watch(previous)
            if os.environ.get(env) == token:
                if old is None:
                    del os.environ[env]
                else:
                    os.environ[env] = old

        _blocks, _undo_marker, _marker_pid = 1, undo, os.getpid()
        return _end_block


_blocks_lock = threading.Lock()
#: How many blocks (in any thread) use the marker the first of them put; its undo, and the
#: process that put it.
_blocks = 0
_undo_marker: Callable[[], None] | None = None
_marker_pid = 0


def _end_block() -> None:
    global _blocks
    with _blocks_lock:
        _blocks -= 1
        if _blocks == 0 and _undo_marker is not None and os.getpid() == _marker_pid:
            _undo_marker()  # (a forked child's copy of the block is not the marker's owner)


def _check_seconds(name: str, value: float) -> None:
    if not is_seconds(value, zero_ok=True):  # a bool, NaN or inf is no deadline
        raise ValueError(f"{name}: expected a finite number of seconds >= 0, got {value!r}")


@contextmanager
def no_leaks(
    *,
    threads: bool = True,
    processes: bool = True,
    gc_freeze: bool = True,
    grace: float = 2.0,
    allow: Sequence[AllowRule] = (),
) -> Iterator[LeakSnapshot]:
    """Fail when the block leaves threads, child processes or a ``gc.freeze()`` behind.

    The guard's kinds, checked as the guard checks a test (one deadline for all): threads
    started inside the block and still running ``grace`` seconds after it ends are
    ``thread-leak``, Python threads (names, stacks) and native ones that ``threading`` does not
    list (tid, kernel name; process-lifetime pools of torch, OpenMP, gRPC ... are not blamed);
    child processes (recursive) are ``process-leak`` (pid, name, command line); a
    ``gc.get_freeze_count()`` higher than at entry is ``gc-frozen-leak`` (a lower one is not:
    frozen objects that die leave the permanent generation by themselves). A daemon, a shell's
    background job or a grandchild whose parent exited is found by a marker in the environment
    (the block's own, or a guarded session's): this process never becomes their subreaper, so
    the code sees what it sees without the check. Each kind can be switched off (``threads``:
    both kinds of threads). ``allow`` ignores threads: glob patterns matched against the name
    (``"ThreadPoolExecutor-*"``; a native thread's kernel name) or predicates taking the
    ``threading.Thread``. Raises :class:`~pytest_shutdown.findings.finding.ShutdownContractError`;
    when the block itself raises, that exception propagates unchanged and nothing is checked.
    Nothing is killed or unfrozen: the caller decides
    (:func:`pytest_shutdown.orphans.kill_process_trees`).

    Example::

        with no_leaks(grace=1.0):
            engine = start_engine()
            engine.shutdown()
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    _check_seconds("grace", grace)
    kinds = _kinds(threads, processes, gc_freeze, thread_filter(allow))
    patterns = tuple(rule for rule in allow if isinstance(rule, str)) or None
    unmark = _mark() if processes else None
    try:
        before = {kind.name: kind.snapshot() for kind in kinds}
        yield LeakSnapshot(
            before.get("threads", frozenset()),
            before.get("processes", frozenset()),
            before.get("gc-freeze", gc.get_freeze_count()),
        )
        found = [(kind, kind.new_since(before[kind.name], patterns)) for kind in kinds]
        deadline = time.monotonic() + grace
        left = [(kind, kind.settle(items, deadline)) for kind, items in found if items]
        findings = [
            f for kind, items in left if items for f in kind.findings(items, SUBJECT, grace=grace)
        ]
    finally:
        if unmark is not None:
            unmark()
    if findings:
        raise ShutdownContractError(findings)


#: Default slack for :func:`assert_device_memory_released`: allocator caches and driver
#: bookkeeping move by a few MiB without anything being held.
DEFAULT_DEVICE_TOLERANCE_BYTES = 64 * 1024 * 1024


def assert_device_memory_released(
    reader: MemoryReader,
    baseline_bytes: int,
    *,
    tolerance_bytes: int = DEFAULT_DEVICE_TOLERANCE_BYTES,
    timeout: float = 30.0,
    interval: float = 0.1,
) -> int:
    """Wait until ``reader.used_bytes()`` is back to ``baseline_bytes`` (+ ``tolerance_bytes``).

    ``reader`` is anything with ``name: str`` and ``used_bytes() -> int`` (the readers of
    :mod:`pytest_shutdown.devices`); ``baseline_bytes`` is a reading taken before the engine
    started. Device memory of a process that was just killed returns asynchronously, so the
    reader is polled every ``interval`` seconds until ``timeout``; after the first reading above
    the limit, one ``gc.collect()`` drops tensors held only by garbage. Returns the last reading;
    raises :class:`~pytest_shutdown.findings.finding.ShutdownContractError` with
    ``device-memory-held`` (device, baseline, last reading, bytes held, time waited) when memory
    did not come back.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    reads = "a memory reader (with used_bytes()): pytest_shutdown.devices.memory_reader()"
    require_instance("assert_device_memory_released", "reader", reader, reads)
    if not callable(getattr(reader, "used_bytes", None)):
        raise TypeError(f"assert_device_memory_released: `reader` is {reader!r}, expected {reads}")
    _check_seconds("timeout", timeout)
    _check_seconds("interval", interval)
    if interval == 0:
        raise ValueError("interval: expected a number of seconds > 0, got 0")
    if tolerance_bytes < 0 or baseline_bytes < 0:
        raise ValueError(
            "baseline_bytes and tolerance_bytes: expected byte counts >= 0, got "
            f"{baseline_bytes!r} and {tolerance_bytes!r}"
        )
    limit = baseline_bytes + tolerance_bytes
    start = time.monotonic()
    deadline = start + timeout
    collected = False
    while True:
        used = int(reader.used_bytes())
        if used <= limit:
            return used
        now = time.monotonic()
        if now >= deadline:
            break
        if not collected:
            collected = True
            gc.collect()
            continue
        time.sleep(min(interval, deadline - now))
    held = used - baseline_bytes
    raise ShutdownContractError(
        [
            Finding(
                "device-memory-held",
                f"{reader.name}: {held / 2**20:.1f} MiB above the baseline still in use after "
                f"{timeout:g} s (tolerance {tolerance_bytes / 2**20:.1f} MiB).",
                {
                    "device": reader.name,
                    "baseline_bytes": baseline_bytes,
                    "used_bytes": used,
                    "held_bytes": held,
                    "tolerance_bytes": tolerance_bytes,
                    "waited_s": round(time.monotonic() - start, 3),
                },
            )
        ]
    )
