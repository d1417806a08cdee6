"""SIGTERM ends a guarded session in order, as Ctrl-C does: teardown, summary, report; and a
session stuck in C still ends.

pytest has no SIGTERM handler, so a CI runner's SIGTERM kills the process where it stands: no
fixture teardown, no summary, no report. While a guarded session (or one writing
``--shutdown-report``) runs, the first SIGTERM raises :class:`KeyboardInterrupt` in the main
thread instead.

A Python signal handler runs only when the main thread gets back to Python. A main thread
blocked inside one C call (a deadlocked ``pthread_mutex_lock``, a driver call) never does, so
the handler alone would make SIGTERM and Ctrl-C do nothing at all. So the signals are also
watched from a thread of the plugin's own: a C-level handler (``faulthandler.register`` with
``chain=True``, which then calls Python's own handler as before) writes every thread's stack
into a pipe, and the watcher reads it. If the main thread has not taken the signal within
:data:`TAKE_SIGNAL_S` seconds (for SIGTERM: our handler has not run; for SIGINT: the main
thread's frame has not moved), or on a second SIGTERM, the watcher ends the process at once:
it writes the record log's end and the report (``"complete": false``), dumps every thread's
stack to stderr and exits with 143 (SIGTERM) or 130 (SIGINT).

Nothing is installed when a handler other than the default one is already in place (the user's
code installed its own), on an xdist worker (the controller ends the workers), or outside the
main thread; SIGINT is watched only while its handler is Python's default one. A handler the
user's code installs during the run is left alone. A forked child never keeps the handlers or
the watch (:mod:`pytest_shutdown.forks`): ``Process.terminate()`` and ``Pool.terminate()`` kill
it with SIGTERM as they would without the plugin.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import IO, Any

import pytest

from pytest_shutdown.forks import forget_in_child, undo_in_forked_child
from pytest_shutdown.own_threads import start_own_thread

#: Seconds the main thread has to take a SIGTERM or SIGINT before the process ends at once.
TAKE_SIGNAL_S = 5.0
#: The bound on waiting for the watcher to end when the session is over (it takes microseconds).
STOP_TIMEOUT_S = 1.0
#: Exit statuses of a process ended at once by the watcher: 128 + the signal number.
EXIT_STATUS: dict[int, int] = {signal.SIGTERM: 143, signal.SIGINT: 130}


class SigtermInterrupted(KeyboardInterrupt):
    """The KeyboardInterrupt that SIGTERM raises under the shutdown plugin."""


class SigtermEndsSessionInOrder:
    """Installs the SIGTERM handler and the signal watch for the session's duration: the
    report's hooks call :meth:`start` first at session start and :meth:`stop` last at
    unconfigure. ``on_abort(exitstatus)`` is called (from the watcher) just before the process
    ends at once: it writes the report."""

    def __init__(self, on_abort: Callable[[int], None] | None = None) -> None:
        self._installed = False
        self._on_abort = on_abort
        self._watch: _SignalWatch | None = None
        self._sigterms = 0

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._sigterms += 1
        watch = self._watch
        if watch is not None:
            watch.taken.set()
            if self._sigterms > 1:  # a second SIGTERM: end now, whatever the main thread does
                watch.end_at_once(signal.SIGTERM, "a second SIGTERM")
        elif self._sigterms > 1:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        raise SigtermInterrupted("SIGTERM: the session ends in order (teardown, summary, report)")

    def start(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # someone else's handler: theirs governs
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        signals: list[int] = [signal.SIGTERM]
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signals.append(signal.SIGINT)
        self._watch = None
        if hasattr(faulthandler, "register"):  # not on Windows: the handler alone, as before
            try:
                self._watch = _SignalWatch(signals, self._abort)
            except (OSError, RuntimeError, ValueError):  # pragma: no cover - no pipe, no watch
                self._watch = None
        undo_in_forked_child("sigterm", self._restore_default_in_child, hold=signals)

    def _abort(self, exitstatus: int) -> None:
        if self._on_abort is not None:
            self._on_abort(exitstatus)

    def _restore_default_in_child(self) -> None:
        if self._watch is not None:
            self._watch.forget_in_child()
            self._watch = None
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def stop(self) -> None:
        if not self._installed:
            return
        self._installed = False
        forget_in_child("sigterm")
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        current: Any = signal.getsignal(signal.SIGTERM)
        if current == self._on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _SignalWatch:
    """Notices SIGTERM and SIGINT from a thread of its own, whatever the main thread does."""

    def __init__(self, signals: list[int], abort: Callable[[int], None]) -> None:
        self.taken = threading.Event()
        self._abort = abort
        self._ending = threading.Lock()
        self._pipes: dict[int, tuple[int, IO[bytes]]] = {}  # signal -> (read fd, write file)
        self._registered: list[int] = []
        self._stopped = False
        #: Held while the watcher runs: :meth:`stop` waits for it (see there).
        self._running = threading.Lock()
        self._ident = 0  # the watcher's, once started
        #: Python's handler of each signal when the watch started.
        self._python_handlers = {signum: signal.getsignal(signum) for signum in signals}
        for signum in signals:
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)  # a full pipe cuts the dump, never blocks it
            writer: IO[bytes] = os.fdopen(write_fd, "wb", buffering=0)
            self._pipes[signum] = (read_fd, writer)
        try:
            for signum, (_, writer) in self._pipes.items():
                faulthandler.register(signum, file=writer, all_threads=True, chain=True)
                self._registered.append(signum)
        except BaseException:
            self.stop()
            raise
        self._running.acquire()
        try:
            self._ident = start_own_thread(self._run, ())
        except BaseException:  # no watcher: nothing for stop() to wait for
            self._running.release()
            self.stop()
            raise

    def _main_position(self) -> tuple[int, int] | None:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        return (id(frame), frame.f_lasti) if frame is not None else None

    def _run(self) -> None:
        fds = {read_fd: signum for signum, (read_fd, _) in self._pipes.items()}
        try:
            self._watch_signals(fds)
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._running.release()

    def _watch_signals(self, fds: dict[int, int]) -> None:
        pending: dict[int, tuple[float, tuple[int, int] | None]] = {}  # signal -> since, where
        sigterms = 0
        while True:
            timeout = None
            if pending:
                due = min(since for since, _ in pending.values()) + TAKE_SIGNAL_S
                timeout = max(due - time.monotonic(), 0.0)
            try:
                ready, _, _ = select.select(list(fds), [], [], timeout)
            except (OSError, ValueError):
                return
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    return
                if not data or self._stopped:
                    return  # the session is over
                signum = fds[fd]
                time.sleep(0.05)  # one signal writes one dump: read the rest of it
                self._drain(fd)
                if signum == signal.SIGTERM:
                    sigterms += 1
                    if sigterms > 1:
                        self.end_at_once(signal.SIGTERM, "a second SIGTERM")
                pending[signum] = (time.monotonic(), self._main_position())
            now = time.monotonic()
            for signum, (since, where) in list(pending.items()):
                if signum == signal.SIGTERM and self.taken.is_set():
                    del pending[signum]  # the main thread took it: the session ends in order
                elif signum == signal.SIGINT and self._main_position() != where:
                    del pending[signum]  # the main thread moved: Python's handler ran
                elif now - since >= TAKE_SIGNAL_S:
                    why = f"the main thread did not take it within {TAKE_SIGNAL_S:g} s"
                    self.end_at_once(signum, why + " (blocked in a C call)")

    def _drain(self, fd: int) -> None:
        while select.select([fd], [], [], 0)[0]:
            try:
                if not os.read(fd, 65536):
                    return
            except OSError:
                return

    def end_at_once(self, signum: int, why: str) -> None:
        """Write the report, dump every stack, end the process (once, from any thread)."""
        if not self._ending.acquire(blocking=False):
            return
        status = EXIT_STATUS.get(signum, 128 + signum)
        name = signal.Signals(signum).name
        try:
            self._abort(status)
        except Exception as exc:  # noqa: BLE001 - the process ends whatever happens
            sys.stderr.write(f"pytest-shutdown: writing the report failed: {exc!r}\n")
        stream = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
        try:
            stream.write(
                f"\n+++ pytest-shutdown: {name}: {why}; the record log and the report are "
                f"written (incomplete); the stacks of all threads follow; exit code {status} +++\n"
            )
            stream.flush()
            faulthandler.dump_traceback(file=stream, all_threads=True)
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os._exit(status)

    def stop(self) -> None:
        """The session is over: the C-level handlers go, the watcher ends."""
        self._stopped = True
        for signum in self._registered:
            # Only where Python's handler is still the one of the start: unregistering puts
            # back the C handler of that time, which must not undo a handler (SIG_DFL, SIG_IGN)
            # the user's code installed since (it replaced ours at the C level already).
            if signal.getsignal(signum) == self._python_handlers.get(signum):
                faulthandler.unregister(signum)
        self._registered = []
        for _, writer in self._pipes.values():
            writer.close()  # the watcher reads the end of its pipe and returns
        stopping = bool(self._pipes)
        self._pipes = {}
        # Waited for here, while this thread lets go of the GIL: a watcher still ending while the
        # session's last collections run asks for the GIL every switch interval (5 ms) and
        # slowed the end of every session by several milliseconds.
        waits = stopping and threading.get_ident() != self._ident
        if waits and self._running.acquire(timeout=STOP_TIMEOUT_S):
            self._running.release()

    def forget_in_child(self) -> None:
        """In a forked child: no C-level handler, no pipe of the parent's."""
        self._stopped = True
        for signum in self._registered:
            faulthandler.unregister(signum)
        self._registered = []
        for read_fd, writer in self._pipes.values():
            for close in (writer.close, lambda fd=read_fd: os.close(fd)):
                try:
                    close()
                except OSError:
                    pass
        self._pipes = {}
        self._ending = threading.Lock()  # the parent may have held it at the fork
