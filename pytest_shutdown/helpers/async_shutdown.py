"""The helpers for coroutine shutdown methods (``aclose``, an ``async def shutdown``).

* :func:`assert_idempotent_shutdown_async` and :func:`assert_finalizes_on_gc_async`: the sync
  helpers' contracts, awaited on the caller's running loop (an ``async def`` test under
  pytest-asyncio or anyio). The sync helpers accept coroutine methods too, when no loop runs in
  their thread: they run these on a fresh loop (see :mod:`pytest_shutdown.helpers.awaiting`).
* :func:`assert_nonblocking_shutdown_async`: the close must not block the event loop
  (``loop-blocked``, with the stack that blocked it). A heartbeat callback runs on the loop every
  ``interval`` seconds; a watchdog thread that sees it late beyond ``budget`` samples the loop
  thread's stack (``sys._current_frames()``), which is the blocking frame. A close that awaits for
  long without blocking the loop (``await asyncio.sleep(1)``) keeps the heartbeat on time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pytest_shutdown._base.arguments import require_callable, require_method, require_seconds
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.awaiting import (
    checked_on_worker,
    require_no_running_loop,
    run_on_worker,
)
from pytest_shutdown.helpers.cleanups import Watch
from pytest_shutdown.helpers.finalization import FACTORY, assert_finalizes_on_gc
from pytest_shutdown.helpers.frames import is_library
from pytest_shutdown.helpers.idempotence import assert_idempotent_shutdown
from pytest_shutdown.helpers.report import CheckReport, describe, raised

#: Seconds between two heartbeats on the watched loop (and two looks of the watchdog).
HEARTBEAT_S = 0.005
#: How many frames of the blocking stack a finding keeps (the innermost ones).
STACK_LIMIT = 40
#: How long the watchdog thread may take to end once the close returned.
WATCHDOG_JOIN_S = 5.0
#: How long a fresh loop may take to finish after the close's grace (the check's own steps).
LOOP_EXIT_S = 2.0


async def assert_idempotent_shutdown_async(
    obj: object,
    method: str = "aclose",
    *,
    calls: int = 3,
    threads: int = 0,
    watch: Iterable[Watch] = (),
    allow_repeat: Iterable[Watch] = (),
) -> CheckReport:
    """:func:`~pytest_shutdown.assert_idempotent_shutdown`, awaited on the caller's loop.

    Every call of ``obj.<method>()`` is awaited on the running loop (the loop the object's tasks
    and sockets belong to), the second and third call's results too; ``threads > 0`` makes the
    first round that many concurrent calls (tasks racing on the loop). The check itself runs on a
    worker thread, so the loop stays free to run the calls. The findings (``shutdown-raised``,
    ``cleanup-repeated``) name the coroutine method (``details["shutdown"]``).
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    require_method("assert_idempotent_shutdown_async", "obj", obj, method)
    options = {"watch": tuple(watch), "allow_repeat": tuple(allow_repeat)}
    check = assert_idempotent_shutdown
    return await checked_on_worker(check, obj, method, calls=calls, threads=threads, **options)


async def assert_finalizes_on_gc_async(
    factory: Callable[[], object],
    *,
    method: str = "aclose",
    watch: Iterable[Watch] = (),
    timeout: float = 5.0,
    graphs_dir: str | os.PathLike[str] | None = None,
) -> CheckReport:
    """:func:`~pytest_shutdown.assert_finalizes_on_gc`, the twin's ``await obj.<method>()`` run on
    the caller's loop. ``factory`` runs on the helper's worker thread, where no loop runs: an
    object that starts its tasks lazily (on first use, as vLLM's ``AsyncLLM``) is built fine."""
    __tracebackhide__ = True  # a failure points at the caller's line
    require_callable("assert_finalizes_on_gc_async", "factory", factory, FACTORY)
    options = {"watch": tuple(watch), "timeout": timeout, "graphs_dir": graphs_dir}
    return await run_on_worker(assert_finalizes_on_gc, factory, method=method, **options)


