"""How a process really ends: ``probe_exit`` and ``assert_not_force_killed``."""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_shutdown._base.arguments import require_callable, require_instance
from pytest_shutdown._os.killer import kill_trees
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.report import CheckReport, is_seconds

#: How many characters of the child's stderr an ExitRecord keeps.
STDERR_TAIL_CHARS = 4000
#: How long a killed child gets to be reaped.
KILL_DEADLINE_S = 5.0


@dataclass(frozen=True)
class ExitRecord:
    """How a probed child process ended.

    ``exitcode`` follows multiprocessing: the exit status, or minus the signal number when a
    signal killed it (``-9`` when the probe killed a hung child at its timeout, ``timed_out``
    then True). ``gc_freeze_count`` is ``gc.get_freeze_count()`` at the very end of the child,
    after the target's own ``finally`` blocks (``None`` when the child never got there, e.g.
    killed or ``os._exit``). ``stderr_tail`` is the last characters the child wrote to fd 2.
    """

    exitcode: int | None
    gc_freeze_count: int | None
    duration_s: float
    stderr_tail: str
    timed_out: bool
    pid: int | None
    start_method: str
    gc_freeze_count_at_start: int | None = None

    @property
    def froze(self) -> bool | None:
        """True when the child ended with more of its heap frozen than it started with
        (a ``gc.freeze()`` on its way out); ``None`` when either count is unknown."""
        if self.gc_freeze_count is None or self.gc_freeze_count_at_start is None:
            return None
        return self.gc_freeze_count > self.gc_freeze_count_at_start

    @property
    def signal_name(self) -> str | None:
        """``"SIGTERM"`` etc. when a signal ended the child, else ``None``."""
        from pytest_shutdown.resources.collateral import signal_name  # noqa: PLC0415

        return None if self.exitcode is None or self.exitcode >= 0 else signal_name(-self.exitcode)


