"""Where a thread, child process or shared-memory segment was created, recorded while the guard
is on.

:func:`install` wraps ``threading.Thread.start``, ``_thread.start_new_thread``,
``BaseProcess.start``, ``subprocess.Popen.__init__`` and ``SharedMemory.__init__``; each call
records a short stack (frame locations only, no source read) and the running test. Threads are
keyed weakly; processes by pid, with a weak reference to their object (what
:mod:`pytest_shutdown.ownership.owners` follows). :func:`render_origin` puts user frames first,
then the library frames that called ``start()`` (whose names name the pool).
"""

from __future__ import annotations

import functools
import linecache
import os
import subprocess
import sys
import threading
import time
import types
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, TypeVar

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown._os.forks import forget_in_child, undo_in_forked_child

T = TypeVar("T")

__all__ = [
    "Origin",
    "capture_here",
    "install",
    "looks_like",
    "origin_of",
    "origin_of_process",
    "origin_of_thread",
    "process_object",
    "python_thread_tid",
    "recorded_processes",
    "recorded_segment",
    "current_test",
    "imported_by",
    "set_current_test",
    "short_path",
    "start_site",
    "started_between_tests",
    "starter_of",
    "uninstall",
]

#: Frames walked per creation; frames kept: user frames, then library frames.
WALK_LIMIT = 40
USER_FRAMES = 5
LIBRARY_FRAMES = 3
#: Process origins kept (oldest dropped first).
PROCESS_LIMIT = 4096

_TOOL_PACKAGES = frozenset(
    {"_pytest", "pytest", "pluggy", "pytest_shutdown", "xdist", "execnet", "pytest_timeout"}
)
_THIS_FILE = os.path.normcase(os.path.realpath(__file__))


@lazy_dataclass(frozen=True)
class Origin:
    """Where and when a thread or process was started.

    ``frames``: ``(filename, lineno, qualified name, is_user)``, innermost first; ``test``: the
    node id of the test running then; ``what`` describes a process object.
    """

    frames: tuple[tuple[str, int, str, bool], ...]
    test: str | None
    what: str | None = None
    #: The starting thread when not the main one, and the test it was started in (``None``:
    #: before any test; ``"unknown"``: not recorded).
    starter: str | None = None
    starter_test: str | None = None
    #: The module being imported when it was created: what it made belongs to that import.
    imported: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "started_at": render_origin(self),
            "started_in": self.test,
            "what": self.what,
            "site": start_site(self),
        }


_current_test: str | None = None
_threads: weakref.WeakKeyDictionary[threading.Thread, Origin] = weakref.WeakKeyDictionary()
#: A thread started by another (non-main) thread -> that thread (weakly).
_starters: weakref.WeakKeyDictionary[threading.Thread, weakref.ref[threading.Thread]] = (
    weakref.WeakKeyDictionary()
)
_processes: OrderedDict[int, tuple[Callable[[], Any], Origin]] = OrderedDict()
#: ``native_id`` of the ``threading.Thread`` objects started while recording (bounded): a joined
#: thread's task can still be listed a moment after ``join()``, when ``threading`` forgot it.
_python_tids: dict[int, None] = {}
PYTHON_TID_LIMIT = 4096
#: Kernel thread id of a ``_thread.start_new_thread`` thread -> a weak reference to what it
#: runs for (an execnet gateway's receiver thread is its gateway's).
_native_runs: OrderedDict[int, Any] = OrderedDict()
#: The last ids in start order, and how many were started: what a move of ``ns_last_pid`` is
#: made of when nothing else was created (``resources.primitives.descendant_pids``).
_recent_tids: deque[int] = deque(maxlen=64)
_tids_started = 0
_originals: dict[str, Any] = {}
_installs = 0
_is_library_cache: dict[str, bool] = {}
_is_tool_cache: dict[str, bool] = {}


def set_current_test(nodeid: str | None) -> None:
    """Tell the recorder which test runs now."""
    global _current_test
    _current_test = nodeid


def current_test() -> str | None:
    return _current_test


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """Where ``os`` was loaded from (importing ``sysconfig`` took 10 ms)."""
    where = getattr(os, "__file__", None)
    if where:
        return (os.path.normcase(os.path.realpath(os.path.dirname(where))) + os.sep,)
    import sysconfig  # noqa: PLC0415 - an interpreter that does not say where os lives

    paths = sysconfig.get_paths()
    folders = {paths["stdlib"], paths["platstdlib"]}
    return tuple(os.path.normcase(os.path.realpath(p)) + os.sep for p in folders)


