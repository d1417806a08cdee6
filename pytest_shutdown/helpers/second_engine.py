"""``assert_second_engine_clean``: a second engine in the same process (the vLLM #54162 shape).

Build engine A, use it, shut it down and drop it; then everything A made must be gone before
engine B is built: A itself and the objects of A's types (``not-collected``), A's threads
(``thread-leak``), A's file descriptors (``growth``: they would pile up with every engine) and
A's device memory (``device-memory-held``). Then B is built, used and shut down: a B that fails
fails the check with its own exception.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.census import (
    AUTO,
    count_objects,
    describe_fds,
    fd_numbers,
    fd_target,
    pick_device_reader,
    short_name,
    type_name,
)
from pytest_shutdown.helpers.report import CheckReport

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


def _new_threads(before: set[int]) -> list[weakref.ReferenceType[threading.Thread]]:
    return [weakref.ref(t) for t in threading.enumerate() if (t.ident or 0) not in before]


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
    if not callable(build) or not callable(use) or not callable(shutdown):
        raise TypeError("build, use and shutdown must be callables")
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not (
        0 <= deadline_s < float("inf")
    ):
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
    gc.collect()
    objects_before = count_objects(gc.get_objects())
    fds_before = set(fd_numbers())
    threads_before = {t.ident or 0 for t in threading.enumerate()}
    memory_before = reader.used_bytes() if reader is not None else None

    engine = build()
    subject = type(engine).__qualname__
    use(engine)
    kinds = [type_name(kind) for kind in _owned_types(engine)]
    threads_of_a = _new_threads(threads_before)
    fds_of_a = describe_fds(fd for fd in fd_numbers() if fd not in fds_before)
    shutdown(engine)
    engine_ref = _weak(engine)
    del engine

    try:
        of_a = _OfEngineA(
            engine_ref,
            kinds,
            objects_before,
            threads_of_a,
            fds_of_a,
            reader,
            memory_before,
            device_tolerance,
        )
        findings = _leftovers(subject, of_a, time.monotonic() + deadline_s)
    finally:
        close = getattr(reader, "close", None)
        if isinstance(device_memory, str) and callable(close):
            close()  # a reader picked here is closed here (NVML, amdsmi)
    raise_if_any(findings)
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
            "fds_of_first": fds_of_a,
            "device_memory": getattr(reader, "name", None) or note,
        },
    )


def _weak(engine: object) -> Callable[[], object] | None:
    try:
        return weakref.ref(engine)
    except TypeError:  # no __weakref__ slot: the type count still tells
        return None


class _OfEngineA(NamedTuple):
    """What engine A was made of and what was there before it: what its leftovers are read
    against."""

    engine_ref: Callable[[], object] | None
    kinds: list[str]
    objects_before: dict[str, int]
    threads: list[weakref.ReferenceType[threading.Thread]]
    fds: dict[str, str]
    reader: MemoryReader | None
    memory_before: int | None
    device_tolerance: int


def _leftovers(subject: str, of_a: _OfEngineA, deadline: float) -> list[Finding]:
    """What is left of engine A at the deadline (polled: clean engines do not wait)."""
    engine_ref, reader, memory_before = of_a.engine_ref, of_a.reader, of_a.memory_before
    while True:
        left = _read_leftovers(of_a)
        if left.nothing() or time.monotonic() >= deadline:
            break
        del left
        time.sleep(POLL_S)
    findings: list[Finding] = []
    if left.engine_alive or left.surviving:
        findings += _not_collected(subject, engine_ref, left.surviving)
    if left.thread_names:
        findings.append(_threads_ran_on(subject, left.thread_names))
    if left.open_fds:
        findings.append(_fds_left_open(subject, left.open_fds))
    if left.memory_held:
        assert left.memory is not None and memory_before is not None
        findings.append(
            _memory_held(subject, reader, memory_before, left.memory, of_a.device_tolerance)
        )
    return findings


class _Leftovers(NamedTuple):
    """One reading of what engine A left: the names of its threads still running, its fds
    still open, the device memory now (and whether it is over the baseline and tolerance),
    whether the engine object is alive and its types' instance counts over the baseline."""

    thread_names: list[str]
    open_fds: dict[str, str]
    memory: int | None
    memory_held: bool
    engine_alive: bool
    surviving: dict[str, int]

    def nothing(self) -> bool:
        return not (
            self.thread_names
            or self.open_fds
            or self.memory_held
            or self.engine_alive
            or self.surviving
        )


