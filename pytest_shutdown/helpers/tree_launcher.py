"""The tree launcher: a warm process that starts the process trees under test and adopts orphans.

Its environment carries ``PYTEST_SHUTDOWN_TREE=<token>``, which everything it starts inherits
(forked or executed, whatever session it moves to), and it is a child subreaper: an orphan is
re-parented to it, not to init. Either finds a process that double-forked away; both together
make reparenting unable to hide one. Each ``run`` forks one root (a new session, its output
appended to a log, faulthandler on); a callable target then runs the interpreter's exit sequence
(non-daemon threads, atexit, multiprocessing's children), where exit-time hangs live. The
launcher imports a target's module before forking (torch once) and freezes its heap for the
forks. One tree runs at a time (the caller holds ``lock``): every other process carrying the
token belongs to the tree under test.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from typing import Any

from pytest_shutdown._os.killer import kill_trees
from pytest_shutdown._os.phases import WANTED_PHASE_ENV
from pytest_shutdown._os.prctl import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, prctl
from pytest_shutdown.helpers.tree import TREE_MARKER_ENV, scan_tree

#: How long a new launcher may take to import its preloads and report ready.
LAUNCHER_START_TIMEOUT_S = 120.0
#: How often the launcher reaps its children and checks its parent.
LAUNCHER_POLL_S = 0.05
#: How long the launcher waits for its tree to vanish after killing it on stop.
LAUNCHER_STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RunRequest:
    """What the launcher starts: a callable (with args) or a command line, with env and log."""

    log_path: str
    env: Mapping[str, str] = field(default_factory=dict)
    target: Callable[..., Any] | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    command: Sequence[str] | None = None


class TreeLauncher:
    """The caller's side of a launcher process; start it once, run trees one after the other.

    ``with TreeLauncher() as launcher:`` or ``launcher.close()`` when done: closing kills
    whatever the launcher still has running, then the launcher itself.
    """

    def __init__(self, preload: Sequence[str] = (), *, python: str | None = None) -> None:
        if not sys.platform.startswith("linux"):
            raise RuntimeError(f"TreeLauncher needs Linux (/proc, prctl); this is {sys.platform!r}")
        self.token = uuid.uuid4().hex
        self.lock = threading.Lock()
        self.exitcodes: dict[int, int] = {}
        ours, theirs = mp_connection.Pipe(duplex=True)
        env = {**os.environ, TREE_MARKER_ENV: self.token}
        env.pop(WANTED_PHASE_ENV, None)
        self._conn = ours
        try:
            self.process = subprocess.Popen(
                [python or sys.executable, "-m", __name__, str(theirs.fileno()), *preload],
                pass_fds=[theirs.fileno()],
                env=env,
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.pid = self.process.pid
        try:
            msg = self._recv(LAUNCHER_START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        if msg[0] != "ready":
            self.close()
            raise RuntimeError(f"tree launcher failed to start: {msg[1:]}")

    def run(self, request: RunRequest, timeout: float = LAUNCHER_START_TIMEOUT_S) -> int:
        """Start one root; its pid. The caller must hold ``lock`` while the tree lives. ``timeout``
        covers the launcher importing the target's module (torch, the first time)."""
        # Like multiprocessing's spawn: the target's module must be importable by the launcher.
        self._conn.send(("run", list(sys.path), pickle.dumps(request)))
        deadline = time.monotonic() + timeout
        while True:
            msg = self._recv(max(0.0, deadline - time.monotonic()))
            if msg[0] == "started":
                return int(msg[1])
            if msg[0] == "error":
                raise RuntimeError(f"tree launcher could not start the target:\n{msg[1]}")

    def poll(self) -> None:
        """Collect the exit codes the launcher reported so far (non-blocking)."""
        try:
            while self._conn.poll(0):
                self._handle(self._conn.recv())
        except (EOFError, OSError):
            pass

    def exitcode(self, pid: int) -> int | None:
        self.poll()
        return self.exitcodes.get(pid)

    def _recv(self, timeout: float) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"tree launcher pid {self.pid} did not answer in {timeout:g} s")
            if self._conn.poll(min(remaining, 0.1)):
                msg: tuple[Any, ...] = self._conn.recv()
                if not self._handle(msg):
                    return msg
            elif self.process.poll() is not None:
                raise RuntimeError(f"tree launcher exited with code {self.process.returncode}")

    def _handle(self, msg: tuple[Any, ...]) -> bool:
        if msg[0] == "exited":
            self.exitcodes[int(msg[1])] = int(msg[2])
            return True
        return False

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout: float = LAUNCHER_STOP_TIMEOUT_S + 2.0) -> None:
        """Stop the launcher: it kills its remaining tree first. Idempotent."""
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("stop",))
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)
        self._conn.close()

    def __enter__(self) -> TreeLauncher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- the launcher process ------------------------------------------------------------------
def _main(argv: Sequence[str]) -> None:
    conn = Connection(int(argv[0]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the caller's to handle
    parent = os.getppid()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        for module in argv[1:]:
            __import__(module)
        _freeze()
        conn.send(("ready", os.getpid()))
    except BaseException:  # noqa: BLE001 - the caller gets the traceback
        conn.send(("error", traceback.format_exc()))
        return
    roots: set[int] = set()
    modules = len(sys.modules)
    while True:
        _reap(conn, roots)
        if os.getppid() != parent:
            break
        try:
            if not conn.poll(LAUNCHER_POLL_S):
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] == "stop":
            break
        if msg[0] == "run":
            try:
                sys.path.extend(p for p in msg[1] if p not in sys.path)
                request = pickle.loads(msg[2])
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
                continue
            if len(sys.modules) != modules:  # the target's modules: imported once, here
                _freeze()
                modules = len(sys.modules)
            pid = _fork_root(request, conn)
            roots.add(pid)
            conn.send(("started", pid))
    _kill_everything()
    _reap(None, roots)


def _freeze() -> None:
    gc.collect()
    gc.freeze()


def _reap(conn: Connection | None, roots: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in roots and conn is not None:
            roots.discard(pid)
            with contextlib.suppress(OSError):
                conn.send(("exited", pid, os.waitstatus_to_exitcode(status)))


def _kill_everything() -> None:
    """Kill every process carrying this launcher's marker (its tree), wait until they are gone."""
    token = os.environ.get(TREE_MARKER_ENV, "")
    deadline = time.monotonic() + LAUNCHER_STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        members = scan_tree(token, os.getpid())
        alive = [p for p in members.values() if p.state != "Z"]
        if not alive:
            return
        kill_trees([p.pid for p in alive], why="the tree launcher stops", timeout=0.0)
        time.sleep(0.05)
        _reap(None, set())


def _fork_root(request: RunRequest, conn: Connection) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        conn.close()
        os.setsid()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # nothing outlives its launcher
        fd = os.open(request.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ.update(request.env)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request.command is not None:
            os.execvpe(request.command[0], list(request.command), os.environ)
        faulthandler.enable(file=sys.stderr, all_threads=True)
        code = _run_target(request)
    except BaseException:  # noqa: BLE001 - whatever happens, the fork ends here
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    raise AssertionError("unreachable")


def _run_target(request: RunRequest) -> int:
    """Call the target, then exit as an interpreter does: join threads, run atexit callbacks."""
    import atexit  # noqa: PLC0415

    assert request.target is not None
    code = 0
    try:
        result = request.target(*request.args, **request.kwargs)
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - reported like an uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # joins non-daemon threads
    atexit._run_exitfuncs()
    return code


if __name__ == "__main__":
    _main(sys.argv[1:])
