"""asyncio's loops, tasks and async generators, and unawaited coroutines, recorded as they appear.

While recording is on (:func:`install`, counted: the guard's ``asyncio`` kind and
:func:`pytest_shutdown.helpers.tasks.no_task_leaks` each hold it), a few methods of
``asyncio.BaseEventLoop`` and two module functions are wrapped. Each wrapper calls the original
first or last and only *records* (a counter, a weak reference, the call site): what the code
under test sees (return values, exceptions, the warnings it gets) is unchanged:

* ``BaseEventLoop.__init__``: a loop was created (``asyncio.new_event_loop``, ``asyncio.run``,
  ``asyncio.Runner``, pytest-asyncio's and anyio's runners all go through it);
* ``BaseEventLoop.close``: the loop was closed by a ``close()`` call (not by its ``__del__``);
* ``BaseEventLoop.create_task``: a task was created (``asyncio.create_task``,
  ``ensure_future``, ``TaskGroup.create_task``, ``run_until_complete`` all call it): its
  coroutine and the first frames of the call site;
* ``BaseEventLoop._asyncgen_firstiter_hook`` / ``_asyncgen_finalizer_hook``: an async generator
  was first iterated on the loop / was collected, and whether its loop was already closed then
  (its ``aclose()`` can never run: asyncio raises "Event loop is closed" in the collector);
* ``BaseEventLoop.call_exception_handler``: asyncio's "Task was destroyed but it is pending!"
  (a task collected while pending: nothing will ever run or cancel it);
* ``asyncio.runners._cancel_all_tasks``: a runner (``asyncio.run``, ``Runner.close``, the
  pytest-asyncio and anyio loop fixtures) is about to cancel the tasks still pending on its
  loop: those tasks were left for the runner to cancel;
* ``warnings._warn_unawaited_coroutine``: CPython's "coroutine ... was never awaited" (the
  warning itself is then issued by the original's code, under the user's filters, at the
  location it always has: see :func:`_wrap_warnings`).

**Creation sites.** A task's site is the call site of ``create_task`` (the first frames outside
asyncio itself), read from ``sys._getframe`` when the task is made: a walk over a few frames,
a few microseconds per task, only where tasks are made. Not chosen:
``sys.set_coroutine_origin_tracking_depth`` (it makes every coroutine creation in the thread
slower and changes ``cr_origin``, which the code under test can read); asyncio's debug mode
(``_source_traceback``: it changes the loop's behaviour, slow-callback logging among it);
``Task.get_coro().cr_frame`` alone (where the task waits now, not where it came from: it is
reported beside the site).

**Cost.** :func:`seq` is one integer read: the kind's fingerprint. asyncio is never imported
here: when it is not loaded yet, the wrappers are installed right after its first import (a
``sys.meta_path`` entry waits for it, as :mod:`pytest_shutdown.ownership.origins` waits for
``multiprocessing``). A forked child gets the originals back.

Not seen: loops that are not ``BaseEventLoop`` subclasses (uvloop's), tasks made by calling
``asyncio.Task(...)`` directly, loops and tasks made before recording started.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.lazy_wrappers import LazyWrappers

__all__ = [
    "Entry",
    "entries_since",
    "events_since",
    "install",
    "main_thread_ident",
    "seq",
    "uninstall",
]

#: Frames kept of a creation site (outwards from the call, asyncio's own frames skipped).
SITE_FRAMES = 6
#: Frames walked at most for one site.
SITE_WALK = 24
#: Events kept (the oldest dropped first): a long suite makes many.
EVENT_LIMIT = 4096
#: Entries of live objects kept at most (the oldest dropped first).
LIVE_LIMIT = 100_000

#: Coroutines of the test runners themselves: the anyio pytest plugin's runner task lives as long
#: as its runner and is cancelled by the runner's close, by design.
TOOL_COROUTINES = frozenset({"TestRunner._run_tests_and_fixtures"})


class Entry:
    """One recorded loop, task or async generator (``ref`` is a weak reference to it), or one
    event (``event`` says which; ``ref`` is None or the object's entry's)."""

    __slots__ = (
        "what", "seq", "ref", "name", "site", "test", "thread", "loop_seq", "closed",
        "event", "event_seq", "detail", "__weakref__",
    )  # fmt: skip

    def __init__(
        self,
        what: str,
        seq: int,
        ref: Any,
        name: str,
        site: tuple[tuple[str, int, str], ...],
        test: str | None,
        thread: int,
        loop_seq: int = 0,
    ) -> None:
        self.what = what
        self.seq = seq
        self.ref = ref
        self.name = name
        self.site = site
        self.test = test
        self.thread = thread
        self.loop_seq = loop_seq
        #: loops: closed by a ``close()`` call
        self.closed = False
        #: events: "cancelled-by-runner", "destroyed-pending", "collected-unclosed",
        #: "finalized-after-close", "never-awaited"
        self.event: str | None = None
        self.event_seq = seq
        #: events: what the event adds (the runner, the coroutine's definition ...)
        self.detail: dict[str, Any] = {}

    def describe(self) -> str:
        """What the long-lived list says of it."""
        return f"asyncio {self.what} {self.name}"

    def obj(self) -> Any:
        return self.ref() if self.ref is not None else None

    def __repr__(self) -> str:
        return f"<asyncio {self.event or self.what} {self.name!r} #{self.seq}>"


_seq = 0
#: seq -> entry of each live loop, task and async generator, in creation order.
_live: dict[int, Entry] = {}
#: The events, in the order they happened.
_events: deque[Entry] = deque(maxlen=EVENT_LIMIT)
#: loop -> its entry (loops are hashed by identity).
_loops: weakref.WeakKeyDictionary[Any, Entry] = weakref.WeakKeyDictionary()
#: task -> its entry
_tasks: weakref.WeakKeyDictionary[Any, Entry] = weakref.WeakKeyDictionary()
#: async generator -> its entry
_agens: weakref.WeakKeyDictionary[Any, Entry] = weakref.WeakKeyDictionary()
#: id -> entry of the async generators and tasks being collected (until their finalizer hook
#: or ``__del__`` ran; the last ones only)
_dying: dict[int, Entry] = {}
DYING_LIMIT = 256
#: seq of a task -> how it ended without its own code ending it (a runner's cancellation, a
#: collection while pending)
ended_by: dict[int, str] = {}
#: The thread that started recording (pytest's): the thread tests run in.
_main_ident = threading.main_thread().ident or 0
_ASYNCIO_DIR = ""


def seq() -> int:
    """The number of loops, tasks, async generators and events recorded so far: one read."""
    return _seq


def main_thread_ident() -> int:
    return _main_ident


def _next() -> int:
    global _seq
    _seq += 1
    return _seq


def _site(depth: int) -> tuple[tuple[str, int, str], ...]:
    """The first frames outside asyncio (and this module) from ``depth`` outwards."""
    frames: list[tuple[str, int, str]] = []
    try:
        frame: Any = sys._getframe(depth)
    except ValueError:
        return ()
    walked = 0
    while frame is not None and walked < SITE_WALK and len(frames) < SITE_FRAMES:
        code = frame.f_code
        filename = code.co_filename
        if not (_ASYNCIO_DIR and filename.startswith(_ASYNCIO_DIR)) and filename != __file__:
            frames.append((filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)))
        frame = frame.f_back
        walked += 1
    return tuple(frames)


def _forget(key: int, ident: int) -> Any:
    def drop(_ref: Any) -> None:
        entry = _live.pop(key, None)
        if entry is None:
            return
        if entry.what == "loop" and not entry.closed:
            _event(entry, "collected-unclosed")
        elif entry.what in ("asyncgen", "task"):  # its finalizer hook, or the task's
            _dying[ident] = entry  # __del__, may run after this (a collection of a cycle clears
            while len(_dying) > DYING_LIMIT:  # the weak references first): they look here
                _dying.pop(next(iter(_dying)))

    return drop


def _remember(what: str, obj: Any, name: str, depth: int, loop_seq: int = 0) -> Entry:
    number = _next()
    try:
        ref: Any = weakref.ref(obj, _forget(number, id(obj)))
    except TypeError:  # pragma: no cover - not weakly referenceable
        ref = None
    entry = Entry(
        what, number, ref, name, _site(depth), origins.current_test(), threading.get_ident(),
        loop_seq,
    )  # fmt: skip
    _live[number] = entry
    if len(_live) > LIVE_LIMIT:
        _live.pop(next(iter(_live)))
    return entry


def _event(entry: Entry, event: str, **detail: Any) -> Entry:
    """Record ``event`` of ``entry``'s object (a copy of the entry, with the event's seq)."""
    copy = Entry(
        entry.what, entry.seq, None, entry.name, entry.site, entry.test, entry.thread,
        entry.loop_seq,
    )  # fmt: skip
    copy.event = event
    copy.event_seq = _next()
    copy.detail = dict(detail, event_test=origins.current_test())
    _events.append(copy)
    if entry.seq and event in ("cancelled-by-runner", "destroyed-pending"):
        ended_by[entry.seq] = event  # the task is done now, but not by its own code
        while len(ended_by) > EVENT_LIMIT:
            ended_by.pop(next(iter(ended_by)))
    return copy


def entries_since(start: int) -> Iterator[Entry]:
    """The live entries recorded after ``start``, newest first."""
    for number in reversed(list(_live)):
        if number <= start:
            return
        entry = _live.get(number)
        if entry is not None:
            yield entry


def events_since(start: int) -> list[Entry]:
    """The events recorded after ``start``, oldest first."""
    found = []
    for event in reversed(_events):
        if event.event_seq <= start:
            break
        found.append(event)
    found.reverse()
    return found


def coroutine_name(coro: Any) -> str:
    code = getattr(coro, "cr_code", None) or getattr(coro, "ag_code", None)
    name = getattr(coro, "__qualname__", None) or getattr(code, "co_qualname", None)
    frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
    module = getattr(frame, "f_globals", {}).get("__name__")
    name = str(name or type(coro).__name__)
    return f"{module}.{name}" if module and module != "__main__" else name


def _closed_by_del() -> bool:
    frame: Any = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


# --- the wrappers ---------------------------------------------------------------------------


def _wrap_asyncio(asyncio: Any) -> None:
    global _ASYNCIO_DIR
    ready = hasattr(asyncio, "runners")  # False: still being imported, in another thread
    if not _wrappers.installs or _wrappers.wrapped("loop_init") or not ready:
        return
    import os  # noqa: PLC0415 - loaded

    _ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep
    base = asyncio.base_events.BaseEventLoop
    init, close, create_task = base.__init__, base.close, base.create_task
    firstiter, finalizer = base._asyncgen_firstiter_hook, base._asyncgen_finalizer_hook

    def loop_init(self: Any, *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True  # (each wrapper's: the user's traceback is as without it)
        init(self, *args, **kwargs)
        try:
            _loops[self] = _remember("loop", self, type(self).__qualname__, 2)
        except Exception:  # noqa: BLE001 - recording never breaks the code under test
            pass

    def loop_close(self: Any) -> None:
        __tracebackhide__ = True
        try:
            entry = _loops.get(self)
            if entry is not None and not _closed_by_del():
                entry.closed = True
        except Exception:  # noqa: BLE001
            pass
        close(self)

    def loop_create_task(self: Any, coro: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        task = create_task(self, coro, *args, **kwargs)
        try:
            _without_our_frames(task)
            loop = _loops.get(self)
            _tasks[task] = _remember("task", task, coroutine_name(coro), 2, loop.seq if loop else 0)
        except Exception:  # noqa: BLE001
            pass
        return task

    def agen_firstiter(self: Any, agen: Any) -> None:
        __tracebackhide__ = True
        try:
            loop = _loops.get(self)
            _agens[agen] = _remember(
                "asyncgen", agen, coroutine_name(agen), 2, loop.seq if loop else 0
            )
        except Exception:  # noqa: BLE001
            pass
        return firstiter(self, agen)  # type: ignore[no-any-return]

    def agen_finalizer(self: Any, agen: Any) -> None:
        __tracebackhide__ = True
        try:
            if self.is_closed():
                entry = _agens.get(agen) or _dying.pop(id(agen), None)
                if entry is None:
                    entry = Entry("asyncgen", 0, None, coroutine_name(agen), (), None, 0)
                _event(entry, "finalized-after-close", suspended_at=_frame_of(agen))
        except Exception:  # noqa: BLE001
            pass
        return finalizer(self, agen)  # type: ignore[no-any-return]

    handler = base.call_exception_handler

    def call_exception_handler(self: Any, context: Any) -> None:
        __tracebackhide__ = True
        try:
            _destroyed_pending(context)
        except Exception:  # noqa: BLE001
            pass
        return handler(self, context)  # type: ignore[no-any-return]

    _wrappers.patch("loop_init", base, "__init__", loop_init)
    _wrappers.patch("handler", base, "call_exception_handler", call_exception_handler)
    _wrappers.patch("loop_close", base, "close", loop_close)
    _wrappers.patch("loop_create_task", base, "create_task", loop_create_task)
    _wrappers.patch("agen_firstiter", base, "_asyncgen_firstiter_hook", agen_firstiter)
    _wrappers.patch("agen_finalizer", base, "_asyncgen_finalizer_hook", agen_finalizer)
    # asyncio's runner, and the backport pytest-asyncio runs its loops with on Python 3.10
    for key, module in (("cancel_all", "asyncio.runners"), ("cancel_all_3_10", _BACKPORT)):
        runners = sys.modules.get(module)
        cancel_all = getattr(runners, "_cancel_all_tasks", None)
        if cancel_all is not None:
            _wrappers.patch(key, runners, "_cancel_all_tasks", _cancelling(asyncio, cancel_all))


#: ``asyncio.Runner`` backported to Python 3.10 (pytest-asyncio's loops there).
_BACKPORT = "backports.asyncio.runner.runner"


def _cancelling(asyncio: Any, cancel_all: Any) -> Any:
    def cancel_all_tasks(loop: Any) -> None:
        __tracebackhide__ = True
        try:
            if not _interrupted(asyncio, sys.exc_info()[1]):
                _left_for_the_runner(asyncio, loop)
        except Exception:  # noqa: BLE001
            pass
        return cancel_all(loop)  # type: ignore[no-any-return]

    return cancel_all_tasks


def _interrupted(asyncio: Any, propagating: BaseException | None) -> bool:
    """Whether the runner closes because its run was interrupted: a ``BaseException`` that is
    not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``, pytest's ``skip``/``fail``)
    raised out of the loop and propagates through the runner's close (``asyncio.run`` and
    ``Runner.__exit__``). What is pending then (the main task, the task groups' children) was
    cut short by it, not left by the code for the runner to cancel. A ``CancelledError`` is no
    interruption: the main task was cancelled, and what it started and left pending is left."""
    return (
        propagating is not None
        and not isinstance(propagating, Exception)
        and not isinstance(propagating, asyncio.CancelledError)
    )


def _without_our_frames(task: Any) -> None:
    """In asyncio's debug mode a task keeps the stack it was created from
    (``_source_traceback``, shown in "Task was destroyed but it is pending!" and in unretrieved
    exceptions' logs): the wrappers' frames are taken out of it, as if there were none."""
    stack = getattr(task, "_source_traceback", None)
    if stack and any(frame.filename == __file__ for frame in stack):
        stack[:] = [frame for frame in stack if frame.filename != __file__]


def _destroyed_pending(context: Any) -> None:
    """asyncio's "Task was destroyed but it is pending!" (a pending task collected): record it
    (the task's entry when it is still found: a collection of a cycle clears weak references
    before the task's ``__del__`` runs)."""
    task = context.get("task") if isinstance(context, dict) else None
    if task is None or "destroyed but it is pending" not in str(context.get("message", "")):
        return
    entry = _entry_of_task(task) or _dying.pop(id(task), None)
    if entry is None:
        coro = task.get_coro()
        entry = Entry("task", 0, None, coroutine_name(coro), (), origins.current_test(), 0)
    if not _is_tool(entry):
        _event(entry, "destroyed-pending", waiting_at=_frame_of(task.get_coro()))


def _frame_of(obj: Any) -> str | None:
    frame = getattr(obj, "ag_frame", None) or getattr(obj, "cr_frame", None)
    if frame is None:
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _left_for_the_runner(asyncio: Any, loop: Any) -> None:
    """A runner is about to cancel what is still pending on ``loop``: record each recorded
    task of them (not the runners' own)."""
    runner = _site(3)
    for task in asyncio.all_tasks(loop):
        if task.done():
            continue
        entry = _entry_of_task(task)
        if entry is None or _is_tool(entry):
            continue
        _event(
            entry,
            "cancelled-by-runner",
            runner=f"{runner[0][0]}:{runner[0][1]} in {runner[0][2]}" if runner else None,
            waiting_at=_frame_of(task.get_coro()),
        )


def _is_tool(entry: Entry) -> bool:
    """The test runners' own tasks, and the loop's own: the ``aclose()`` of an async generator
    its finalizer hook scheduled (an ``async for`` left with ``break``)."""
    return entry.name == "async_generator_athrow" or any(
        entry.name.endswith(name) for name in TOOL_COROUTINES
    )


def _entry_of_task(task: Any) -> Entry | None:
    try:
        return _tasks.get(task)
    except TypeError:  # pragma: no cover - an unhashable task subclass
        return None


def _wrap_warnings() -> None:
    """Record CPython's "coroutine ... was never awaited" as it is warned.

    Not by a wrapper around ``warnings._warn_unawaited_coroutine``: the original warns with
    ``stacklevel=2``, and a wrapper's frame would then be the warning's location (its file,
    line and module: what the user's filters match, where pytest's summary points). Instead
    ``warnings._warn_unawaited_coroutine`` becomes a copy of the original function whose global
    ``warn`` is :func:`_warn_recording`, which records and warns one level further up."""
    import types  # noqa: PLC0415 - loaded
    import warnings  # noqa: PLC0415 - loaded

    original: Any = getattr(warnings, "_warn_unawaited_coroutine", None)
    code = getattr(original, "__code__", None)
    if code is None or "warn" not in code.co_names or _wrappers.wrapped("unawaited"):
        return  # (not the stdlib's Python function: not recorded, never wrapped)
    copy = types.FunctionType(
        original.__code__,
        {**original.__globals__, "warn": _warn_recording},
        original.__name__,
        original.__defaults__,
        original.__closure__,
    )
    copy.__kwdefaults__ = original.__kwdefaults__
    copy.__module__ = original.__module__
    _wrappers.patch("unawaited", warnings, "_warn_unawaited_coroutine", copy)


def _warn_recording(
    message: Any, category: Any = None, stacklevel: int = 1, source: Any = None
) -> None:
    """``warnings.warn`` as the copy of ``_warn_unawaited_coroutine`` calls it: records the
    coroutine (its ``source``), then warns with one more level for this frame, so that the
    warning points where the original's would."""
    __tracebackhide__ = True  # (raised by -W error)
    try:
        _record_never_awaited(source)
    except Exception:  # noqa: BLE001 - recording never breaks the code under test
        pass
    sys.modules["warnings"].warn(
        message, category=category, stacklevel=stacklevel + 1, source=source
    )


def _record_never_awaited(coro: Any) -> None:
    code = getattr(coro, "cr_code", None)
    # frames: _site, this one, _warn_recording, the copy of _warn_unawaited_coroutine, its caller
    entry = Entry("coroutine", 0, None, coroutine_name(coro), _site(4), origins.current_test(), 0)
    origin = getattr(coro, "cr_origin", None)
    _event(
        entry,
        "never-awaited",
        defined_at=f"{code.co_filename}:{code.co_firstlineno}" if code else None,
        created_at=[f"{f}:{line} in {fn}" for f, line, fn in origin] if origin else None,
    )


def _drop_records() -> None:
    _live.clear()
    _events.clear()


_wrappers = LazyWrappers("asyncio", _wrap_asyncio, _drop_records)


def install() -> None:
    """Start recording (nested calls are counted)."""
    _wrappers.install()
    if _wrappers.installs == 1:
        _wrap_warnings()


def uninstall() -> None:
    """Put the originals back with the last nested call (only where nobody replaced ours)."""
    _wrappers.uninstall()
