"""The teardown budget: interrupt a teardown that hangs instead of hanging the session.

When the budget runs out a watchdog thread captures every thread's stack and sends ``SIGALRM``
to the main thread (like pytest-timeout's ``signal`` method), whose handler calls ``on_expire``
(the guard kills the test's child processes) and raises :class:`ShutdownBudgetExceeded`, which
interrupts a blocked ``join``, ``waitpid`` or ``sleep``; pytest goes on with the next test. A
main thread stuck inside one C call never runs that handler: the watchdog then calls
``on_expire`` itself after :data:`HANDOFF_S`, which often unblocks the call. Without signals
(not the main thread, no SIGALRM) the exception is injected asynchronously: Python code only.

A teardown still running half a budget later is interrupted once more; one that has not
returned a whole budget after the first interrupt would hang the session: the watchdog runs
the :data:`~pytest_shutdown.plugin.hang.HANG_HANDLERS` (the report is written), dumps every
stack and exits with :data:`~pytest_shutdown.plugin.hang.HUNG_TEARDOWN_EXIT_CODE`.

pytest-timeout's signal timer, when due before the budget, governs (one hang is never reported
twice); otherwise it is paused while the budget is armed and restored after. Any other
``SIGALRM`` timer (the test's own) keeps running: a ``SIGALRM`` the watchdog did not send goes
to the handler that was in place. Times come from the real ``time.monotonic``, which a test's
monkeypatching or freezegun does not reach.
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import field
from types import FrameType, TracebackType
from typing import Any

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown._os.async_exc import STALE_ASYNC_EXC_LOOPS as STALE_ASYNC_EXC_LOOPS
from pytest_shutdown._os.async_exc import ShutdownBudgetExceeded, discard_pending_async_exc
from pytest_shutdown._os.async_exc import reset_async_exc_flag as reset_async_exc_flag
from pytest_shutdown._os.own_threads import start_own_thread
from pytest_shutdown.plugin.hang import HANG_HANDLERS, HUNG_TEARDOWN_EXIT_CODE
from pytest_shutdown.plugin.interrupts import dump_stacks_and_exit
from pytest_shutdown.plugin.interrupts import real_monotonic as _now

#: How often a teardown that keeps hanging is interrupted (at 1 and 1.5 budgets).
MAX_FIRES = 2
#: How long the watchdog lets the main thread take the budget's signal (and kill the test's
#: children) before it kills them itself: the main thread is stuck in C.
HANDOFF_S = 1.0
#: How long a hung process waits for its report and record log to be written before it ends.
HANG_HANDLERS_S = 5.0

HAVE_SIGALRM = hasattr(signal, "SIGALRM") and hasattr(signal, "setitimer")


def _is_pytest_timeout_handler(handler: object) -> bool:
    module = getattr(getattr(handler, "__func__", handler), "__module__", None)
    return isinstance(module, str) and module.partition(".")[0] == "pytest_timeout"


def all_stacks() -> list[dict[str, Any]]:
    """The stack of every thread now: name, ident, daemon flag and the formatted frames."""
    names = {t.ident: t for t in threading.enumerate()}
    stacks = []
    for ident, frame in sys._current_frames().items():
        thread = names.get(ident)
        stacks.append(
            {
                "name": thread.name if thread else "<unknown>",
                "ident": ident,
                "daemon": thread.daemon if thread else None,
                "stack": "".join(traceback.format_stack(frame)),
            }
        )
    return stacks


@lazy_dataclass
class BudgetOutcome:
    """What happened under one budget: whether it fired, when, and what was seen and killed."""

    budget_s: float
    method: str = "none"
    fired: bool = False
    #: A SIGALRM timer due before the budget was left to run: pytest-timeout's (the budget
    #: stands aside: method "none"), or the test's own (armed beside it).
    deferred_to_timeout: bool = False
    elapsed_s: float = 0.0
    threads: list[dict[str, Any]] = field(default_factory=list)
    killed: list[dict[str, Any]] = field(default_factory=list)
    hung: bool = False

    def to_dict(self) -> dict[str, Any]:
        keys = ("budget_s", "method", "fired", "elapsed_s", "threads", "killed", "hung")
        plain = {key: getattr(self, key) for key in keys}
        plain["elapsed_s"] = round(self.elapsed_s, 4)
        return plain


class TeardownBudget:
    """Context manager: interrupt the block when it runs longer than ``seconds``.

    ``label`` names what is guarded; ``on_expire`` runs once, at the first expiry, and returns
    records of what it killed. ``method``: ``"signal"``, ``"thread"`` or ``"auto"`` (signal in
    the main thread where available)."""

    def __init__(
        self,
        seconds: float,
        label: str,
        on_expire: Callable[[], list[dict[str, Any]]] | None = None,
        *,
        method: str = "auto",
    ) -> None:
        if method not in ("auto", "signal", "thread"):
            raise ValueError(f"method: {method!r} is not accepted; accepted: auto, signal, thread")
        self.seconds = seconds
        self.label = label
        self.on_expire = on_expire
        in_main = threading.current_thread() is threading.main_thread()
        if method == "auto":
            method = "signal" if HAVE_SIGALRM and in_main else "thread"
        self.outcome = BudgetOutcome(budget_s=seconds, method=method)
        self._start = 0.0
        self._old_handler: Any = None
        self._old_timer: tuple[float, float] = (0.0, 0.0)  # pytest-timeout's, paused
        self._armed = False
        #: Set by the watchdog just before it sends SIGALRM: any other SIGALRM is a timer's.
        self._sent = False
        self._lock = threading.Lock()
        self._kill_lock = threading.RLock()
        self._kill_started = False
        self._killed = threading.Event()
        self._done = threading.Event()
        self._target = threading.get_ident()
        #: Set when the watchdog has returned (not a threading.Thread: a test that patches
        #: Thread.start must not reach it).
        self._watchdog_done: threading.Event | None = None

    def _message(self) -> str:
        return (
            f"shutdown budget of {self.seconds:g} s exceeded in the teardown of {self.label}; "
            "the stack of every thread is in its report section 'Captured shutdown budget teardown'"
        )

    def _expire(self) -> None:
        """At the first expiry: record the time and every thread's stack."""
        self.outcome.fired = True
        self.outcome.elapsed_s = _now() - self._start
        self.outcome.threads = all_stacks()

    def _kill_once(self) -> None:
        """Run ``on_expire`` once: in the signal handler, else in the watchdog."""
        with self._kill_lock:
            if self._kill_started:
                return
            self._kill_started = True
        try:
            if self.on_expire is not None:
                self.outcome.killed = self.on_expire()
        except Exception as exc:  # never let the watchdog itself break the teardown
            self.outcome.killed = [{"error": repr(exc)}]
        finally:
            self._killed.set()

    def __enter__(self) -> TeardownBudget:
        self._start = _now()
        if self.seconds <= 0:
            self.outcome.method = "none"
            return self
        if self.outcome.method == "signal":
            self._arm_signal()
            if not self._armed:
                return self  # pytest-timeout governs
        self._armed = True
        self._watchdog_done = threading.Event()
        start_own_thread(self._watch_then_say_done, (self._watchdog_done,))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.outcome.method == "signal":
            self._disarm_signal()
        elif self.outcome.method == "thread":
            self._disarm_thread()
        if not self.outcome.fired:
            self.outcome.elapsed_s = _now() - self._start

    def _watch_then_say_done(self, done: threading.Event) -> None:
        try:
            self._watch()
        finally:
            done.set()

    def _join_watchdog(self) -> None:
        if self._watchdog_done is not None:
            self._watchdog_done.wait(5.0)

    def _watch(self) -> None:
        waits = [self.seconds] + [self.seconds / 2] * (MAX_FIRES - 1)
        for fire, wait in enumerate(waits):
            if self._done.wait(wait):
                return
            with self._lock:
                if not self._armed:
                    return
                first = fire == 0
                if first:
                    self._expire()
                    if self.outcome.method == "thread":
                        self._kill_once()  # no handler of ours runs in the teardown's thread
                self._interrupt()
            if first and not self._killed.wait(HANDOFF_S):
                self._kill_once()  # the main thread did not take the signal: stuck in C
        if self._done.wait(self.seconds - sum(waits[1:])):
            return
        with self._lock:
            if not self._armed:
                return
        self._end_hung_process()

    def _interrupt(self) -> None:
        if self.outcome.method == "signal":
            self._sent = True
            signal.pthread_kill(self._target, signal.SIGALRM)
            return
        import ctypes  # noqa: PLC0415 - only the thread method needs it

        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self._target), ctypes.py_object(ShutdownBudgetExceeded)
        )

    def _end_hung_process(self) -> None:
        """The teardown ignored the budget for a second budget: report, dump stacks, exit."""
        self.outcome.hung = True
        self.outcome.elapsed_s = _now() - self._start
        self.outcome.threads = all_stacks()
        handled = threading.Event()

        def run_handlers() -> None:
            try:
                for handler in list(HANG_HANDLERS):
                    try:
                        handler(self.label, self.outcome)
                    except Exception as exc:  # noqa: BLE001 - the process ends whatever happens
                        sys.stderr.write(f"pytest-shutdown: a hang handler failed: {exc!r}\n")
            finally:
                handled.set()

        # In a thread of its own, with a deadline: a handler that needs a lock the hung thread
        # holds (the record log's, the report's) must not keep the process from ending.
        start_own_thread(run_handlers, ())
        if not handled.wait(HANG_HANDLERS_S):
            sys.stderr.write(
                f"pytest-shutdown: the report was not written within {HANG_HANDLERS_S:g} s of "
                "the hang; ending without it\n"
            )
        dump_stacks_and_exit(
            f"the teardown of {self.label} did not return within {self.seconds:g} s after its "
            f"{self.seconds:g} s shutdown budget ran out",
            HUNG_TEARDOWN_EXIT_CODE,
        )

    def _arm_signal(self) -> None:
        delay, interval = signal.getitimer(signal.ITIMER_REAL)
        timeouts = _is_pytest_timeout_handler(signal.getsignal(signal.SIGALRM))
        if delay and delay <= self.seconds:
            self.outcome.deferred_to_timeout = True  # its SIGALRM goes to its handler
            if timeouts:  # pytest-timeout's timer is due first: it governs this hang
                self.outcome.method = "none"
                return
        if delay and timeouts:  # paused; put back with what was left
            self._old_timer = (delay, interval)
            signal.setitimer(signal.ITIMER_REAL, 0)
        # Any other timer (the test's own) keeps running: _on_signal passes its SIGALRM on.
        self._old_handler = signal.signal(signal.SIGALRM, self._on_signal)
        self._armed = True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        if not self._sent:
            self._pass_on(signum, frame)  # the test's own timer went off
            return
        self._sent = False
        if not self._armed:
            return
        self._kill_once()  # here, so that the teardown sees its children gone when it resumes
        raise ShutdownBudgetExceeded(self._message())

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        """A SIGALRM the watchdog did not send: what the handler in place before would do."""
        __tracebackhide__ = True
        old = self._old_handler
        if callable(old):
            old(signum, frame)
        elif old is not None and old == signal.SIG_DFL:
            # Without the plugin the timer's SIGALRM ends the process (its default action).
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGALRM)
        # SIG_IGN, or a handler installed outside Python: nothing to do here

    def _disarm_signal(self) -> None:
        if not self._armed:
            return
        # First, without the lock: a SIGALRM the watchdog sends from now on is let go by the
        # handler. Then, with it: the watchdog is not between its check and its signal.
        self._armed = False
        with self._lock:
            self._done.set()
        self._join_watchdog()
        handler = self._old_handler if self._old_handler is not None else signal.SIG_DFL
        signal.signal(signal.SIGALRM, handler)
        delay, interval = self._old_timer
        if delay:  # pytest-timeout's, paused: re-armed with what was left
            remaining = delay - (_now() - self._start)
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-3), interval)

    def _disarm_thread(self) -> None:
        # An injected exception not yet delivered is dropped, not by PyThreadState_SetAsyncExc
        # (ident, NULL) alone: on CPython 3.11 that leaves the async-exception flag set for good
        # (see STALE_ASYNC_EXC_LOOPS).
        try:
            with self._lock:
                self._armed = False  # from here on the watchdog injects (and fires) nothing
            if self.outcome.fired:
                discard_pending_async_exc(self._target, ShutdownBudgetExceeded)
        except ShutdownBudgetExceeded:  # it arrived during the disarm itself
            discard_pending_async_exc(self._target, ShutdownBudgetExceeded)
        self._done.set()
        self._join_watchdog()