def _is_library(filename: str) -> bool:
    cached = _is_library_cache.get(filename)
    if cached is None:
        if filename.startswith("<"):
            cached = filename.startswith("<frozen")
        else:
            path = os.path.normcase(os.path.realpath(filename))
            cached = path.startswith(_library_dirs()) and "site-packages" not in path
        _is_library_cache[filename] = cached
    return cached


def is_tool_file(filename: str) -> bool:
    """Whether ``filename`` belongs to pytest, pluggy, xdist, pytest-timeout or this plugin."""
    cached = _is_tool_cache.get(filename)
    if cached is None:
        parts = filename.replace("\\", "/").split("/")
        cached = any(part in _TOOL_PACKAGES for part in parts[:-1])
        _is_tool_cache[filename] = cached
    return cached


_THIS, _TOOL, _LIBRARY, _USER = range(4)
#: code filename -> which of the four it is.
_frame_kinds: dict[str, int] = {}


def _frame_kind(filename: str) -> int:
    if os.path.normcase(filename) == _THIS_FILE:
        return _THIS
    if is_tool_file(filename):
        return _TOOL
    return _LIBRARY if _is_library(filename) else _USER


def capture_here() -> Origin:
    """The creation site of what the caller's caller is doing now."""
    return _capture(depth=3)


def _capture(what: str | None = None, depth: int = 2) -> Origin:
    frame: types.FrameType | None = sys._getframe(depth)  # the caller of the wrapped start()
    user: list[tuple[str, int, str, bool]] = []
    library: list[tuple[str, int, str, bool]] = []
    imported: str | None = None
    walked = 0
    while frame is not None and walked < WALK_LIMIT and len(user) < USER_FRAMES:
        code = frame.f_code
        filename = code.co_filename
        where = _frame_kinds.get(filename)
        if where is None:
            where = _frame_kinds[filename] = _frame_kind(filename)
        if where == _TOOL:
            if user:
                frame = None  # the tools' frames above the test: no one's, no import
                break
        elif where == _LIBRARY:
            if not user and len(library) < LIBRARY_FRAMES:
                name = _qualname(frame)
                library.append((filename, frame.f_lineno, name, False))
        elif where == _USER:
            name = _qualname(frame)
            user.append((filename, frame.f_lineno, name, True))
        if imported is None and code.co_name == "<module>":
            imported = _module_being_imported(frame)
        frame = frame.f_back
        walked += 1
    if imported is None and frame is not None:  # the user frames ran out first
        imported = _importing(frame, WALK_LIMIT - walked, seen_user=bool(user))
    if what is not None:  # name the pool: the innermost method that started the process
        starter = next((f[2] for f in library + user if "." in f[2]), None)
        if starter is not None and not starter.endswith(".start"):
            what += f", started by {starter}"
    starter = starter_test = None
    current = threading.current_thread()
    if current is not threading.main_thread():
        try:
            starter = str(current.name)
        except Exception:  # noqa: BLE001 - a subclass's hostile name
            starter = "?"
        started = _threads.get(current)
        starter_test = started.test if started is not None else "unknown"
    return Origin(tuple(user + library), _current_test, what, starter, starter_test, imported)


def _module_being_imported(frame: types.FrameType) -> str | None:
    """The module whose top-level code ``frame`` runs under the import machinery (importlib,
    or a loader's ``exec_module``: pytest's rewriter); None for ``exec``, ``-c``, ``runpy``."""
    back = frame.f_back
    if back is None:
        return None
    code = back.f_code
    if not (code.co_filename.startswith("<frozen importlib") or code.co_name == "exec_module"):
        return None
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) and name != "__main__" else None


def _importing(
    frame: types.FrameType | None, limit: int = WALK_LIMIT, *, seen_user: bool = False
) -> str | None:
    """The innermost module being imported on the stack from ``frame`` outwards."""
    while frame is not None and limit > 0:
        code = frame.f_code
        if code.co_name == "<module>":
            found = _module_being_imported(frame)
            if found is not None:
                return found
        filename = code.co_filename
        where = _frame_kinds.get(filename)
        if where is None:
            where = _frame_kinds[filename] = _frame_kind(filename)
        if where == _TOOL and seen_user:
            return None
        seen_user = seen_user or where == _USER
        frame = frame.f_back
        limit -= 1
    return None


