"""``assert_no_collateral``: a shutdown must not kill processes it does not own.

SGLang's ``Engine.shutdown()`` ends with ``kill_process_tree(os.getpid(), include_parent=False)``:
every descendant of the calling process dies (TensorRT-LLM once killed the whole pytest session
this way). The helper runs the shutdown beside three bystanders and names each that died.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pytest_shutdown._base.arguments import require_callable
from pytest_shutdown.findings.finding import Finding, ShutdownContractError
from pytest_shutdown.resources.collateral import signal_name
from pytest_shutdown.resources.primitives import process_running

__all__ = ["SENTINEL_START_TIMEOUT_S", "SETTLE_S", "assert_no_collateral"]

T = TypeVar("T")

#: Seconds the sentinels may take to start (a spawn child imports the interpreter afresh).
SENTINEL_START_TIMEOUT_S = 60.0
#: Seconds the helper keeps watching after the shutdown returned (a kill lands asynchronously).
SETTLE_S = 0.5
#: Seconds the clean-up waits for each sentinel.
CLEANUP_TIMEOUT_S = 10.0

_SLEEP = "import time\nfor _ in range(6000): time.sleep(0.1)"
_MIDDLE = (
    "import subprocess, sys\n"
    f"child = subprocess.Popen([sys.executable, '-c', {_SLEEP!r}])\n"
    "print(child.pid, flush=True)\n"
    "code = child.wait()\n"
    "sys.exit(128 - code if code < 0 else code)\n"
)


def _ended_how(code: int | None) -> str | None:
    if code is None:
        return None
    return f"killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"


@dataclass
class _Sentinels:
    plain: subprocess.Popen[bytes] | None = None
    mp_child: Any = None
    middle: subprocess.Popen[bytes] | None = None
    grandchild: int | None = None
    died: dict[str, dict[str, Any]] = field(default_factory=dict)

    def start(self) -> None:
        self.plain = subprocess.Popen([sys.executable, "-c", _SLEEP])
        context = multiprocessing.get_context("spawn")
        self.mp_child = context.Process(
            target=time.sleep, args=(600,), name="collateral-sentinel", daemon=True
        )
        self.mp_child.start()
        self.middle = subprocess.Popen(
            [sys.executable, "-c", _MIDDLE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        self.grandchild = _read_pid(self.middle, SENTINEL_START_TIMEOUT_S)

    def look(self, final: bool = False) -> None:
        """Record the sentinels that ended (each once).

        A dead grandchild is recorded once its waiting parent has told how it died (the parent
        reaps it a moment later); only the last look records it without that, as ``ended``.
        """
        if self.plain is not None and "plain child" not in self.died:
            how = _ended_how(self.plain.poll())
            if how:
                self.died["plain child"] = {"pid": self.plain.pid, "how": how}
        if self.mp_child is not None and "multiprocessing child" not in self.died:
            if not self.mp_child.is_alive():
                how = _ended_how(self.mp_child.exitcode) or "ended"
                self.died["multiprocessing child"] = {"pid": self.mp_child.pid, "how": how}
        if self.middle is not None and self.grandchild is not None:
            if "grandchild" not in self.died and not process_running(self.grandchild):
                code = self.middle.poll()
                if code is None and not final:
                    return
                how = "ended"
                if code is not None and code > 128:
                    how = f"killed by {signal_name(code - 128)}"
                elif code is not None and code < 0:
                    how = f"killed (its parent too, by {signal_name(-code)})"
                self.died["grandchild"] = {"pid": self.grandchild, "how": how}

    def cleanup(self) -> None:
        if self.grandchild is not None and process_running(self.grandchild):
            with contextlib.suppress(OSError):
                os.kill(self.grandchild, signal.SIGKILL)
        for proc in (self.plain, self.middle):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL did not land
                    proc.wait(CLEANUP_TIMEOUT_S)
                if proc.stdout is not None:
                    proc.stdout.close()
        if self.mp_child is not None:
            if self.mp_child.is_alive():
                self.mp_child.kill()
            self.mp_child.join(CLEANUP_TIMEOUT_S)
            if not self.mp_child.is_alive():
                self.mp_child.close()


def _read_pid(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    import selectors  # noqa: PLC0415

    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return None
    line = proc.stdout.readline().strip()
    return int(line) if line.isdigit() else None


def assert_no_collateral(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` (an engine's shutdown) while three bystander processes run;
    fail with ``collateral-kill`` naming each one that died. Returns what ``fn`` returned.

    The bystanders: a plain child (``subprocess.Popen``), a ``multiprocessing`` child (spawn)
    and a grandchild. They are started before ``fn`` is called, watched for :data:`SETTLE_S`
    seconds after it returns, then killed and reaped with deadlines. When ``fn`` raises, its
    exception propagates unchanged (after the clean-up) and nothing is checked.

    Example::

        engine = Engine(...)
        assert_no_collateral(engine.shutdown)
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    require_callable("assert_no_collateral", "fn", fn, "the function to run: engine.shutdown")
    sentinels = _Sentinels()
    try:
        sentinels.start()
        result = fn(*args, **kwargs)
        deadline = time.monotonic() + SETTLE_S
        while True:
            out_of_time = time.monotonic() >= deadline
            sentinels.look(final=out_of_time)
            if len(sentinels.died) == 3 or out_of_time:  # all three dead, or time is up
                break
            time.sleep(0.02)
    finally:
        sentinels.cleanup()
    if sentinels.died:
        name = getattr(fn, "__qualname__", None) or repr(fn)
        described = ", ".join(
            f"{label} (pid {info['pid']}, {info['how']})" for label, info in sentinels.died.items()
        )
        raise ShutdownContractError(
            [
                Finding(
                    "collateral-kill",
                    f"{name}() killed processes it does not own: {described}.",
                    {
                        "victims": [
                            {"sentinel": label, **info} for label, info in sentinels.died.items()
                        ],
                        "call": name,
                    },
                )
            ]
        )
    return result
