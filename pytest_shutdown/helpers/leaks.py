"""``no_leaks``: threads, child processes and gc freezes a block of code leaves behind.

Built on the primitives the guard's resource kinds share
(:mod:`pytest_shutdown.resources.primitives`: snapshot, ``started_since``, ``await_exit``,
``leak_findings``, ``kill_process_trees``), re-exported here: the helper and the plugin share one
implementation, cheap when nothing leaked.

:func:`assert_device_memory_released` checks the ``device-memory-held`` contract against any
reader with ``name`` and ``used_bytes()`` (see :class:`pytest_shutdown.devices.MemoryReader`).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from pytest_shutdown._base.hidden import contextmanager  # no contextlib frame on failure
from pytest_shutdown.findings.finding import Finding, ShutdownContractError

if TYPE_CHECKING:  # pragma: no cover

    from pytest_shutdown.devices import MemoryReader

__all__ = [
    "AllowRule",
    "LeakSnapshot",
    "Started",
    "ThreadFilter",
    "assert_device_memory_released",
    "await_exit",
    "kill_process_trees",
    "leak_findings",
    "no_leaks",
    "process_running",
    "started_since",
    "take_snapshot",
    "thread_filter",
    "thread_name",
]

# Moved to pytest_shutdown.resources.primitives (issue 47); importable from here as before.
from pytest_shutdown.resources.primitives import (
    FOREIGN_LOOKUPS as FOREIGN_LOOKUPS,
)
from pytest_shutdown.resources.primitives import (
    HELPER_MODULE_NAMES as HELPER_MODULE_NAMES,
)
from pytest_shutdown.resources.primitives import (
    OWN_THREAD_PREFIX as OWN_THREAD_PREFIX,
)
from pytest_shutdown.resources.primitives import (
    STACK_LIMIT as STACK_LIMIT,
)
from pytest_shutdown.resources.primitives import (
    AllowRule as AllowRule,
)
from pytest_shutdown.resources.primitives import (
    LeakSnapshot as LeakSnapshot,
)
from pytest_shutdown.resources.primitives import (
    Started as Started,
)
from pytest_shutdown.resources.primitives import (
    ThreadFilter as ThreadFilter,
)
from pytest_shutdown.resources.primitives import (
    await_exit as await_exit,
)
from pytest_shutdown.resources.primitives import (
    cached_descendants as cached_descendants,
)
from pytest_shutdown.resources.primitives import (
    child_state as child_state,
)
from pytest_shutdown.resources.primitives import (
    descendant_pids as descendant_pids,
)
from pytest_shutdown.resources.primitives import (
    descendants_if_nothing_of_ours as descendants_if_nothing_of_ours,
)
from pytest_shutdown.resources.primitives import (
    helper_module_names as helper_module_names,
)
from pytest_shutdown.resources.primitives import (
    helper_numbers as helper_numbers,
)
from pytest_shutdown.resources.primitives import (
    kill_process_trees as kill_process_trees,
)
from pytest_shutdown.resources.primitives import (
    last_pid as last_pid,
)
from pytest_shutdown.resources.primitives import (
    leak_findings as leak_findings,
)
from pytest_shutdown.resources.primitives import (
    modules_named as modules_named,
)
from pytest_shutdown.resources.primitives import (
    multiprocessing_helper_pids as multiprocessing_helper_pids,
)
from pytest_shutdown.resources.primitives import (
    nothing_of_ours_since as nothing_of_ours_since,
)
from pytest_shutdown.resources.primitives import (
    own_tasks as own_tasks,
)
from pytest_shutdown.resources.primitives import (
    process_lifetime_helpers as process_lifetime_helpers,
)
from pytest_shutdown.resources.primitives import (
    process_running as process_running,
)
from pytest_shutdown.resources.primitives import (
    started_since as started_since,
)
from pytest_shutdown.resources.primitives import (
    take_snapshot as take_snapshot,
)
from pytest_shutdown.resources.primitives import (
    thread_filter as thread_filter,
)
from pytest_shutdown.resources.primitives import (
    thread_name as thread_name,
)

# --- the helper ------------------------------------------------------------------------------


def _contain() -> Callable[[], None] | None:
    """Become a child subreaper (Linux) unless already one; the undo, or None."""
    from pytest_shutdown._os.prctl import PR_SET_CHILD_SUBREAPER, prctl  # noqa: PLC0415
    from pytest_shutdown.ownership.containment import _subreaper_now  # noqa: PLC0415

    if _subreaper_now() is not False or not prctl(PR_SET_CHILD_SUBREAPER, 1):
        return None

    def undo() -> None:
        prctl(PR_SET_CHILD_SUBREAPER, 0)

    return undo


def _check_grace(grace: float) -> None:
    if not isinstance(grace, (int, float)) or math.isnan(grace) or grace < 0:
        raise ValueError(f"grace: expected a number of seconds >= 0, got {grace!r}")


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

    Threads and child processes (recursive) started inside the block and still running ``grace``
    seconds after it ends are ``thread-leak`` (names and stacks) and ``process-leak`` (pid, name,
    command line); a ``gc.get_freeze_count()`` higher than at entry is ``gc-frozen-leak`` (a
    lower one is not: frozen objects that die leave the permanent generation by themselves).
    On Linux the process is a child subreaper for the block's duration (as it is for the whole
    session under the guard), so a daemon, a shell's background job or a grandchild whose parent
    exited is still found. Each kind can be switched off. ``allow`` ignores threads: glob
    patterns matched against the thread name (``"ThreadPoolExecutor-*"``) or predicates taking
    the ``threading.Thread``.
    Raises :class:`~pytest_shutdown.findings.finding.ShutdownContractError`; when the block itself
    raises, that exception propagates unchanged and nothing is checked.

    Nothing is killed or unfrozen: the caller decides (see :func:`kill_process_trees`).

    Example::

        with no_leaks(grace=1.0):
            engine = start_engine()
            engine.shutdown()
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    _check_grace(grace)
    allowed = thread_filter(allow)
    contained = _contain() if processes else None
    try:
        before = take_snapshot(threads=threads, processes=processes)
        yield before
        started = started_since(before, threads=threads, processes=processes, allow=allowed)
        left = await_exit(started, grace) if started else started
    finally:
        if contained is not None:
            contained()
    freeze_after = gc.get_freeze_count()
    findings = leak_findings(
        left,
        grace=grace,
        subject="the no_leaks() block",
        freeze_before=before.freeze_count if gc_freeze else None,
        freeze_after=freeze_after if gc_freeze else None,
    )
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
    for option, value in (("timeout", timeout), ("interval", interval)):
        if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
            raise ValueError(f"{option}: expected a number of seconds >= 0, got {value!r}")
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