def _qualname(frame: types.FrameType) -> str:
    """The frame's function as ``Class.method`` (``co_qualname`` from Python 3.11; before, from
    the class of its ``self`` or ``cls`` argument)."""
    code = frame.f_code
    qualname: str | None = getattr(code, "co_qualname", None)
    if qualname is not None:
        return qualname
    if code.co_argcount and code.co_varnames[0] in ("self", "cls"):
        first = frame.f_locals.get(code.co_varnames[0])
        owner = first if isinstance(first, type) else type(first)
        if first is not None:
            return f"{owner.__qualname__}.{code.co_name}"
    return code.co_name


def render_origin(origin: Origin) -> str:
    """The creation site as text, user frames first (source lines read now, not at start)."""
    lines = []
    for filename, lineno, name, is_user in origin.frames:
        source = linecache.getline(filename, lineno).strip()
        mark = "" if is_user else " (library)"
        lines.append(f'File "{filename}", line {lineno}, in {name}{mark}')
        if source:
            lines.append(f"  {source}")
    if origin.starter is not None:
        if origin.starter_test == origin.test and origin.test is not None:
            when = "in the same test"
        elif origin.starter_test in (None, "unknown"):
            when = "before this test: the test did not start it"
        else:
            when = f"in {origin.starter_test}: the test did not start it"
        lines.append(f"(from thread {origin.starter!r}, itself started {when})")
    return "\n".join(lines)


def start_site(origin: Origin) -> str | None:
    """The call that started or created it, as a user reads it: ``Engine.__init__ at
    engine.py:16`` (the innermost user frame, else the innermost one; a path under the current
    folder relative to it)."""
    frame = next((f for f in origin.frames if f[3]), origin.frames[0] if origin.frames else None)
    if frame is None:
        return None
    filename, lineno, name, _ = frame
    return f"{name} at {short_path(filename)}:{lineno}"


def short_path(filename: str) -> str:
    """``filename`` relative to the current folder when it lies under it."""
    try:
        here = os.getcwd() + os.sep
    except OSError:  # the current folder was removed
        return filename
    return filename[len(here) :] if filename.startswith(here) else filename


def _describe_process(process: Any) -> str:
    target = getattr(process, "_target", None)
    target_name = getattr(target, "__qualname__", None) or repr(target)
    module = getattr(target, "__module__", None)
    if module and target is not None:
        target_name = f"{module}.{target_name}"
    return f"{type(process).__name__} {getattr(process, 'name', '?')!r}, target {target_name}"


def recorded_processes(test: str | None = None) -> dict[int, float]:
    """pid -> wall-clock start of the processes recorded while ``test`` (None: any) ran."""
    return {
        pid: _started_wall.get(pid, 0.0)
        for pid, (_, origin) in _processes.items()
        if test is None or origin.test == test
    }


#: pid -> when its ``start()``/``Popen()`` call began: before the fork, so never later than
#: anything it starts (taken after the call, a busy machine recorded a child later than its
#: grandchild, and ``containment.first_ancestor`` matched nothing).
_started_wall: dict[int, float] = {}


def _remember_process(pid: int | None, obj: Any, origin: Origin, called_at: float) -> None:
    if not isinstance(pid, int):
        return
    _started_wall[pid] = called_at
    try:
        ref: Callable[[], Any] = weakref.ref(obj)
    except TypeError:  # pragma: no cover - not weak-referenceable
        ref = lambda: None  # noqa: E731
    _processes[pid] = (ref, origin)
    _processes.move_to_end(pid)
    while len(_processes) > PROCESS_LIMIT:
        dropped, _ = _processes.popitem(last=False)
        _started_wall.pop(dropped, None)


