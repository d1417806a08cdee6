"""``assert_second_engine_clean``: a second engine in the same process (the vLLM #54162 shape).

Build engine A, use it, shut it down and drop it; then everything A made must be gone before
engine B is built: A itself and the objects of A's types (``not-collected``), A's threads
(``thread-leak``), A's file descriptors (``growth``: they would pile up with every engine) and
A's device memory (``device-memory-held``). Then B is built, used and shut down: a B that fails
fails the check with its own exception. A's threads and descriptors are read by the guard's
kinds (:mod:`pytest_shutdown.resources.threads`, :mod:`pytest_shutdown.resources.fds`).
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_shutdown._base.arguments import require_callable
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.census import (
    AUTO,
    Census,
    count_objects,
    pick_device_reader,
    short_name,
    type_name,
)
from pytest_shutdown.helpers.report import CheckReport, is_seconds
from pytest_shutdown.resources.fds import FdItem, new_fds, still_open, take_fd_snapshot
from pytest_shutdown.resources.threads import ThreadKind

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.gpu.readers import MemoryReader

#: How long A's threads, fds and device memory may take to go after A's shutdown returned.
DEFAULT_DEADLINE_S = 5.0
#: Device memory above the baseline that still counts as returned (bytes).
DEFAULT_DEVICE_TOLERANCE = 2 << 20
POLL_S = 0.02
#: Surviving types explained with a backref chain.
CHAINS = 2


def _shutdown(engine: Any) -> None:
    engine.shutdown()


def _owned_types(engine: object) -> set[type]:
    """The engine's type and the types of what it holds (its attributes, one level into
    lists, tuples, sets and dicts), builtins left out."""
    kinds = {type(engine)}
    values: list[object] = list(getattr(engine, "__dict__", {}).values())
    for value in list(values):
        if isinstance(value, (list, tuple, set, frozenset)):
            values += list(value)
        elif isinstance(value, dict):
            values += list(value.values())
    for value in values:
        kind = type(value)
        if kind.__module__ != "builtins" and not isinstance(value, type):
            kinds.add(kind)
    return kinds


def assert_second_engine_clean(
    build: Callable[[], Any],
    use: Callable[[Any], object],
    *,
    shutdown: Callable[[Any], object] = _shutdown,
    device_memory: MemoryReader | str | None = AUTO,
    device_tolerance: int = DEFAULT_DEVICE_TOLERANCE,
    deadline_s: float = DEFAULT_DEADLINE_S,
    warmup: int = 1,
) -> CheckReport:
    """Build, use and shut down engine A, check that nothing of A is left, then build and use
    engine B in the same process.

    ``build()`` returns a new engine; ``use(engine)`` exercises it (its return value is
    dropped); ``shutdown(engine)`` stops it (default ``engine.shutdown()``). First, ``warmup``
    engines are built, used and shut down unchecked: what the first engine of a process starts
    for the process's lifetime (multiprocessing's fork server and its pipes, imports, caches) is
    not A's. After A's shutdown
    (and ``gc.collect()``), within ``deadline_s`` seconds: A and every object of A's types (A's
    class and the classes of what A holds) that A made are collected (``not-collected``, with
    the backref chain of one survivor), the threads started while A lived have ended
    (``thread-leak``), the file descriptors A opened are closed (``growth``), and device memory
    is back within ``device_tolerance`` bytes of its baseline (``device-memory-held``;
    ``device_memory`` as in :func:`~pytest_shutdown.assert_no_growth`: ``"auto"`` measures it on
    CUDA/ROCm when torch is imported before the call). Then B is built, used and shut down; an
    exception of B's propagates (with a note naming the check). Raises
    :class:`~pytest_shutdown.ShutdownContractError`; returns a :class:`CheckReport`.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    for argument, value, expected in (
        ("build", build, "a function that builds an engine: the class itself, or lambda: ..."),
        ("use", use, "a function that uses the engine it is given"),
        ("shutdown", shutdown, "a function that shuts the engine it is given down"),
    ):
        require_callable("assert_second_engine_clean", argument, value, expected)
    if not is_seconds(deadline_s, zero_ok=True):
        raise ValueError(f"deadline_s: expected a number of seconds >= 0, got {deadline_s!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: expected an integer >= 0, got {warmup!r}")
    started = time.perf_counter()
    for _ in range(warmup):
        engine = build()
        try:
            use(engine)
        finally:
            shutdown(engine)
        del engine
    reader, note = pick_device_reader(device_memory)
    thread_kind = ThreadKind()
    gc.collect()
    objects_before = count_objects(gc.get_objects())
    fds_before, threads_before = take_fd_snapshot(), thread_kind.snapshot()
    memory_before = reader.used_bytes() if reader is not None else None

    engine = build()
    subject = type(engine).__qualname__
    use(engine)
    kinds = [type_name(kind) for kind in _owned_types(engine)]
    threads_of_a = [weakref.ref(t) for t in thread_kind.new_since(threads_before)]
    fds_of_a = new_fds(fds_before)
    del threads_before
    shutdown(engine)
    engine_ref = _weak(engine)
    del engine

    def left_of_a() -> dict[str, Any]:
        """One reading, after a collection, of what A left (empty: nothing). Only the names
        of its threads are kept, so the reading never keeps a thread of A alive."""
        gc.collect()
        threads = [t for t in (ref() for ref in threads_of_a) if t is not None]
        left: dict[str, Any] = {"threads": [t.name for t in thread_kind.still_there(threads)]}
        del threads
        left["fds"] = _described(still_open(fds_of_a))
        memory = reader.used_bytes() if reader is not None else None
        if memory is not None and memory_before is not None:
            left["memory"] = memory if memory > memory_before + device_tolerance else None
        left["alive"] = engine_ref is not None and engine_ref() is not None
        counts = count_objects(gc.get_objects())
        left["surviving"] = {
            name: counts.get(name, 0) - objects_before.get(name, 0)
            for name in kinds
            if counts.get(name, 0) > objects_before.get(name, 0)
        }
        del counts
        return {what: value for what, value in left.items() if value}

    try:
        deadline = time.monotonic() + deadline_s
        while (left := left_of_a()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    finally:
        close = getattr(reader, "close", None)
        if isinstance(device_memory, str) and callable(close):
            close()  # a reader picked here is closed here (NVML, amdsmi)
    raise_if_any(_findings(subject, left, engine_ref, reader, memory_before, device_tolerance))
    a_done = time.perf_counter() - started

    second = build()
    try:
        use(second)
    except BaseException as exc:
        if hasattr(exc, "add_note"):
            exc.add_note(
                f"assert_second_engine_clean: the second {subject} failed in the process "
                "where the first one was shut down cleanly"
            )
        raise
    finally:
        shutdown(second)
        del second
    return CheckReport(
        "second-engine-clean",
        subject,
        time.perf_counter() - started,
        timings={"first_engine_s": a_done},
        details={
            "types_checked": sorted(kinds),
            "threads_of_first": len(threads_of_a),
            "fds_of_first": _described(fds_of_a),
            "device_memory": getattr(reader, "name", None) or note,
        },
    )


def _weak(engine: object) -> Callable[[], object] | None:
    try:
        return weakref.ref(engine)
    except TypeError:  # no __weakref__ slot: the type count still tells
        return None


def _described(items: list[FdItem]) -> dict[str, str]:
    return {str(item.fd): item.target for item in items}


def _findings(
    subject: str,
    left: dict[str, Any],
    engine_ref: Callable[[], object] | None,
    reader: MemoryReader | None,
    memory_before: int | None,
    tolerance: int,
) -> list[Finding]:
    findings: list[Finding] = []
    if left.get("alive") or left.get("surviving"):
        findings.append(_not_collected(subject, engine_ref, left.get("surviving", {})))
    if left.get("threads"):
        names = left["threads"]
        findings.append(
            Finding(
                "thread-leak",
                f"the first {subject}'s thread(s) {', '.join(repr(n) for n in names)} still ran "
                "after its shutdown, when a second one was to be built.",
                {"threads": names},
            )
        )
    if left.get("fds"):
        open_fds = left["fds"]
        shown = ", ".join(f"{fd} -> {target}" for fd, target in list(open_fds.items())[:5])
        findings.append(
            Finding(
                "growth",
                f"the first {subject} left {len(open_fds)} file descriptor(s) open after its "
                f"shutdown ({shown}): every engine built in this process adds as many.",
                {"metric": "fds", "fds": open_fds},
            )
        )
    if left.get("memory") is not None and memory_before is not None:
        after = left["memory"]
        findings.append(
            Finding(
                "device-memory-held",
                f"the first {subject} held {(after - memory_before) / (1 << 20):.1f} MiB of "
                f"device memory after its shutdown (reader {getattr(reader, 'name', '?')}).",
                {"baseline": memory_before, "after": after, "tolerance": tolerance},
            )
        )
    return findings


def _not_collected(
    subject: str, engine_ref: Callable[[], object] | None, surviving: dict[str, int]
) -> Finding:
    from pytest_shutdown.ownership.backrefs import backref_chain  # noqa: PLC0415 - objgraph

    engine = engine_ref() if engine_ref is not None else None
    targets: list[object] = [engine] if engine is not None else []
    del engine
    if not targets:
        wanted = list(surviving)[:CHAINS]
        targets = list(Census.one_instance_each(wanted, set()).values())  # the newest each
    chains = [backref_chain(target)[1] for target in targets[:CHAINS]]
    del targets
    what = ", ".join(f"{short_name(name)} +{count}" for name, count in surviving.items())
    return Finding(
        "not-collected",
        f"the first {subject} was still alive after its shutdown, when a second one was to "
        f"be built" + (f" (objects of its types: {what})" if what else "") + ".",
        {"surviving": surviving, "backref_chains": chains},
    )
