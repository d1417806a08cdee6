"""``assert_nonblocking_shutdown``: shutdown returns while the executors are still busy."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from typing import Any

from pytest_shutdown._base.arguments import require_method, require_seconds
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.awaiting import is_coroutine_method
from pytest_shutdown.helpers.cleanups import (
    exit_stack_callbacks,
    finalizer_registrations,
    instance_attributes,
    is_exit_stack,
)
from pytest_shutdown.helpers.frames import blocked_in
from pytest_shutdown.helpers.report import CheckReport, describe, raised

#: How long a blocking task waits for its release at most (every wait has a deadline).
TASK_DEADLINE_S = 120.0
#: How long the workers get to pick up the blocking tasks.
STARTUP_DEADLINE_S = 30.0
#: Polls start at _FIRST_POLL_S and back off to _POLL_S: a clean check stays in milliseconds.
_FIRST_POLL_S = 0.0005
_POLL_S = 0.01
_NAME = "assert_nonblocking_shutdown"
#: How deep the helper looks into executors that wrap executors.
_MAX_WRAPPER_DEPTH = 4


def block_until_released(marker_dir: str, number: int, deadline_s: float) -> None:
    """The blocking task: say it started, then wait for the release file or the deadline (files:
    it works in threads and in processes of any start method)."""
    with open(os.path.join(marker_dir, f"started-{number}-{os.getpid()}"), "w"):
        pass
    release = os.path.join(marker_dir, "release")
    deadline = time.monotonic() + deadline_s
    delay = _FIRST_POLL_S
    # A vanished marker folder releases too: the helper is gone, nothing may wait for it.
    while not os.path.exists(release) and os.path.isdir(marker_dir) and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, _POLL_S)


def inner_pools(executor: Executor) -> list[tuple[str, Executor]]:
    """The executors a wrapper executor holds (``_SwappableExecutor._inner``), depth first; a pool
    that owns its workers (``_threads`` or ``_processes``) wraps none."""
    found: list[tuple[str, Executor]] = []
    seen: set[int] = {id(executor)}

    def walk(prefix: str, current: Executor, depth: int) -> None:
        owns_workers = hasattr(current, "_threads") or hasattr(current, "_processes")
        if depth > _MAX_WRAPPER_DEPTH or owns_workers:
            return
        for name, value in instance_attributes(current):
            if isinstance(value, Executor) and id(value) not in seen:
                seen.add(id(value))
                label = f"{prefix}.{name}"
                found.append((label, value))
                walk(label, value, depth + 1)

    walk("", executor, 0)
    return found


def _pools(executor: Executor) -> list[Executor]:
    return [executor, *(pool for _label, pool in inner_pools(executor))]


def _worker_count(executor: Executor) -> int:
    """How many tasks keep every worker busy: the pool's own, else the first wrapped pool's."""
    for candidate in _pools(executor):
        workers = getattr(candidate, "_max_workers", None)
        if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0:
            return workers
    return 1


def _pool_threads(executor: Executor) -> list[threading.Thread]:
    """The worker threads of a pool (and of the pools it wraps), plus a manager thread."""
    threads: list[threading.Thread] = []
    for candidate in _pools(executor):
        threads += [t for t in (getattr(candidate, "_threads", ()) or ()) if t not in threads]
        manager = getattr(candidate, "_executor_manager_thread", None)
        if isinstance(manager, threading.Thread) and manager not in threads:
            threads.append(manager)
    return threads


def _pool_processes(executor: Executor) -> list[Any]:
    return [
        p for pool in _pools(executor) for p in (getattr(pool, "_processes", None) or {}).values()
    ]


@dataclass
class _Occupied:
    label: str
    executor: Executor
    futures: list[Future[Any]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    processes: list[Any] = field(default_factory=list)


def discover_executors(obj: object) -> list[tuple[str, Executor]]:
    """The executors of ``obj``: itself, its attributes (one level into containers), the ones
    its ExitStacks and finalizers would shut down."""
    found: list[tuple[str, Executor]] = []
    seen: set[int] = set()

    def add(label: str, value: object) -> None:
        if isinstance(value, Executor) and id(value) not in seen:
            seen.add(id(value))
            found.append((label, value))

    add(type(obj).__qualname__, obj)
    stacks: list[tuple[str, object]] = []
    for name, value in instance_attributes(obj):
        add(name, value)
        if is_exit_stack(value):
            stacks.append((name, value))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                add(f"{name}[{index}]", item)
        elif isinstance(value, dict):
            for key, item in list(value.items()):
                add(f"{name}[{key!r}]", item)
    for func, args, _kwargs in finalizer_registrations(obj):
        add("finalizer", getattr(func, "__self__", None))
        for index, arg in enumerate(args):
            add(f"finalizer args[{index}]", arg)
    for label, stack in stacks:
        for index, callback in enumerate(exit_stack_callbacks(stack)):
            inner = getattr(callback, "__wrapped__", callback)
            add(f"{label} callback {index}", getattr(inner, "__self__", None))
    wrapped = {id(pool) for _label, ex in found for _name, pool in inner_pools(ex)}
    return [(label, ex) for label, ex in found if id(ex) not in wrapped]


def assert_nonblocking_shutdown(
    obj: object,
    method: str = "shutdown",
    *,
    budget: float = 0.25,
    executors: Sequence[Executor] | Mapping[str, Executor] | None = None,
    grace: float = 5.0,
) -> CheckReport:
    """Occupy every executor with blocking tasks, then require ``obj.<method>()`` to return fast.

    The executors are those given (a sequence, or ``{label: executor}``), or those discovered on
    ``obj``. An executor that wraps another (vLLM's ``_SwappableExecutor`` keeps its pool in
    ``_inner``) is occupied through the wrapper, and the wrapped pool's threads are the ones
    waited for. The method runs on a watchdog thread; if it has not returned after ``budget``
    seconds while the tasks still block, that is ``blocking-close`` (with the time and the
    executor it waits on). The tasks are then always released, and every executor thread must end
    within ``grace`` seconds (``thread-leak``; ``process-leak`` for process pool workers). The
    helper itself never hangs, and it joins every pool thread it blocked before it returns.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    require_method(_NAME, "obj", obj, method)
    require_seconds(_NAME, "budget", budget)
    require_seconds(_NAME, "grace", grace)
    if is_coroutine_method(obj, method):  # the event loop is watched: loop-blocked
        from pytest_shutdown.helpers import async_shutdown as aio  # noqa: PLC0415

        return aio.nonblocking_in_fresh_loop(
            obj, method, budget=budget, grace=grace, executors=executors
        )
    subject = describe(obj)
    found = _given_executors(executors) if executors is not None else discover_executors(obj)
    for label, ex in found:
        if not isinstance(ex, Executor):
            raise ValueError(
                f"executors: {label} is {ex!r}; accepted: concurrent.futures.Executor instances"
            )
    if not found:
        raise ValueError(
            f"executors: found no concurrent.futures.Executor on {subject}; pass executors=[...]"
        )
    started = time.perf_counter()
    marker_dir = tempfile.mkdtemp(prefix="pytest-shutdown-block-")
    occupied: list[_Occupied] = []
    findings: list[Finding] = []
    timings: dict[str, float] = {}
    runner: _Runner | None = None
    try:
        _occupy(found, marker_dir, occupied)
        runner = _Runner(getattr(obj, method))
        runner.start()
        returned = runner.done.wait(budget)
        timings["shutdown"] = runner.elapsed()
        if not returned:
            findings.append(_blocking(subject, method, budget, runner, occupied))
    finally:
        with open(os.path.join(marker_dir, "release"), "w"):
            pass
        if runner is not None and not runner.done.wait(grace):
            findings.append(_hung(subject, method, grace, runner))
        t0 = time.perf_counter()
        findings += _leaks(subject, occupied, grace)
        timings["workers_ended"] = time.perf_counter() - t0
        shutil.rmtree(marker_dir, ignore_errors=True)  # releases any task that starts later
        _wait_tasks_returned(occupied, grace)
    if runner is not None and runner.error is not None:
        exc = runner.error
        text = f"{subject}: {method}() raised {type(exc).__name__}: {exc}"
        findings.append(Finding("shutdown-raised", text, raised(exc)))
    raise_if_any(findings)
    return CheckReport(
        check="nonblocking-shutdown",
        subject=subject,
        duration_s=time.perf_counter() - started,
        timings=timings,
        details={"executors": [o.label for o in occupied], "budget_s": budget},
    )