def install() -> None:
    """Start recording (nested calls are counted). ``multiprocessing`` is not imported for
    this (2.6 ms a session): it is wrapped when first imported."""
    global _installs
    _installs += 1
    if _originals or _process_start_pending:
        return
    thread_start = threading.Thread.start
    popen_init = subprocess.Popen.__init__

    def start(self: threading.Thread, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the user's traceback is as without the plugin
        try:
            _threads[self] = _capture()
            current = threading.current_thread()
            if current is not threading.main_thread():
                _starters[self] = weakref.ref(current)
        except Exception:  # pragma: no cover - recording must never break a start
            pass
        result = thread_start(self, *args, **kwargs)
        tid = getattr(self, "native_id", None)  # set before start() returns
        if tid is not None:
            _python_tids[tid] = None
            if len(_python_tids) > PYTHON_TID_LIMIT:
                del _python_tids[next(iter(_python_tids))]
            _recent_tids.append(tid)
            global _tids_started
            _tids_started += 1
        return result

    def popen(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True  # the user's traceback is as without the plugin
        origin = None
        called_at = time.time()
        try:
            origin = _capture()
        except Exception:  # pragma: no cover
            pass
        popen_init(self, *args, **kwargs)
        if origin is not None:
            _remember_process(getattr(self, "pid", None), self, origin, called_at)

    _originals.update({"thread": (thread_start, start), "popen": (popen_init, popen)})
    looks_like(start, thread_start)
    looks_like(popen, popen_init)
    threading.Thread.start = start  # type: ignore[method-assign]
    subprocess.Popen.__init__ = popen  # type: ignore[method-assign]
    _wrap_start_new_thread()
    for module_name, wrap in ((_PROCESS_MODULE, _wrap_process_start), (_SHM_MODULE, _wrap_shm)):
        loaded = sys.modules.get(module_name)
        if loaded is not None:
            wrap(loaded)
        else:
            waiting = _AfterImport(module_name, wrap)
            _process_start_pending.append(waiting)
            sys.meta_path.insert(0, waiting)
    undo_in_forked_child("origins", _uninstall_in_forked_child)


def looks_like(wrapper: T, original: Any) -> T:
    """``wrapper`` with ``original``'s name, module and doc, and ``__wrapped__``: what reads it
    (``inspect.signature(subprocess.Popen)`` for a parameter, pickle) sees the original."""
    functools.update_wrapper(wrapper, original)  # type: ignore[arg-type]
    return wrapper


def _wrap_start_new_thread() -> None:
    """Record what each ``_thread.start_new_thread`` thread runs (not ``threading``'s)."""
    import _thread  # noqa: PLC0415

    original = _thread.start_new_thread

    def start_new_thread(function: Any, args: Any, kwargs: Any = None) -> int:
        __tracebackhide__ = True  # the user's traceback is as without the plugin
        ran = _weak_run(function)
        if ran is None:
            return original(function, args) if kwargs is None else original(function, args, kwargs)
        try:
            importing = _importing(sys._getframe(1))
            if importing is not None:
                _remember_import(ran, importing)
        except Exception:  # noqa: BLE001, S110 - recording must never break a start
            pass

        def run(*a: Any, **k: Any) -> Any:
            _native_runs[threading.get_native_id()] = ran
            while len(_native_runs) > PYTHON_TID_LIMIT:
                _native_runs.popitem(last=False)
            return function(*a, **k)

        return original(run, args, kwargs or {})

    _originals["start_new_thread"] = (original, start_new_thread)
    _thread.start_new_thread = looks_like(start_new_thread, original)


def _weak_run(function: Any) -> Any:
    """A weakref to a Python method's object or function; None for a built-in's method."""
    if isinstance(function, types.MethodType):
        candidate = function.__self__
    elif isinstance(function, types.FunctionType):
        candidate = function
    else:
        return None
    try:
        return weakref.ref(candidate)
    except TypeError:
        return None


#: id of what a thread started during an import runs for -> (weakref, module), newest last.
_imported_runs: OrderedDict[int, tuple[Any, str]] = OrderedDict()


def _remember_import(ref: Any, module: str) -> None:
    obj = ref()
    if obj is None:
        return
    _imported_runs[id(obj)] = (ref, module)
    _imported_runs.move_to_end(id(obj))
    while len(_imported_runs) > PYTHON_TID_LIMIT:
        _imported_runs.popitem(last=False)


def imported_by(obj: object) -> str | None:
    """The module whose import created ``obj`` (of what is recorded here); None otherwise."""
    origin = origin_of(obj)
    if origin is None:
        shm = sys.modules.get(_SHM_MODULE)
        kind = getattr(shm, "SharedMemory", None)
        if kind is not None and issubclass(type(obj), kind):
            name = str(getattr(obj, "_name", "") or "").lstrip("/")
            entry = _segments.get(name)
            if entry is not None and entry[0]() is obj:
                origin = entry[1]
    if origin is not None:
        return origin.imported
    run = _imported_runs.get(id(obj))
    if run is not None and run[0]() is obj:
        return run[1]
    return None


def native_thread_runs(tid: int) -> object | None:
    """What the ``_thread.start_new_thread`` thread ``tid`` runs for."""
    ref = _native_runs.get(tid)
    return ref() if ref is not None else None


_PROCESS_MODULE = "multiprocessing.process"
#: The meta path entries waiting for a module.
_process_start_pending: list[_AfterImport] = []


def _wrap_process_start(module: Any) -> None:
    if not _installs or "process" in _originals:
        return
    _stop_waiting_for_import(_PROCESS_MODULE)
    process_start = module.BaseProcess.start

    def start_process(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the user's traceback is as without the plugin
        origin = None
        called_at = time.time()
        try:
            origin = _capture(_describe_process(self))
        except Exception:  # pragma: no cover
            pass
        result = process_start(self, *args, **kwargs)
        if origin is not None:
            pid = getattr(getattr(self, "_popen", None), "pid", None)
            _remember_process(pid, self, origin, called_at)
        return result

    _originals["process"] = (process_start, start_process)
    module.BaseProcess.start = looks_like(start_process, process_start)


def _stop_waiting_for_import(name: str | None = None) -> None:
    """Take the entries waiting for ``name`` (all when None) out of the meta path."""
    for waiting in list(_process_start_pending):
        if name is None or waiting.name == name:
            if waiting in sys.meta_path:
                sys.meta_path.remove(waiting)
            _process_start_pending.remove(waiting)


_SHM_MODULE = "multiprocessing.shared_memory"
SEGMENT_LIMIT = 4096
#: segment name -> (weakref to its ``SharedMemory`` object, where, the creating pid).
_segments: OrderedDict[str, tuple[Callable[[], Any], Origin, int]] = OrderedDict()
#: The claims this process wrote (see :func:`segment_claim`).
_claims: list[str] = []
#: A claim older than its segment's change time by this much is of an earlier segment.
CLAIM_SLACK_S = 0.05
_SHM_DIR = "/dev/shm"


def claims_dir() -> str:
    """Where each recording process claims its segments (a file per name holding its pid): an
    xdist worker tells its own descendants' segments from another process's by them."""
    import tempfile  # noqa: PLC0415

    return os.path.join(tempfile.gettempdir(), f"pytest-shutdown-shm-{os.getuid()}")


def segment_claim(name: str) -> int | None:
    """The pid of the recording process that claimed segment ``name`` (the one there now)."""
    path = os.path.join(claims_dir(), name)
    try:
        with open(path, encoding="ascii") as f:
            pid = int(f.read().strip() or "0") or None
            claimed = os.fstat(f.fileno()).st_mtime
        if claimed < os.stat(os.path.join(_SHM_DIR, name)).st_ctime - CLAIM_SLACK_S:
            return None
        return pid
    except (OSError, ValueError):
        return None


def _claim(name: str) -> None:
    folder = claims_dir()
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, name)
        with open(path, "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
        _claims.append(path)
    except OSError:
        pass


def _drop_claims() -> None:
    """Remove this process's claims, but for segments left behind: another xdist worker must
    still tell them from its own descendants' once this one has ended."""
    for path in _claims:
        if os.path.exists(os.path.join(_SHM_DIR, os.path.basename(path))):
            continue
        try:
            os.unlink(path)
        except OSError:
            pass
    _claims.clear()


def _wrap_shm(module: Any) -> None:
    if not _installs or "shm" in _originals:
        return
    _stop_waiting_for_import(_SHM_MODULE)
    init = module.SharedMemory.__init__

    def shm_init(self: Any, *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True  # the user's traceback is as without the plugin
        create = kwargs.get("create", args[1] if len(args) > 1 else False)
        origin = None
        if create:
            try:
                origin = _capture()
            except Exception:  # pragma: no cover - recording must never break a creation
                pass
        init(self, *args, **kwargs)
        if origin is None:
            return
        name = str(getattr(self, "_name", "") or "").lstrip("/")
        if not name:
            return
        try:
            ref: Callable[[], Any] = weakref.ref(self)
        except TypeError:  # pragma: no cover
            ref = lambda: None  # noqa: E731
        _segments[name] = (ref, origin, os.getpid())
        _segments.move_to_end(name)
        while len(_segments) > SEGMENT_LIMIT:
            _segments.popitem(last=False)
        _claim(name)

    _originals["shm"] = (init, shm_init)
    module.SharedMemory.__init__ = looks_like(shm_init, init)


def recorded_segment(name: str) -> tuple[object | None, Origin, int] | None:
    """``(the live SharedMemory or None, origin, creating pid)``; None when not recorded."""
    entry = _segments.get(name)
    if entry is None:
        return None
    return entry[0](), entry[1], entry[2]


class _AfterImport:
    """A ``sys.meta_path`` entry: ``then(module)`` right after ``name`` is first imported."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        import importlib.util  # noqa: PLC0415 - loaded by pytest already

        if self in sys.meta_path:
            sys.meta_path.remove(self)  # the real finders find it; no recursion into this one
        spec = importlib.util.find_spec(fullname)
        loader: Any = getattr(spec, "loader", None)
        if spec is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        then = self.then

        def exec_then(module: Any) -> None:
            exec_module(module)
            try:
                then(module)
            except Exception:  # noqa: BLE001, S110 - recording must never break an import
                pass

        loader.exec_module = exec_then  # this spec's own loader instance only
        return spec


def _uninstall_in_forked_child() -> None:
    global _installs, _current_test
    _installs = 1
    _current_test = None
    _processes.clear()  # the parent's children are not this child's
    _segments.clear()
    _claims.clear()  # the parent's claims are the parent's to remove
    uninstall()


def uninstall() -> None:
    """Put the originals back with the last nested call (where nobody replaced ours)."""
    global _installs
    _installs = max(_installs - 1, 0)
    if _installs:
        return
    _stop_waiting_for_import()
    import _thread  # noqa: PLC0415

    places: dict[str, tuple[Any, str]] = {
        "thread": (threading.Thread, "start"),
        "popen": (subprocess.Popen, "__init__"),
        "start_new_thread": (_thread, "start_new_thread"),  # type: ignore[dict-item]
    }
    loaded = sys.modules.get(_PROCESS_MODULE)
    if loaded is not None:
        places["process"] = (loaded.BaseProcess, "start")
    shm = sys.modules.get(_SHM_MODULE)
    if shm is not None:
        places["shm"] = (shm.SharedMemory, "__init__")
    for key, (original, wrapper) in list(_originals.items()):
        if key not in places:
            continue
        owner, attr = places[key]
        if owner.__dict__.get(attr) is wrapper:
            setattr(owner, attr, original)
    _originals.clear()
    _drop_claims()
    forget_in_child("origins")


def origin_of_thread(thread: threading.Thread) -> Origin | None:
    return _threads.get(thread)


def started_between_tests(origin: Origin | None) -> bool:
    """Whether a recorded start happened while no test ran."""
    return origin is not None and origin.test is None


def threads_started() -> int:
    """How many ``threading.Thread`` objects were started while recording."""
    return _tids_started


def tids_started_since(count: int) -> list[int] | None:
    """The ids of the threads started since :func:`threads_started` was ``count``; None when
    more were started than kept."""
    new = _tids_started - count
    if new < 0 or new > len(_recent_tids):
        return None
    return [_recent_tids[i] for i in range(-new, 0)]  # the deque's ends: O(1) each


def python_thread_tid(tid: int) -> bool:
    """Whether ``tid`` was a recorded ``threading.Thread``'s (maybe one just joined)."""
    return tid in _python_tids


def starter_of(thread: threading.Thread) -> threading.Thread | None:
    """The thread (not the main thread) that started ``thread``, while it is alive."""
    ref = _starters.get(thread)
    return ref() if ref is not None else None


def origin_of_process(pid: int) -> Origin | None:
    entry = _processes.get(pid)
    return entry[1] if entry is not None else None


def origin_of(obj: object) -> Origin | None:
    """The recorded creation site of a Thread, Popen or Process object, if any."""
    kind = type(obj)  # never a user's __class__
    if issubclass(kind, threading.Thread):
        return _threads.get(obj)  # type: ignore[call-overload]
    if issubclass(kind, subprocess.Popen):
        pid = getattr(obj, "pid", None)
    else:
        base = getattr(sys.modules.get(_PROCESS_MODULE), "BaseProcess", None)
        if base is None or not issubclass(kind, base):
            return None
        pid = getattr(getattr(obj, "_popen", None), "pid", None)
    entry = _processes.get(pid) if isinstance(pid, int) else None
    if entry is None or entry[0]() is not obj:
        return None
    return entry[1]


def process_object(pid: int) -> Any:
    """The live Process or Popen object of ``pid``, if any."""
    entry = _processes.get(pid)
    if entry is not None:
        obj = entry[0]()
        if obj is not None:
            return obj
    loaded = sys.modules.get("multiprocessing.process")
    for process in list(getattr(loaded, "_children", ()) or ()):
        if getattr(getattr(process, "_popen", None), "pid", None) == pid:
            return process
    return None
