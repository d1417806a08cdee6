"""SIGTERM ends a fail-mode session in order, as Ctrl-C does (teardown, summary, report), and a
session stuck in C still ends.

pytest has no SIGTERM handler: a CI runner's SIGTERM kills the process where it stands. While a
session in fail mode (or a guard-off one writing ``--shutdown-report``) runs, the first SIGTERM
raises :class:`KeyboardInterrupt` in the main thread instead. Warn mode installs nothing.

A main thread blocked inside one C call (a deadlocked ``pthread_mutex_lock``) never runs a
Python handler, so the signals are also watched from a thread of the plugin's own: a C-level
handler (``faulthandler.register(chain=True)``, which then calls Python's handler) writes every
stack into a datagram socket the watcher reads; the kernel names the writer (``SO_PASSCRED``),
so a child forked in C that inherited the handler is ignored. If the main thread has not taken
the signal within :data:`TAKE_SIGNAL_S` (SIGTERM: our handler has not run; SIGINT: its frame
has not moved), or on a second SIGTERM, the watcher writes the record log's end and the report
(``"complete": false``), dumps every stack and exits with 128 + the signal number, saying where
the main thread is and never more than it knows. A first SIGTERM once pytest's test loop is
over (where it would escape pytest with a traceback) ends the process the same way.

Nothing is installed over a handler already in place, on an xdist worker, or outside the main
thread; SIGINT is watched only while its handler is Python's default. A handler the user's code
installs during the run is left alone. A forked child keeps neither handler nor watch
(:mod:`pytest_shutdown._os.forks`): each watched signal's C-level handler is set again from
Python's table (ours reads as the default), so ``Process.terminate()`` kills it as without the
plugin. A child forked in C that runs Python code sees it is not the installing process and
does the default action.
"""

from __future__ import annotations

import contextlib
import dis
import faulthandler
import functools
import linecache
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

import pytest

from pytest_shutdown._os.forks import forget_in_child, undo_in_forked_child
from pytest_shutdown._os.own_threads import start_own_thread

#: Seconds the main thread has to take a SIGTERM or SIGINT before the process ends at once.
TAKE_SIGNAL_S = 5.0
#: The bound on waiting for the watcher to end when the session is over (it takes microseconds).
STOP_TIMEOUT_S = 1.0
#: Why a first SIGTERM ends the process at once when pytest's test loop is over.
LOOP_OVER = (
    "it came after pytest's test loop was over (in the session's teardown or end, or after a "
    "Ctrl-C), where the session can no longer be ended in order"
)

#: The real clock and sleep, held where a test's monkeypatching (or freezegun, which rewrites
#: every module global that holds the real functions) does not reach them.
_CLOCK = (time.monotonic, time.sleep)


def real_monotonic() -> float:
    """``time.monotonic()``, whatever a test did to ``time.monotonic`` since the plugin loaded."""
    return _CLOCK[0]()


def dump_stacks_and_exit(line: str, status: int) -> NoReturn:
    """Write ``line`` and every thread's stack to the real stderr, then end the process."""
    stream = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
    with contextlib.suppress(OSError, ValueError, AttributeError):
        stream.write(
            f"\n+++ pytest-shutdown: {line}; the stacks of all threads follow; "
            f"exit code {status} +++\n"
        )
        stream.flush()
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
    os._exit(status)


class SigtermInterrupted(KeyboardInterrupt):
    """The KeyboardInterrupt that SIGTERM raises under the shutdown plugin."""


@functools.cache
def _loop_code() -> Any:
    try:
        from _pytest.main import _main  # noqa: PLC0415 - pytest's test loop, once

        return _main.__code__
    except (ImportError, AttributeError):  # pragma: no cover - another pytest: assume the loop
        return None


def _in_test_loop(frame: FrameType | None) -> bool:
    """Whether pytest's test loop (``_pytest.main._main``) is on the main thread's stack, where
    pytest takes a KeyboardInterrupt and ends the session in order."""
    code = _loop_code()
    if code is None:
        return True
    current: FrameType | None = frame if frame is not None else sys._getframe()
    while current is not None:
        if current.f_code is code:
            return True
        current = current.f_back
    return False


_CALLS = frozenset(op for name, op in dis.opmap.items() if name.startswith(("CALL", "PRECALL")))