def _probe_main(
    target: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], workdir: str
) -> None:
    """The child's entry: stderr to a file, run the target, record the freeze count last."""
    err = os.open(os.path.join(workdir, "stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os.dup2(err, 2)
    os.close(err)
    # The parent's sys.stderr may not write to fd 2 (pytest's capture replaces it): rebind it.
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    # Garbage inherited from the parent goes first: a finalizer in it that freezes the heap
    # (an earlier test's engine) would read as the target's freeze.
    gc.collect()
    _write_atomically(os.path.join(workdir, "freeze-start"), str(gc.get_freeze_count()))
    try:
        target(*args, **kwargs)
    finally:
        _write_atomically(os.path.join(workdir, "freeze"), str(gc.get_freeze_count()))


def _write_atomically(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def _kill_tree(proc: Any) -> None:
    """SIGKILL the child and its descendants, waiting for them to end; the child is joined by
    multiprocessing, so that its ``exitcode`` stays readable."""
    why = "probe_exit: the child outlived its deadline"
    kill_trees([proc.pid], why=why, timeout=KILL_DEADLINE_S)
    proc.join(KILL_DEADLINE_S)


def probe_exit(
    target: Callable[..., Any],
    *args: Any,
    start_method: str | None = None,
    timeout: float = 30.0,
    **kwargs: Any,
) -> ExitRecord:
    """Run ``target(*args, **kwargs)`` in a child process and record how it really ended.

    ``start_method`` is a multiprocessing start method (default: the platform's); with
    ``"spawn"`` or ``"forkserver"`` the target and its arguments must be picklable. A child still
    running after ``timeout`` seconds is killed with its whole process tree and reported with
    ``timed_out=True``; the child is never left behind.
    """
    require_callable("probe_exit", "target", target, "the function to run in the child")
    methods = multiprocessing.get_all_start_methods()
    if start_method is not None and start_method not in methods:
        raise ValueError(f"start_method: {start_method!r} unknown; accepted: {', '.join(methods)}")
    if not is_seconds(timeout):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    context = multiprocessing.get_context(start_method)
    workdir = tempfile.mkdtemp(prefix="pytest-shutdown-probe-")
    proc = context.Process(  # type: ignore[attr-defined]
        target=_probe_main, args=(target, args, kwargs, workdir), name="probe-exit", daemon=False
    )
    started = time.perf_counter()
    timed_out = False
    try:
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            timed_out = True
            _kill_tree(proc)
        duration = time.perf_counter() - started
        return ExitRecord(
            exitcode=proc.exitcode,
            gc_freeze_count=_read_int(os.path.join(workdir, "freeze")),
            duration_s=duration,
            stderr_tail=_tail(os.path.join(workdir, "stderr")),
            timed_out=timed_out,
            pid=proc.pid,
            start_method=context.get_start_method(),
            gc_freeze_count_at_start=_read_int(os.path.join(workdir, "freeze-start")),
        )
    finally:
        if proc.is_alive():  # interrupted (KeyboardInterrupt, an error above): still reap it
            _kill_tree(proc)
        if proc.exitcode is not None:
            proc.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - STDERR_TAIL_CHARS * 4))
            data = handle.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")[-STDERR_TAIL_CHARS:]


class ShutdownOutcomeLike(Protocol):
    """What :func:`assert_not_force_killed` reads from an engine's shutdown outcome record."""

    @property
    def force_killed(self) -> Sequence[str]: ...

    @property
    def timeout(self) -> float | None: ...

    @property
    def exitcodes(self) -> Mapping[str, int | None]: ...

    @property
    def duration_s(self) -> float | None: ...


def assert_not_force_killed(outcome: ShutdownOutcomeLike, *, expected: bool = False) -> CheckReport:
    """Require that no process had to be force-killed (``force-killed``), or, with
    ``expected=True``, that one was (a test of the kill path itself).

    ``outcome`` is duck-typed: any object with ``force_killed`` (process names), ``timeout``,
    ``exitcodes`` (name -> code) and ``duration_s``, such as the engine's ``ShutdownOutcome``.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    started = time.perf_counter()
    helper = "assert_not_force_killed"
    require_instance(helper, "outcome", outcome, "the outcome a shutdown returned")
    missing = [
        name
        for name in ("force_killed", "timeout", "exitcodes", "duration_s")
        if not hasattr(outcome, name)
    ]
    if missing:
        raise TypeError(
            f"{helper}: `outcome` ({type(outcome).__qualname__}) lacks {', '.join(missing)}; "
            "expected an object with force_killed, timeout, exitcodes and duration_s"
        )
    _check_outcome_shape(outcome)
    killed = list(outcome.force_killed)
    facts = {
        "force_killed": killed,
        "timeout": outcome.timeout,
        "exitcodes": dict(outcome.exitcodes),
        "duration_s": outcome.duration_s,
    }
    findings: list[Finding] = []
    alive = list(getattr(outcome, "alive", ()) or ())
    budget = f"{outcome.timeout!r}s shutdown budget"
    if alive:
        text = f"{', '.join(alive)} still running after the {budget}: neither exited nor killed."
        findings.append(Finding("process-leak", text, {**facts, "alive": alive}))
    if killed and not expected:
        text = f"{', '.join(killed)} had to be force-killed after the {budget} ran out."
        findings.append(Finding("force-killed", text, facts))
    elif expected and not killed:
        text = f"a force kill was expected but every process exited within the {budget}."
        findings.append(Finding("force-killed", text, {**facts, "expected": True}))
    raise_if_any(findings)
    return CheckReport(
        check="not-force-killed",
        subject=type(outcome).__qualname__,
        duration_s=time.perf_counter() - started,
        details=facts,
    )


def _number_or_none(value: object) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _names_of_processes(value: object) -> bool:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return False
    return all(isinstance(name, str) for name in list(value))


def _exit_codes(value: object) -> bool:
    if not isinstance(value, Mapping):
        return False
    return all(
        c is None or (isinstance(c, int) and not isinstance(c, bool)) for c in value.values()
    )


#: What each attribute of an outcome must be: a test, and the words for the error.
_OUTCOME_SHAPE: dict[str, tuple[Callable[[object], bool], str]] = {
    "force_killed": (_names_of_processes, "a list of process names (str)"),
    "timeout": (_number_or_none, "None or a number of seconds"),
    "exitcodes": (_exit_codes, "a mapping of process name to exit code (int or None)"),
    "duration_s": (_number_or_none, "a number of seconds (or None)"),
    "alive": (
        lambda v: v is None or _names_of_processes(v),
        "a list of process names (str), when present",
    ),
}


def _check_outcome_shape(outcome: object) -> None:
    """A user's outcome of the wrong shape: a ``TypeError`` naming each attribute, the type it
    has and the type it needs (not a confusing error further down)."""
    __tracebackhide__ = True  # the error points at the caller's line
    wrong = []
    for name, (ok, wanted) in _OUTCOME_SHAPE.items():
        if not hasattr(outcome, name):
            continue
        value = getattr(outcome, name)
        if not ok(value):
            wrong.append(
                f"outcome.{name} is {type(value).__name__} ({value!r:.80}); expected {wanted}"
            )
    if wrong:
        raise TypeError(f"{type(outcome).__qualname__}: " + "; ".join(wrong))


@dataclass(frozen=True)
class ProcessesOutcome:
    """What a shutdown that returns nothing did to its processes, read from the processes.

    The same fields as the reference engine's ``ShutdownOutcome``, so that
    :func:`assert_not_force_killed` reads either: ``force_killed`` names the processes that
    ended by ``SIGKILL``; ``exitcodes`` maps each name to its exit code (``None``: still alive
    when read, also listed in ``alive``); ``timeout`` is the budget the test gave;
    ``duration_s`` the time since ``started`` (``None`` when no ``started`` was given).
    """

    timeout: float | None
    exitcodes: Mapping[str, int | None]
    force_killed: Sequence[str]
    alive: Sequence[str]
    duration_s: float | None


def outcome_from_processes(
    procs: Sequence[Any],
    *,
    timeout: float | None,
    started: float | None = None,
    reap_s: float = KILL_DEADLINE_S,
) -> ProcessesOutcome:
    """Build the outcome of ``shutdown(procs, timeout)`` from the processes themselves.

    For real managers whose shutdown returns ``None`` (vLLM's ``shutdown(procs, timeout)``)::

        started = time.monotonic()
        manager.shutdown(timeout=2.0)
        assert_not_force_killed(outcome_from_processes(manager.processes, timeout=2.0,
                                                       started=started))

    ``procs`` are ``multiprocessing`` processes (or anything with ``name``, ``exitcode`` and
    ``join``); a process that already ended but is not reaped yet is joined for up to
    ``reap_s`` seconds in total, so its exit code is read and not taken for "alive".
    ``started`` is a ``time.monotonic()`` reading taken before the shutdown; without it
    ``duration_s`` is ``None`` (unknown). Wrong argument types raise ``ValueError`` naming the
    argument.
    """
    if isinstance(procs, (str, bytes)) or not isinstance(procs, Sequence):
        raise ValueError(
            f"procs: {procs!r} is not a sequence of processes; accepted: a list of "
            "multiprocessing processes (objects with name, exitcode and join)"
        )
    for index, proc in enumerate(procs):
        missing = [name for name in ("name", "exitcode", "join") if not hasattr(proc, name)]
        if missing:
            raise ValueError(
                f"procs[{index}]: {proc!r} lacks {', '.join(missing)}; accepted: "
                "multiprocessing processes (objects with name, exitcode and join)"
            )
    if timeout is not None and not is_seconds(timeout, zero_ok=True):
        raise ValueError(f"timeout: {timeout!r}; accepted: None or a number of seconds >= 0")
    if started is not None and (
        isinstance(started, bool)
        or not isinstance(started, (int, float))
        or not (math.isfinite(started) and started <= time.monotonic())
    ):
        raise ValueError(
            f"started: {started!r}; accepted: a time.monotonic() reading taken before the shutdown"
        )
    duration = None if started is None else time.monotonic() - started
    deadline = time.monotonic() + reap_s
    exitcodes: dict[str, int | None] = {}
    for index, proc in enumerate(procs):
        if proc.exitcode is None:
            proc.join(max(0.0, deadline - time.monotonic()))
        name = str(proc.name)
        exitcodes[name if name not in exitcodes else f"{name}[{index}]"] = proc.exitcode
    return ProcessesOutcome(
        timeout=timeout,
        exitcodes=exitcodes,
        force_killed=[name for name, code in exitcodes.items() if code == -signal.SIGKILL],
        alive=[name for name, code in exitcodes.items() if code is None],
        duration_s=duration,
    )
