"""Finalization on garbage collection: ``check_finalizers`` and ``assert_finalizes_on_gc``."""

from __future__ import annotations

import atexit
import gc
import os
import time
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from pytest_shutdown._base.arguments import require_callable, require_instance
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.awaiting import Awaiting, awaiting
from pytest_shutdown.helpers.cleanups import (
    CleanupCounter,
    Watch,
    discover_cleanups,
    finalizer_registrations,
    labels_performed,
    pending_finalizers,
)
from pytest_shutdown.helpers.report import CheckReport, describe, is_seconds, raised
from pytest_shutdown.ownership import atexit_calls
from pytest_shutdown.ownership.backrefs import (
    GRAPHS,
    backref_chain,
    draw_backrefs,
    find_path,
    runs_through_finalizer_registry,
)
from pytest_shutdown.ownership.origins import render_origin

#: Seconds between two collections while waiting for a dropped object to go.
POLL_INTERVAL_S = 0.05
#: What ``factory`` must be, in its usage error.
FACTORY = "a function that builds a fresh object: the class itself, or lambda: Engine(...)"


def _qualname(func: Any) -> str:
    return str(getattr(func, "__qualname__", None) or type(func).__qualname__)


def check_finalizers(obj: object) -> list[Finding]:
    """Statically check every finalizer registered on ``obj``; return the findings (no raise).

    A finalizer whose func is a bound method of ``obj`` is ``finalizer-bound-method``; one whose
    func, args or kwargs reach ``obj`` by any path (partials, closures, defaults, containers,
    attributes; any depth) is ``finalizer-holds-object``, with the path. Either keeps ``obj`` alive
    forever: the finalizer registry holds the func and its arguments strongly. Both
    ``weakref.finalize`` and ``multiprocessing.util.Finalize`` registrations are checked.
    """
    findings: list[Finding] = []
    subject = describe(obj)
    for index, (func, args, kwargs) in enumerate(finalizer_registrations(obj)):
        name = _qualname(func)
        forever = "alive so the finalizer never runs."
        if isinstance(func, types.MethodType) and func.__self__ is obj:
            text = f"{subject}: finalizer {index} calls its own bound method {name}, which keeps "
            facts = {"finalizer": index, "func": name, "path": "func.__self__"}
            findings.append(Finding("finalizer-bound-method", f"{text}the object {forever}", facts))
            continue
        path = (
            find_path(func, obj, "func")
            or find_path(tuple(args), obj, "args")
            or find_path(dict(kwargs), obj, "kwargs")
        )
        if path is not None:
            text = f"{subject}: finalizer {index} ({name}) reaches the object through {path}"
            facts = {"finalizer": index, "func": name, "path": path}
            findings.append(
                Finding("finalizer-holds-object", f"{text}, which keeps it {forever}", facts)
            )
    return findings


