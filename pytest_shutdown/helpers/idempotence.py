"""``assert_idempotent_shutdown``: a second (and third) shutdown is harmless."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from pytest_shutdown._base.arguments import require_method
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.awaiting import (
    awaiting,
    check_in_fresh_loop,
    dispatch_loop,
    is_coroutine_method,
)
from pytest_shutdown.helpers.cleanups import (
    CleanupCounter,
    CleanupSpec,
    Watch,
    discover_cleanups,
    finalizer_registrations,
    idempotent_by_contract,
    instance_attributes,
    is_exit_stack,
    method_spec,
    pending_finalizers,
)
from pytest_shutdown.helpers.report import CheckReport, describe, raised

#: How long the racing threads of the first round may take before the check gives up on them.
RACE_DEADLINE_S = 30.0
GC_ROUND = "gc"


def assert_idempotent_shutdown(
    obj: object,
    method: str = "shutdown",
    *,
    calls: int = 3,
    threads: int = 0,
    watch: Iterable[Watch] = (),
    allow_repeat: Iterable[Watch] = (),
) -> CheckReport:
    """Call ``obj.<method>()`` ``calls`` times and require every call after the first to be a no-op.

    With ``threads > 0`` the first round is that many threads calling at once. Every call must
    return without raising (``shutdown-raised``). Every cleanup the first round performed must not
    run again: not twice within the first round, not on a later call, and not when the object's
    pending finalizers run afterwards, which is what garbage collection would do
    (``cleanup-repeated``). Raises :class:`~pytest_shutdown.ShutdownContractError`; returns a
    :class:`CheckReport` with the counts per round when the contract holds.

    Cleanups that are idempotent by contract (``Executor.shutdown``, ``Thread.join``,
    ``Event.set``, a process's ``join``/``close``, file and socket ``close``) may run again;
    ``allow_repeat`` declares more of them (functions, bound methods, attribute paths, or the
    labels of discovered cleanups). A check that found no cleanup at all to count cannot tell a
    repeat from a no-op: it fails with :class:`NothingCountedError`, asking for ``watch=``.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    require_method("assert_idempotent_shutdown", "obj", obj, method)
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 2:
        raise ValueError(f"calls must be an int >= 2 (a first call and a repeat), got {calls!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be an int >= 0 (0: no racing first round), got {threads!r}")
    if is_coroutine_method(obj, method) and dispatch_loop() is None:  # awaited on a fresh loop
        options = {"calls": calls, "threads": threads, "watch": watch, "allow_repeat": allow_repeat}
        return check_in_fresh_loop(assert_idempotent_shutdown, obj, method, **options)
    started = time.perf_counter()
    specs = discover_cleanups(obj, watch, allow_repeat)
    routes = _has_cleanup_routes(obj)
    if idempotent_by_contract(obj, method):  # a pool checked itself: its own call is counted
        specs.append(method_spec(obj, method, f"{type(obj).__qualname__}.{method}", "self"))
    counter = CleanupCounter(specs)
    bound = awaiting(obj, method, "assert_idempotent_shutdown")  # an awaitable result is awaited
    findings: list[Finding] = []
    timings: dict[str, float] = {}
    subject = describe(obj)

    first = "call 1"
    for number in range(1, calls + 1):
        name = f"call {number}"
        t0 = time.perf_counter()
        if number == 1 and threads:
            findings += _racing_round(subject, method, bound, counter, threads)
        else:
            findings += _one_call(subject, method, bound, counter, name, number)
        timings[name] = time.perf_counter() - t0
    del bound

    t0 = time.perf_counter()
    with counter.charge(GC_ROUND):
        for finalizer in pending_finalizers(obj):
            finalizer()
    timings[GC_ROUND] = time.perf_counter() - t0

    findings += repeated_findings(subject, counter, first)
    raise_if_any(findings)
    _require_counted(subject, method, counter, routes)
    return CheckReport(
        check="idempotent-shutdown",
        subject=subject,
        duration_s=time.perf_counter() - started,
        cleanups=counter.table(),
        timings=timings,
        details={"method": method, "calls": calls, "threads": threads},
    )


def repeated_findings(subject: str, counter: CleanupCounter, first: str) -> list[Finding]:
    """``cleanup-repeated`` for every cleanup of round ``first`` that ran again afterwards."""
    findings = []
    later = [name for name in counter.rounds if name != first]
    for index, spec in enumerate(counter.specs):
        if spec.idempotent:
            continue
        initial = counter.count(index, first)
        again = {name: counter.count(index, name) for name in later if counter.count(index, name)}
        if initial == 0 or (initial == 1 and not again):
            continue
        findings.append(_repeated(subject, spec, first, initial, again))
    return findings


def _repeated(
    subject: str, spec: CleanupSpec, first: str, initial: int, again: dict[str, int]
) -> Finding:
    counts = {first: initial, **again}
    where = ", ".join(f"{count}x on {name}" for name, count in counts.items())
    return Finding(
        "cleanup-repeated",
        f"{subject}: cleanup {spec.label} ran {sum(counts.values())} times ({where}); it must "
        "run once, on the first shutdown.",
        {
            "cleanup": spec.label,
            "attribute": spec.attribute,
            "method": spec.method,
            "counts": counts,
        },
    )


class NothingCountedError(AssertionError):
    """The check saw no cleanup run, so it cannot tell a harmless repeat from a no-op."""


def _has_cleanup_routes(obj: object) -> bool:
    """An ExitStack or a finalizer: cleanups exist, even when a shutdown already consumed them."""
    if finalizer_registrations(obj):
        return True
    return any(is_exit_stack(value) for _name, value in instance_attributes(obj))


def _require_counted(subject: str, method: str, counter: CleanupCounter, routes: bool) -> None:
    """Fail when the check had no cleanup to count at all: it could never see a repeat (routes
    whose cleanups already ran, an ExitStack closed before the check, would count a repeat)."""
    if counter.specs or routes:
        return
    raise NothingCountedError(
        f"{subject}: the check found no cleanup of {method}() to count (no executor, ExitStack "
        "callback, finalizer or object with close/shutdown/terminate/release/stop), so a "
        "repeated cleanup would go unseen. Pass watch=[...] with what shutdown calls: a "
        "function, a bound method, or an attribute path such as 'cache.close'."
    )


def _one_call(
    subject: str, method: str, bound: Any, counter: CleanupCounter, round_name: str, number: int
) -> list[Finding]:
    with counter.charge(round_name):
        try:
            bound()
        except BaseException as exc:  # noqa: BLE001 - reported as data, never swallowed silently
            from pytest_shutdown._os.async_exc import ShutdownBudgetExceeded  # noqa: PLC0415

            # Interruptions are not the shutdown raising: a teardown budget cuts the check short.
            if isinstance(exc, (KeyboardInterrupt, SystemExit, ShutdownBudgetExceeded)):
                raise
            return [_raised(subject, method, number, threading.current_thread().name, exc)]
    return []


def _racing_round(
    subject: str, method: str, bound: Any, counter: CleanupCounter, threads: int
) -> list[Finding]:
    barrier = threading.Barrier(threads)
    errors: list[tuple[str, BaseException]] = []

    def race() -> None:
        try:
            barrier.wait(timeout=RACE_DEADLINE_S)
        except threading.BrokenBarrierError:
            return
        with counter.charge("call 1"):
            try:
                bound()
            except BaseException as exc:  # noqa: BLE001 - collected and reported below
                errors.append((threading.current_thread().name, exc))

    workers = [
        threading.Thread(target=race, name=f"shutdown-race-{i}", daemon=True)
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + RACE_DEADLINE_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    findings = [_raised(subject, method, 1, name, exc) for name, exc in errors]
    stuck = [w.name for w in workers if w.is_alive()]
    if stuck:
        text = f"{subject}: {method}() called from {len(stuck)} racing threads did not return"
        facts = {"threads": stuck, "deadline_s": RACE_DEADLINE_S}
        findings.append(Finding("blocking-close", f"{text} within {RACE_DEADLINE_S:g}s.", facts))
    return findings


def _raised(subject: str, method: str, number: int, thread: str, exc: BaseException) -> Finding:
    return Finding(
        "shutdown-raised",
        f"{subject}: {method}() call {number} raised {type(exc).__name__}: {exc}",
        {"call": number, "thread": thread, **raised(exc)},
    )