def where_main_thread_is() -> str:
    """Where the main thread is, as far as is known: its top Python frame, and whether that
    frame is in a call with no Python code below it (a call into C, such as ``time.sleep``)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None:
        return "where it is is not known"
    code = frame.f_code
    place = f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
    try:
        line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    except Exception:  # noqa: BLE001 - the place without its source line
        line = ""
    if line:
        place += f" ({line})"
    try:
        calling = code.co_code[frame.f_lasti] in _CALLS
    except (IndexError, TypeError):
        calling = False
    if calling:
        return f"it is in a call into C from {place}"
    return f"its top Python frame is {place}"


class SigtermEndsSessionInOrder:
    """The SIGTERM handler and the signal watch, from :meth:`start` (session start) to
    :meth:`stop` (unconfigure). ``on_abort(exitstatus)`` writes the report, from the watcher,
    just before the process ends at once."""

    def __init__(self, on_abort: Callable[[int], None]) -> None:
        self._installed = False
        self._on_abort = on_abort
        self._watch: _SignalWatch | None = None
        self._sigterms = 0
        self._signals: list[int] = []
        self._pid = os.getpid()  # the process that installed the handler (set at start)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A child forked in C (no at-fork hook ran) that got back to Python: the default action
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self._sigterms += 1
        watch = self._watch
        # A second SIGTERM ends now; so does one where pytest's test loop is over (raised
        # there, it would escape pytest with a traceback and exit status 1).
        why = None
        if self._sigterms > 1:
            why = "a second SIGTERM"
        elif not _in_test_loop(frame):
            why = LOOP_OVER
        if watch is not None:
            watch.taken.set()
            if why is not None:
                watch.end_at_once(signal.SIGTERM, why)
        elif why is not None:
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
        self._pid = os.getpid()
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True
        signals: list[int] = [signal.SIGTERM]
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signals.append(signal.SIGINT)
        self._signals = signals
        self._watch = None
        if hasattr(faulthandler, "register"):  # not on Windows: the handler alone, as before
            with contextlib.suppress(OSError, RuntimeError, ValueError):  # no socket, no watch
                self._watch = _SignalWatch(signals, self._on_abort)
        undo_in_forked_child("sigterm", self._restore_default_in_child, hold=signals)

    def _restore_default_in_child(self) -> None:
        if self._watch is not None:
            self._watch.forget_in_child()
            self._watch = None
        # Unregistering faulthandler put back the C-level handler of the watch's start, wrong
        # where the test changed Python's handler since (a SIGTERM put back to SIG_DFL would be
        # ignored): each is set again from Python's table, where ours reads as the default.
        for signum in self._signals:
            handler: Any = signal.getsignal(signum)
            if handler == self._on_sigterm:
                handler = signal.SIG_DFL
            if handler is None:
                continue  # installed outside Python: nothing to set it from
            with contextlib.suppress(OSError, RuntimeError, TypeError, ValueError):
                signal.signal(signum, handler)

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


#: The credentials the kernel attaches to a datagram where the receiver asks for them (Linux's
#: ``struct ucred``: pid, uid, gid).
_UCRED = struct.Struct("iII")
_PASSCRED: int | None = getattr(socket, "SO_PASSCRED", None)
_CREDENTIALS: int | None = getattr(socket, "SCM_CREDENTIALS", None)
_ANCILLARY_SIZE = socket.CMSG_SPACE(_UCRED.size) if hasattr(socket, "CMSG_SPACE") else 0


class _SignalWatch:
    """Notices SIGTERM and SIGINT delivered to this process, whatever the main thread does."""

    def __init__(self, signals: list[int], abort: Callable[[int], None]) -> None:
        self.taken = threading.Event()
        self._abort = abort
        self._ending = threading.Lock()
        #: signal -> (the watcher's receiving end, the C-level handler's sending end)
        self._sockets: dict[int, tuple[socket.socket, socket.socket]] = {}
        self._registered: list[int] = []
        self._stopped = False
        #: Held while the watcher runs: :meth:`stop` waits for it (see there).
        self._running = threading.Lock()
        self._ident = 0  # the watcher's, once started
        self._pid = os.getpid()  # the only process whose signals count
        #: Python's handler of each signal when the watch started.
        self._python_handlers = {signum: signal.getsignal(signum) for signum in signals}
        try:
            for signum in signals:
                receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sockets[signum] = (receiver, sender)
                if _PASSCRED is not None:
                    receiver.setsockopt(socket.SOL_SOCKET, _PASSCRED, 1)
                sender.setblocking(False)  # a full queue cuts the dump, never blocks it
            for signum, (_, sender) in self._sockets.items():
                faulthandler.register(signum, file=sender.fileno(), all_threads=True, chain=True)
                self._registered.append(signum)
        except BaseException:
            self.stop()
            raise
        receivers = {receiver: signum for signum, (receiver, _) in self._sockets.items()}
        self._running.acquire()
        try:
            self._ident = start_own_thread(self._run, (receivers,))
        except BaseException:  # no watcher: nothing for stop() to wait for
            self._running.release()
            self.stop()
            raise

    def _main_position(self) -> tuple[int, int] | None:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        return (id(frame), frame.f_lasti) if frame is not None else None

    def _run(self, receivers: dict[socket.socket, int]) -> None:
        try:
            self._watch_signals(receivers)
        finally:
            self._running.release()  # stop() closes the sockets

    def _watch_signals(self, receivers: dict[socket.socket, int]) -> None:
        pending: dict[int, tuple[float, tuple[int, int] | None]] = {}  # signal -> since, where
        sigterms = 0
        while True:
            timeout = None
            if pending:
                due = min(since for since, _ in pending.values()) + TAKE_SIGNAL_S
                timeout = max(due - _CLOCK[0](), 0.0)
            try:
                ready, _, _ = select.select(list(receivers), [], [], timeout)
            except (OSError, ValueError):
                return
            for receiver in ready:
                ours = self._receive(receiver)
                if ours is None:
                    return  # the session is over
                if not ours:
                    continue  # another process's signal (a child forked in C): not ours
                signum = receivers[receiver]
                _CLOCK[1](0.05)  # one signal writes one dump: read the rest of it
                self._drain(receiver)
                if signum == signal.SIGTERM:
                    sigterms += 1
                    if sigterms > 1:
                        self.end_at_once(signal.SIGTERM, "a second SIGTERM")
                pending[signum] = (_CLOCK[0](), self._main_position())
            now = _CLOCK[0]()
            for signum, (since, where) in list(pending.items()):
                if signum == signal.SIGTERM and self.taken.is_set():
                    del pending[signum]  # the main thread took it: the session ends in order
                elif signum == signal.SIGINT and self._main_position() != where:
                    del pending[signum]  # the main thread moved: Python's handler ran
                elif now - since >= TAKE_SIGNAL_S:
                    # Only what is known (for SIGINT, Python's handler may have run: a slow finally)
                    if signum == signal.SIGTERM:
                        why = f"the main thread did not take it within {TAKE_SIGNAL_S:g} s"
                    else:
                        why = f"the main thread did not move within {TAKE_SIGNAL_S:g} s of it"
                    self.end_at_once(signum, f"{why}: {where_main_thread_is()}")

    def _receive(self, receiver: socket.socket) -> bool | None:
        """Whether one of this process's datagrams came (None: the watch is over)."""
        while True:
            if self._stopped:
                return None  # (a datagram socket shut for reading reads "nothing yet")
            try:
                data, ancillary, _, _ = receiver.recvmsg(1, _ANCILLARY_SIZE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return None if self._stopped else False
            except (OSError, ValueError):
                return None
            if not data:
                return None
            if self._sent_here(ancillary):
                return True

    def _sent_here(self, ancillary: list[tuple[int, int, bytes]]) -> bool:
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _CREDENTIALS and len(payload) >= _UCRED.size:
                return bool(_UCRED.unpack_from(payload)[0] == self._pid)
        return True  # no credentials (not Linux): every datagram counts, as it did

    def _drain(self, receiver: socket.socket) -> None:
        while True:
            try:
                if not receiver.recv(65536, socket.MSG_DONTWAIT):
                    return
            except (OSError, ValueError):  # BlockingIOError: nothing left
                return

    def end_at_once(self, signum: int, why: str) -> None:
        """Write the report, dump every stack, end the process (once, from any thread)."""
        if not self._ending.acquire(blocking=False):
            return
        status = 128 + signum
        name = signal.Signals(signum).name
        try:
            self._abort(status)
        except Exception as exc:  # noqa: BLE001 - the process ends whatever happens
            sys.stderr.write(f"pytest-shutdown: writing the report failed: {exc!r}\n")
        dump_stacks_and_exit(
            f"{name}: {why}; the record log and the report are written (incomplete)", status
        )

    def stop(self) -> None:
        """The session is over: the C-level handlers go, the watcher ends."""
        self._stopped = True
        for signum in self._registered:
            # Not where the user's code installed a handler since: unregistering would put back
            # the C handler of the start over it.
            if signal.getsignal(signum) == self._python_handlers.get(signum):
                faulthandler.unregister(signum)
        self._registered = []
        sockets = list(self._sockets.values())
        self._sockets = {}
        for receiver, sender in sockets:
            with contextlib.suppress(OSError):
                receiver.shutdown(socket.SHUT_RD)  # the watcher reads the end and returns
            sender.close()
        # Waited for here: a watcher still ending during the session's last collections asks
        # for the GIL every switch interval (5 ms), several milliseconds per session.
        waits = bool(sockets) and threading.get_ident() != self._ident
        if waits and self._running.acquire(timeout=STOP_TIMEOUT_S):
            self._running.release()
        for receiver, _ in sockets:
            receiver.close()

    def forget_in_child(self) -> None:
        """In a forked child: no C-level handler, no socket of the parent's."""
        self._stopped = True
        for signum in self._registered:
            faulthandler.unregister(signum)
        self._registered = []
        for receiver, sender in self._sockets.values():
            for sock in (receiver, sender):
                with contextlib.suppress(OSError):
                    sock.close()
        self._sockets = {}
        self._ending = threading.Lock()  # the parent may have held it at the fork