def _read_leftovers(of_a: _OfEngineA) -> _Leftovers:
    """One reading, after a collection: the thread objects themselves are not kept (only their
    names), so the reading never keeps a thread of A alive."""
    engine_ref, kinds, objects_before, threads, fds, reader, memory_before, device_tolerance = of_a
    gc.collect()
    alive = [t for t in (ref() for ref in threads) if t is not None and t.is_alive()]
    thread_names = [t.name for t in alive]
    del alive
    open_fds = {fd: target for fd, target in fds.items() if _still(fd, target)}
    memory = reader.used_bytes() if reader is not None else None
    memory_held = (
        memory is not None
        and memory_before is not None
        and memory > memory_before + device_tolerance
    )
    engine_alive = engine_ref is not None and engine_ref() is not None
    counts = count_objects(gc.get_objects())
    surviving = {
        name: counts.get(name, 0) - objects_before.get(name, 0)
        for name in kinds
        if counts.get(name, 0) > objects_before.get(name, 0)
    }
    del counts
    return _Leftovers(thread_names, open_fds, memory, memory_held, engine_alive, surviving)


def _threads_ran_on(subject: str, names: list[str]) -> Finding:
    return Finding(
        "thread-leak",
        f"the first {subject}'s thread(s) {', '.join(repr(n) for n in names)} still ran "
        "after its shutdown, when a second one was to be built.",
        {"threads": names},
    )


def _fds_left_open(subject: str, open_fds: dict[str, str]) -> Finding:
    shown = ", ".join(f"{fd} -> {target}" for fd, target in list(open_fds.items())[:5])
    return Finding(
        "growth",
        f"the first {subject} left {len(open_fds)} file descriptor(s) open after its "
        f"shutdown ({shown}): every engine built in this process adds as many.",
        {"metric": "fds", "fds": open_fds},
    )


def _memory_held(
    subject: str, reader: MemoryReader | None, before: int, after: int, tolerance: int
) -> Finding:
    return Finding(
        "device-memory-held",
        f"the first {subject} held {(after - before) / (1 << 20):.1f} MiB of "
        f"device memory after its shutdown (reader {getattr(reader, 'name', '?')}).",
        {"baseline": before, "after": after, "tolerance": tolerance},
    )


def _still(fd: str, target: str) -> bool:
    return fd_target(int(fd)) == target


def _not_collected(
    subject: str, engine_ref: Callable[[], object] | None, surviving: dict[str, int]
) -> list[Finding]:
    from pytest_shutdown.ownership.backrefs import backref_chain  # noqa: PLC0415 - objgraph

    engine = engine_ref() if engine_ref is not None else None
    targets: list[object] = [engine] if engine is not None else []
    del engine
    if not targets:
        wanted = set(list(surviving)[:CHAINS])
        targets = _newest_instances(wanted)
    chains: list[str] = []
    for target in targets[:CHAINS]:
        _, text = backref_chain(target)
        chains.append(text)
    del targets
    what = ", ".join(f"{short_name(name)} +{count}" for name, count in surviving.items())
    return [
        Finding(
            "not-collected",
            f"the first {subject} was still alive after its shutdown, when a second one was to "
            f"be built" + (f" (objects of its types: {what})" if what else "") + ".",
            {"surviving": surviving, "backref_chains": chains},
        )
    ]


def _newest_instances(names: Iterable[str]) -> list[object]:
    wanted = set(names)
    objects = gc.get_objects()
    kinds = {kind for kind in set(map(type, objects)) if type_name(kind) in wanted}
    found: dict[type, object] = {}
    for obj in reversed(objects):  # the newest survivors are listed last
        if type(obj) in kinds and type(obj) not in found:
            found[type(obj)] = obj
    del objects
    return list(found.values())