async def assert_nonblocking_shutdown_async(
    obj: object,
    method: str = "aclose",
    *,
    budget: float = 0.1,
    grace: float = 5.0,
    interval: float = HEARTBEAT_S,
) -> CheckReport:
    """Await ``obj.<method>()`` on the running loop; it must never block that loop for longer than
    ``budget`` seconds (``loop-blocked``: how long, the frame that blocked it as ``file:line``,
    the stack). A close that awaits (``await asyncio.sleep``) does not block the loop, however
    long; one still running after ``grace`` seconds is cancelled and is ``blocking-close``; one
    that raises is ``shutdown-raised``. Returns a ``CheckReport`` with the longest stall seen.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    helper = "assert_nonblocking_shutdown_async"
    require_method(helper, "obj", obj, method)
    for name, value in (("budget", budget), ("grace", grace), ("interval", interval)):
        require_seconds(helper, name, value)
    return await _watched_close(obj, method, budget, grace, interval, [])


async def _watched_close(
    obj: object,
    method: str,
    budget: float,
    grace: float,
    interval: float,
    watches: list[_LoopWatch],
) -> CheckReport:
    """The check of :func:`assert_nonblocking_shutdown_async`; its watch is appended to
    ``watches`` first, for a caller on another thread that gives up on a loop blocked for good."""
    __tracebackhide__ = True  # a failure points at the caller's line
    loop = asyncio.get_running_loop()
    subject = describe(obj)
    findings: list[Finding] = []
    watch = _LoopWatch(loop, budget, interval)
    watches.append(watch)
    started = time.perf_counter()
    watch.start()
    try:
        result = getattr(obj, method)()
        if isinstance(result, Awaitable):
            await asyncio.wait_for(result, grace)
    except (asyncio.TimeoutError, TimeoutError):
        text = f"{subject}: {method}() had not completed {grace:g}s after it was awaited"
        findings.append(Finding("blocking-close", f"{text}; it was cancelled.", {"grace_s": grace}))
    except Exception as exc:  # noqa: BLE001 - a raising close is a finding
        text = f"{subject}: {method}() raised {type(exc).__name__}: {exc}"
        findings.append(Finding("shutdown-raised", text, {"method": method, **raised(exc)}))
    finally:
        elapsed = time.perf_counter() - started
        watch.stop()
    findings = [_blocked(subject, method, budget, stall) for stall in watch.stalls] + findings
    raise_if_any(findings)
    return CheckReport(
        check="nonblocking-shutdown",
        subject=subject,
        duration_s=elapsed,
        timings={"shutdown": elapsed, "longest_stall": watch.longest},
        details={"budget_s": budget, "method": method, "heartbeat_s": interval},
    )


def nonblocking_in_fresh_loop(
    obj: object, method: str, *, budget: float, grace: float, executors: object
) -> CheckReport:
    """``assert_nonblocking_shutdown`` of a coroutine method, called with no running loop: the
    loop check on a new loop, run by a thread of its own so that this thread can give up on a
    close that blocks the loop for good (``loop-blocked`` still blocked, ``blocking-close``; the
    loop's thread, which nothing can stop, is left behind, a daemon)."""
    __tracebackhide__ = True  # a failure points at the caller's line
    if executors is not None:
        raise ValueError(
            f"executors: {method!r} is a coroutine method, whose check watches the event loop, "
            "not executors; leave executors out (accepted: None)"
        )
    require_no_running_loop("assert_nonblocking_shutdown", method)
    watches: list[_LoopWatch] = []
    outcome: dict[str, Any] = {}

    def run() -> None:
        close = _watched_close(obj, method, budget, grace, HEARTBEAT_S, watches)
        try:
            outcome["report"] = asyncio.run(close)
        except BaseException as exc:  # noqa: BLE001 - raised again on the calling thread
            outcome["error"] = exc

    loop_thread = threading.Thread(target=run, name="pytest-shutdown-fresh-loop", daemon=True)
    loop_thread.start()
    loop_thread.join(grace + budget + LOOP_EXIT_S)
    if not loop_thread.is_alive():
        if "error" in outcome:
            raise outcome["error"]
        report: CheckReport = outcome["report"]
        return report
    subject = describe(obj)
    findings = [_blocked(subject, method, budget, stall) for w in watches for stall in w.halt()]
    text = f"{subject}: {method}() had not returned {grace + budget:g}s after it was awaited"
    facts = {"grace_s": grace, "loop_thread": loop_thread.name}
    findings.append(Finding("blocking-close", f"{text}; its event loop is still blocked.", facts))
    raise_if_any(findings)
    raise AssertionError("unreachable")  # pragma: no cover - raise_if_any raised


def _blocked(subject: str, method: str, budget: float, stall: dict[str, Any]) -> Finding:
    return Finding(
        "loop-blocked",
        f"{subject}: {method}() blocked the event loop for {stall['blocked_s']:.2f}s (budget "
        f"{budget:g}s) at {stall['site']} in {stall['function']}.",
        {"budget_s": budget, **stall},
    )


class _LoopWatch:
    """A heartbeat on the loop and a watchdog thread that samples the loop thread when it is late.

    Created and started on the loop's thread. A stall is recorded once, when the heartbeat is
    ``budget`` late and the loop thread is not idle in its selector (a starved machine delays a
    heartbeat without blocking anything); the next heartbeat gives its full length.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, budget: float, interval: float) -> None:
        self.loop = loop
        self.budget = budget
        self.interval = interval
        self.thread_id = threading.get_ident()
        self.stalls: list[dict[str, Any]] = []
        self.longest = 0.0
        self._last = time.monotonic()
        self._current: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._handle: asyncio.TimerHandle | None = None
        self._watchdog = threading.Thread(
            target=self._watch, name="pytest-shutdown-loop-watchdog", daemon=True
        )

    def start(self) -> None:
        self._last = time.monotonic()
        self._handle = self.loop.call_later(self.interval, self._beat)
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        self._watchdog.join(WATCHDOG_JOIN_S)
        self._beat(again=False)  # a stall the close ended in (a blocking last step) gets its length

    def halt(self) -> list[dict[str, Any]]:
        """Stop the watchdog of a loop that stays blocked (from another thread); the stalls seen,
        the one still going measured up to now."""
        self._stop.set()
        self._watchdog.join(WATCHDOG_JOIN_S)
        with self._lock:
            if self._current is not None:
                self._current["blocked_s"] = round(time.monotonic() - self._last, 4)
                self._current["still_blocked"] = True
            return list(self.stalls)

    def _beat(self, again: bool = True) -> None:
        now = time.monotonic()
        with self._lock:
            gap = now - self._last
            self.longest = max(self.longest, gap)
            if self._current is not None:
                self._current["blocked_s"] = round(gap, 4)
                self._current = None
            self._last = now
        if again and not self._stop.is_set():
            self._handle = self.loop.call_later(self.interval, self._beat)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                last = self._last
                if self._current is not None or time.monotonic() - last <= self.budget:
                    continue
            frame = sys._current_frames().get(self.thread_id)
            sample = _sample(frame) if frame is not None else None
            del frame
            if sample is None:
                continue
            with self._lock:
                if self._last == last:  # still the same stall
                    sample["blocked_s"] = round(time.monotonic() - last, 4)
                    self._current = sample
                    self.stalls.append(sample)


def _sample(frame: types.FrameType) -> dict[str, Any] | None:
    """The blocking site of the loop thread's stack, or None when the loop is idle (selecting)."""
    if frame.f_code.co_name == "select" and frame.f_code.co_filename.endswith("selectors.py"):
        return None
    mine = (f for f, _line in traceback.walk_stack(frame) if not is_library(f.f_code.co_filename))
    site = next(mine, frame)
    sample = {
        "site": f"{site.f_code.co_filename}:{site.f_lineno}",
        "function": getattr(site.f_code, "co_qualname", site.f_code.co_name),
        "frame": f"{frame.f_code.co_filename}:{frame.f_lineno}",
        "stack": "".join(traceback.format_stack(frame, limit=STACK_LIMIT)),
    }
    del site, mine
    return sample
