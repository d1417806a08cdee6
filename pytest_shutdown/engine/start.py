"""How engine processes are started: the multiprocessing start method.

``EngineConfig.start_method`` is one of:

* ``"forkserver"`` (the default): a fork server is started once per parent process with torch
  and the engine's process module preloaded; each engine process is then a fork of that server
  (about 15 ms here, against 1.3-2.3 s for ``spawn``, which imports torch again in every child).
  The fork server only *imports* torch: importing torch never initialises CUDA, and nothing in
  the preloaded modules touches a device at import, so every child can still initialise its
  own CUDA/HIP context. The server is single-threaded, so forking it is safe.
* ``"spawn"``: a fresh interpreter per process; slowest, but needs nothing from the parent.
* ``"fork"``: a fork of the calling process. Fast, but refused (:func:`engine_context`, with the
  reason) when CUDA is initialised or fork-poisoned in the parent, or the engine runs on a ROCm
  GPU; a forked engine process runs torch with one intra-op thread, since the OpenMP pool of a
  parent that did CPU torch work does not survive the fork (see :mod:`pytest_shutdown.gpu.forking`).

The fork server preloads the parent's main script only when it is pytest's own entry point:
any other script could touch the GPU at module level (``torch.cuda.is_available()``) and leave
every engine process of the server unable to use it. Another main script is imported again in
each engine process (as ``__mp_main__``, as with ``spawn``), where touching the GPU is harmless.

Once its modules are imported, the fork server collects and freezes its heap (``gc.freeze()``,
the CPython recommendation before forking): a forked engine then never traverses the ~170,000
objects of torch in a collection, nor copies their pages by writing to their GC headers, and
EngineCore's start-up ``gc.collect()`` (100-150 ms in such a child) is skipped because the heap
is already frozen. ``heap_frozen_by_fork_server`` tells a fork of the server that the freeze it
inherited is not its own (the engine process releases it when its cleanup is done).

The fork server and multiprocessing's resource tracker are helper processes of the parent that
live until it exits (both end by themselves when it does); ``helper_process_pids`` names them so
that leak checks can leave them out.
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
from pytest_shutdown.gpu.forking import check_fork_allowed

if TYPE_CHECKING:
    from pytest_shutdown.engine.config import EngineConfig

#: Modules the fork server imports once, so that forked engine processes start warm. First the
#: parent's main script, as multiprocessing's own default does: otherwise every engine process
#: re-runs it (as ``__mp_main__``) with all it imports, e.g. pytest under the ``pytest`` console
#: script. The last one is this module: imported by the fork server, it freezes the server's heap.
FORKSERVER_PRELOAD = (
    "__main__",
    "torch",
    "pytest_shutdown.engine.core_proc",
    "pytest_shutdown.engine.processes",
    __name__,
)
#: Main scripts known to do nothing at import but define their entry point: pytest's own.
SAFE_MAIN_SCRIPTS = frozenset({"pytest", "py.test", "pytest.exe", "py.test.exe"})

_preload_lock = threading.Lock()
_preload_set = False
#: In a fork server that froze its heap (and in every fork of it): the server's pid.
_fork_server_pid: int | None = None


def mp_context(start_method: str) -> BaseContext:
    """The multiprocessing context for ``start_method`` (forkserver: with torch preloaded)."""
    if start_method not in START_METHODS:
        raise ValueError(
            f"start_method: unknown value {start_method!r}; accepted: {', '.join(START_METHODS)}"
        )
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        global _preload_set
        with _preload_lock:
            if not _preload_set:
                # Only takes effect if this process's fork server is not running yet.
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
    """Whether PR_SET_PDEATHSIG in a child started now would fire exactly when its parent dies.

    The kernel signals when the *forking thread* exits: with the fork server that is the server's
    main thread (it lives as long as the parent); with spawn/fork it is the calling thread, which
    is only safe when that is the main thread.
    """
    return start_method == "forkserver" or threading.current_thread() is threading.main_thread()


def helper_process_pids() -> set[int]:
    """Pids of this process's fork server and resource tracker, when they are running."""
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
    """Make ``proc``'s exit-status polling safe when several threads join/poll it.

    CPython's ``Popen.poll`` is not thread-safe: under the fork server two threads that see the
    sentinel ready both read the 4-byte exit status and the loser records 255; under fork/spawn
    the loser of two ``waitpid`` calls gets ECHILD and the process looks alive forever. The
    manager's monitor thread and the caller's thread both join engine processes, so every poll
    goes through one lock per process. Call it right after ``proc.start()``.
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
    """True in a fork of a fork server that froze its heap: the freeze is the server's."""
    return _fork_server_pid is not None and _fork_server_pid != os.getpid()


def _imported_by_fork_server() -> bool:
    """Whether this import is the fork server's preload (``multiprocessing.forkserver.main``)."""
    try:
        from multiprocessing import forkserver  # noqa: PLC0415
    except ImportError:  # pragma: no cover - platforms without fork server
        return False
    server_main = getattr(getattr(forkserver, "main", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is server_main:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _freeze_fork_server_heap() -> None:
    """Collect, then freeze the preloaded heap, so that its forks share it untouched."""
    global _fork_server_pid
    gc.collect()
    gc.freeze()
    _fork_server_pid = os.getpid()


if _imported_by_fork_server():
    _freeze_fork_server_heap()