def assert_finalizers_ok(obj: object) -> CheckReport:
    """Raise ``ShutdownContractError`` with the findings of :func:`check_finalizers`, if any.

    The assert-style form of ``assert check_finalizers(obj) == []``: the failure shows each
    finding's whole message (pytest's list diff would truncate it). Returns a ``CheckReport``
    whose ``details["finalizers"]`` is the number of registrations checked.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    require_instance("assert_finalizers_ok", "obj", obj, "the object whose finalizers to check")
    start = time.perf_counter()
    raise_if_any(check_finalizers(obj))
    return CheckReport(
        check="finalizers-ok",
        subject=describe(obj),
        duration_s=time.perf_counter() - start,
        details={"finalizers": len(finalizer_registrations(obj))},
    )


def assert_finalizes_on_gc(
    factory: Callable[[], object],
    *,
    method: str = "shutdown",
    watch: Iterable[Watch] = (),
    timeout: float = 5.0,
    graphs_dir: str | os.PathLike[str] | None = None,
) -> CheckReport:
    """Require an object built by ``factory`` to be collected, running its cleanups, once dropped.

    The helper keeps only a weak reference, drops the object and collects until ``timeout``
    seconds have passed. Still alive: ``not-collected`` with the shortest backref chain as text,
    or ``finalizer-bound-method`` / ``finalizer-holds-object`` when that chain runs through the
    finalizer registry. If the object has ``method``, a twin from the same factory is first shut
    down explicitly; every cleanup that shutdown performed must also run on collection
    (``cleanup-missing``); a shutdown that raises is ``shutdown-raised``. ``watch`` items must be
    attribute paths (``"cache.close"``) or functions, since each object is built inside the helper.

    ``graphs_dir``: on a failed collection, also draw the object's referrers there
    (``objgraph.show_backrefs``; a PNG with graphviz's ``dot``, else the ``.dot`` source) while
    the object is still alive; the finding's ``details["graph"]`` names the files. Default: the
    folder set by :func:`pytest_shutdown.ownership.backrefs.configure_graphs` (the plugin's
    ``--shutdown-graphs=DIR``), else no picture.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    require_callable("assert_finalizes_on_gc", "factory", factory, FACTORY)
    if not is_seconds(timeout):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    watch = tuple(watch)
    started = time.perf_counter()
    timings: dict[str, float] = {}

    with atexit_calls.recording():  # an atexit hold is invisible to gc.get_referrers
        explicit, counter, subject, findings = _build_drop_and_diagnose(
            factory, method, watch, timeout, graphs_dir, timings
        )
    raise_if_any(findings)
    table = counter.table()
    return CheckReport(
        check="finalizes-on-gc",
        subject=subject,
        duration_s=time.perf_counter() - started,
        cleanups={
            label: {"explicit": int(explicit is not None and label in explicit), **counts}
            for label, counts in table.items()
        },
        timings=timings,
        details={"method": method, "explicit_cleanups": explicit or []},
    )


def _build_drop_and_diagnose(
    factory: Callable[[], Any],
    method: str,
    watch: tuple[Any, ...],
    timeout: float,
    graphs_dir: str | os.PathLike[str] | None,
    timings: dict[str, float],
) -> tuple[list[str] | None, CleanupCounter, str, list[Finding]]:
    explicit: list[str] | None = None
    twin = factory()
    if isinstance(method, str) and callable(getattr(twin, method, None)):
        twin_counter = CleanupCounter(discover_cleanups(twin, watch))
        shutdown = awaiting(twin, method, "assert_finalizes_on_gc")  # a coroutine is awaited
        t0 = time.perf_counter()
        try:
            with twin_counter.charge("explicit"):
                shutdown()
        except Exception as exc:  # noqa: BLE001 - a raising shutdown is the finding
            subject = describe(twin)
            shutdown.release()
            del twin
            raise_if_any([_shutdown_raised(subject, method, exc)])
        shutdown.release()
        timings["explicit"] = time.perf_counter() - t0
        explicit = labels_performed(twin_counter, "explicit")
    for holder in atexit_calls.holders_of(twin):  # the helper built the twin: free it
        atexit.unregister(holder.func)
    del twin

    obj = factory()
    subject = describe(obj)
    counter = CleanupCounter(discover_cleanups(obj, watch))
    ref = weakref.ref(obj)
    t0 = time.perf_counter()
    with counter.charge("gc"):
        del obj
        alive = _wait_collected(ref, timeout)
    timings["gc"] = time.perf_counter() - t0

    findings: list[Finding] = []
    if alive:
        t0 = time.perf_counter()
        findings = _diagnose(ref, subject, graphs_dir)
        timings["diagnosis"] = time.perf_counter() - t0
        _dispose(ref, method)
    elif explicit is not None:
        collected = set(labels_performed(counter, "gc"))
        findings = [
            Finding(
                "cleanup-missing",
                f"{subject}: cleanup {label} runs on explicit {method}() but not when the "
                "object is garbage-collected.",
                {"cleanup": label, "method": method, "performed_on_gc": sorted(collected)},
            )
            for label in explicit
            if label not in collected
        ]
    return explicit, counter, subject, findings


def _shutdown_raised(subject: str, method: str, exc: BaseException) -> Finding:
    return Finding(
        "shutdown-raised",
        f"{subject}: explicit {method}() (of the twin built to learn its cleanups) raised "
        f"{type(exc).__name__}: {exc}",
        {"call": 1, "method": method, **raised(exc)},
    )


def _wait_collected(ref: weakref.ref[Any], timeout: float) -> bool:
    """Collect until ``ref`` is dead or ``timeout`` passes; True when still alive."""
    if ref() is None:
        return False
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if ref() is None:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(min(POLL_INTERVAL_S, max(0.0, deadline - time.monotonic())))


def _dispose(ref: weakref.ref[Any], method: str) -> None:
    """The helper built the leaked object, so it cleans up: its shutdown, then its pending
    finalizers (freeing it from the registry), errors ignored (the finding is made)."""
    target = ref()
    if target is None:
        return
    bound = getattr(target, method, None) if isinstance(method, str) else None
    shutdown = Awaiting(bound, method) if callable(bound) else None  # a coroutine is awaited
    del bound
    finalizers = pending_finalizers(target)
    holders = atexit_calls.holders_of(target)
    del target
    for holder in holders:  # the helper built it: its exit hook goes with it
        atexit.unregister(holder.func)
    del holders
    for step in ([shutdown] if callable(shutdown) else []) + finalizers:
        try:
            step()
        except Exception:  # noqa: BLE001, S112 - best effort; the finding is already made
            continue
    del shutdown, finalizers


def _diagnose(
    ref: weakref.ref[Any], subject: str, graphs_dir: str | os.PathLike[str] | None = None
) -> list[Finding]:
    target = ref()
    if target is None:
        return []
    static = check_finalizers(target)
    chain, text = backref_chain(target)
    through_registry = runs_through_finalizer_registry(chain)
    del chain
    if static:
        # A finalizer that reaches the object keeps it alive from the registry whatever the
        # shortest chain found (a large object's chain may be too deep to search).
        extra = {"backref_chain": text, "finalizer_registry": True}
        findings = [replace(f, details={**f.details, **extra}) for f in static]
    else:
        holders = atexit_calls.holders_of(target)
        message = (
            f"{subject} is still alive after its last reference was dropped and the garbage "
            "collector ran."
        )
        details: dict[str, Any] = {"backref_chain": text, "finalizer_registry": through_registry}
        if holders:
            callbacks = ", ".join(f"atexit.register({h.describe()})" for h in holders)
            message += (
                f" Its root is atexit: {callbacks} holds it until the interpreter exits "
                "(a hold gc.get_referrers cannot see)."
            )
            details["root"] = "atexit"
            details["atexit_callbacks"] = [
                {
                    "callback": h.describe(),
                    "registered_at": render_origin(h.origin) if h.origin else "",
                }
                for h in holders
            ]
        findings = [Finding("not-collected", message, details)]
    folder = graphs_dir if graphs_dir is not None else GRAPHS.directory
    if folder is not None:
        # Drawn now, while the object is still alive; the label names the first finding.
        picture: dict[str, str | None]
        try:
            graph = draw_backrefs(target, folder, f"{findings[0].code}-{type(target).__name__}")
            picture = graph.to_details()
        except OSError as exc:  # a picture must never hide the finding itself
            picture = {"dot": None, "png": None, "note": f"no picture written to {folder}: {exc}"}
        findings = [replace(f, details={**f.details, "graph": picture}) for f in findings]
    del target
    return findings