class _Runner:
    """Runs the shutdown method on a daemon watchdog thread and remembers how it ended."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._t0 = 0.0
        self._t1: float | None = None
        self.thread = threading.Thread(target=self._run, name="shutdown-watchdog", daemon=True)

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self.thread.start()

    def elapsed(self) -> float:
        return (self._t1 if self._t1 is not None else time.perf_counter()) - self._t0

    def _run(self) -> None:
        try:
            self._call()
        except BaseException as exc:  # noqa: BLE001 - reported as a finding
            self.error = exc
        finally:
            self._t1 = time.perf_counter()
            self._call = None
            self.done.set()

    def stack(self) -> tuple[str, list[Any]]:
        frame = sys._current_frames().get(self.thread.ident or -1)
        if frame is None:
            return "", []
        frames = [f for f, _line in traceback.walk_stack(frame)]
        return "".join(traceback.format_stack(frame)), frames


def _given_executors(
    executors: Sequence[Executor] | Mapping[str, Executor],
) -> list[tuple[str, Executor]]:
    if isinstance(executors, Mapping):
        return [(str(label), ex) for label, ex in executors.items()]
    if isinstance(executors, (str, bytes)) or not isinstance(executors, Sequence):
        raise ValueError(
            f"executors: {executors!r}; accepted: a sequence of executors or {{label: executor}}"
        )
    return [(f"executors[{i}]", ex) for i, ex in enumerate(executors)]


def _occupy(found: list[tuple[str, Executor]], marker_dir: str, occupied: list[_Occupied]) -> None:
    """Fill every worker of every executor with a blocking task (appending to ``occupied``
    as it goes, so that what was occupied is released and joined even if a submit fails)."""
    number = 0
    expected = 0
    for label, ex in found:
        workers = _worker_count(ex)
        entry = _Occupied(label, ex)
        occupied.append(entry)
        for _ in range(workers + 1):  # every worker busy, one more queued
            task = ex.submit(block_until_released, marker_dir, number, TASK_DEADLINE_S)
            entry.futures.append(task)
            number += 1
            entry.threads = _pool_threads(ex)
            entry.processes = _pool_processes(ex)
        expected += workers
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    delay = _FIRST_POLL_S
    while time.monotonic() < deadline:
        if sum(name.startswith("started-") for name in os.listdir(marker_dir)) >= expected:
            break
        time.sleep(delay)
        delay = min(delay * 2, _POLL_S)
    for entry in occupied:  # what must end once released, captured before shutdown forgets it
        entry.threads = _pool_threads(entry.executor)
        entry.processes = _pool_processes(entry.executor)


def _wait_tasks_returned(occupied: Iterable[_Occupied], grace: float) -> None:
    """Wait (bounded) until no blocking task runs any more: no pool thread stays blocked."""
    running = [task for entry in occupied for task in entry.futures if task.running()]
    if running:
        futures_wait(running, timeout=grace)


def _blocking(
    subject: str, method: str, budget: float, runner: _Runner, occupied: list[_Occupied]
) -> Finding:
    stack, frames = runner.stack()
    waits_on = [
        entry.label
        for entry in occupied
        if any(frame.f_locals.get("self") is entry.executor for frame in frames)
    ]
    where = blocked_in(frames)
    del frames
    details: dict[str, Any] = {"budget_s": budget, "elapsed_s": runner.elapsed()}
    if waits_on:
        text = (
            f"{subject}: {method}() was still blocked on {', '.join(waits_on)} after {budget:g}s "
            "while its tasks were running"
        )
        text += f" (in {where})." if where else "."
        details["executors"] = waits_on
    else:  # the budget counts every wait of the method, not the executors' alone
        text = f"{subject}: {method}() was still blocked after {budget:g}s"
        text += f" in {where}: not an executor" if where else ", not on an executor"
        text += f" (the budget counts every wait of {method}(), not only its executors')."
        details["occupied"] = [entry.label for entry in occupied]
    details["blocked_in"] = where
    details["stack"] = stack
    return Finding("blocking-close", text, details)


def _hung(subject: str, method: str, grace: float, runner: _Runner) -> Finding:
    stack = runner.stack()[0]
    return Finding(
        "blocking-close",
        f"{subject}: {method}() had not returned {grace:g}s after its executors' tasks were "
        "released.",
        {"grace_s": grace, "elapsed_s": runner.elapsed(), "stack": stack},
    )


def _leaks(subject: str, occupied: Iterable[_Occupied], grace: float) -> list[Finding]:
    deadline = time.monotonic() + grace
    findings: list[Finding] = []
    for entry in occupied:
        for thread in entry.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for proc in entry.processes:
            proc.join(max(0.0, deadline - time.monotonic()))
        after = f"still running {grace:g}s after its blocking tasks were released."
        alive = [t.name for t in entry.threads if t.is_alive()]
        if alive:
            text = f"{subject}: {len(alive)} thread(s) of {entry.label} were {after}"
            facts = {"executor": entry.label, "threads": alive, "grace_s": grace}
            findings.append(Finding("thread-leak", text, facts))
        procs = [p.pid for p in entry.processes if p.is_alive()]
        if procs:
            text = f"{subject}: {len(procs)} worker process(es) of {entry.label} were {after}"
            facts = {"executor": entry.label, "pids": procs, "grace_s": grace}
            findings.append(Finding("process-leak", text, facts))
    return findings
