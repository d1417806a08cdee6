"""How engine processes are started: the multiprocessing start method.

* ``"forkserver"`` (the default): one fork server per parent, torch and the engine preloaded;
  each engine process is a fork of it (about 15 ms, against 1.3-2.3 s for ``spawn``). Importing
  torch initialises no device, so every child still creates its own CUDA/HIP context. The server
  preloads the main script only when it is pytest's: another could touch the GPU at import.
  Once preloaded it collects and freezes its heap: a fork then never traverses torch's ~170,000
  objects nor copies their pages, and EngineCore's start-up ``gc.collect()`` (100-150 ms) is
  skipped; ``heap_frozen_by_fork_server`` tells a fork that the freeze is not its own.
  It also ignores SIGTERM (its forks restore it): a signal to its process group must not kill it.
* ``"spawn"``: a fresh interpreter per process.
* ``"fork"``: refused (:func:`engine_context`) where it breaks; see
  :mod:`pytest_shutdown.gpu.forking`.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, cast

from pytest_shutdown.engine.config import START_METHODS
from pytest_shutdown.engine.fork_server_shield import imported_by_fork_server
from pytest_shutdown.gpu.forking import check_fork_allowed

if TYPE_CHECKING:
    from pytest_shutdown.engine.config import EngineConfig

#: The main script first, as multiprocessing's default (or every engine process re-runs it as
#: ``__mp_main__``); then the SIGTERM shield; this module last: imported by the fork server, it
#: freezes the server's heap.
FORKSERVER_PRELOAD = (
    "__main__",
    "pytest_shutdown.engine.fork_server_shield",  # before torch's second of importing
    "torch",
    "pytest_shutdown.engine.core_proc",
    "pytest_shutdown.engine.processes",
    __name__,
)
SAFE_MAIN_SCRIPTS = frozenset({"pytest", "py.test", "pytest.exe", "py.test.exe"})

_preload_lock = threading.Lock()
_preload_set = False
_fork_server_pid: int | None = None


def mp_context(start_method: str) -> BaseContext:
    if start_method not in START_METHODS:
        raise ValueError(
            f"start_method: unknown value {start_method!r}; accepted: {', '.join(START_METHODS)}"
        )
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        global _preload_set
        with _preload_lock:
            if not _preload_set:
                ctx.set_forkserver_preload(forkserver_preload())  # type: ignore[attr-defined]
                _preload_set = True
    return ctx


def forkserver_preload(main: object = None) -> list[str]:
    """:data:`FORKSERVER_PRELOAD`, without ``__main__`` unless the main script is pytest's own."""
    if main is None:
        main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    keep_main = path is None or os.path.basename(str(path)) in SAFE_MAIN_SCRIPTS
    return [m for m in FORKSERVER_PRELOAD if keep_main or m != "__main__"]


def engine_context(config: EngineConfig) -> BaseContext:
    """The context engine processes of ``config`` start with; ``fork`` refused where it breaks."""
    check_fork_allowed(config.start_method, config.resolved_platform, config.device)
    return mp_context(config.start_method)


def pdeathsig_safe(start_method: str) -> bool:
    """Whether PR_SET_PDEATHSIG in a child started now fires exactly when its parent dies: the
    kernel signals when the *forking thread* exits (the fork server's main thread lives as long
    as the parent; with spawn/fork, only the main thread does)."""
    return start_method == "forkserver" or threading.current_thread() is threading.main_thread()


def helper_process_pids() -> set[int]:
    """Pids of this process's fork server and resource tracker, when they are running.

    Both live until this process exits (and end by themselves then): leak checks leave them out.
    """
    pids: set[int] = set()
    try:
        from multiprocessing import forkserver, resource_tracker  # noqa: PLC0415

        for owner, attr in (
            (forkserver._forkserver, "_forkserver_pid"),  # type: ignore[attr-defined]
            (resource_tracker._resource_tracker, "_pid"),  # type: ignore[attr-defined]
        ):
            pid = getattr(owner, attr, None)
            if isinstance(pid, int):
                pids.add(pid)
    except (ImportError, AttributeError):
        pass
    return pids


def serialize_exit_polling(proc: BaseProcess) -> BaseProcess:
    """One lock per process around ``Popen.poll`` (call right after ``proc.start()``).

    CPython's ``poll`` is not thread-safe: under the fork server the loser of two threads reads
    exit status 255; under fork/spawn it gets ECHILD and the process looks alive forever.
    """
    popen = getattr(proc, "_popen", None)
    if popen is None or getattr(popen, "_pytest_shutdown_serialized", False):
        return proc
    lock = threading.Lock()
    original = popen.poll

    def poll(flag: int = os.WNOHANG) -> int | None:
        with lock:
            return cast("int | None", original(flag))

    popen.poll = poll
    popen._pytest_shutdown_serialized = True
    return proc


def heap_frozen_by_fork_server() -> bool:
    return _fork_server_pid is not None and _fork_server_pid != os.getpid()


def _freeze_fork_server_heap() -> None:
    global _fork_server_pid
    gc.collect()
    gc.freeze()
    _fork_server_pid = os.getpid()


if imported_by_fork_server():
    _freeze_fork_server_heap()
