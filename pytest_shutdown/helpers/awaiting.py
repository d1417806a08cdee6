"""Coroutine shutdown methods in the sync helpers: validate the subject, await what a call returns.

Light on purpose: :mod:`asyncio` is imported only when a shutdown method turns out to be a
coroutine, so the sync helpers that import this module stay as cheap as they were.

A helper awaits a coroutine shutdown (``aclose``, an ``async def shutdown``) on one of two loops:

* **dispatched** to the caller's running loop: the ``*_async`` variants of
  :mod:`pytest_shutdown.helpers.async_shutdown` run the sync helper on a worker thread
  (:func:`run_on_worker`) and every awaitable a shutdown call returns is run on the caller's loop
  (:func:`awaiting`), charged to the round that made the call: the profile hook that counts
  cleanups is carried onto the loop thread for as long as the awaitable runs;
* **fresh**, when a sync helper is called with no running loop
  (:func:`check_in_fresh_loop`): the helper's ``*_async`` variant is run by a new loop in the
  calling thread (``asyncio.run``'s steps), so that every call of one check is awaited on the
  same loop.

A sync helper called from a thread whose loop is running cannot do either: that is a usage error
(:func:`require_no_running_loop`), which names the ``await ..._async(...)`` to write instead.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_shutdown.findings.finding import ShutdownContractError

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

#: How long one awaited shutdown call may take before the helper stops waiting for it.
CALL_DEADLINE_S = 60.0
#: How long the worker thread of an ``*_async`` helper may take to end after its result is in.
WORKER_JOIN_S = 5.0

#: The caller's loop, on the worker thread of an ``*_async`` helper (unset elsewhere).
_DISPATCH: contextvars.ContextVar[asyncio.AbstractEventLoop | None] = contextvars.ContextVar(
    "pytest_shutdown_dispatch_loop", default=None
)


def is_coroutine_method(obj: object, method: str) -> bool:
    """``obj.<method>`` is an ``async def`` (a coroutine function, possibly wrapped)."""
    bound = getattr(obj, method, None)
    if bound is None:
        return False
    target = inspect.unwrap(bound) if callable(bound) else bound
    return inspect.iscoroutinefunction(bound) or inspect.iscoroutinefunction(target)


def dispatch_loop() -> asyncio.AbstractEventLoop | None:
    """The caller's loop when this thread runs a sync helper for an ``*_async`` one."""
    return _DISPATCH.get()


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop running in this thread, if any (without importing asyncio when nobody did)."""
    if "asyncio" not in sys.modules:
        return None
    import asyncio  # noqa: PLC0415 - only once someone imported it

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def require_no_running_loop(helper: str, method: str) -> None:
    """A sync helper cannot await on a loop that is running in its own thread: say what to write."""
    if running_loop() is not None:
        raise RuntimeError(
            f"method: {method!r} is a coroutine method and this thread is running an event loop "
            f"(an async test), where {helper}() cannot await it; write "
            f"`await {helper}_async(...)` instead"
        )


def check_in_fresh_loop(check: Callable[..., T], obj: object, method: str, **options: Any) -> T:
    """The sync helper ``check`` on a coroutine method, with no loop running here: run on a
    worker thread (:func:`checked_on_worker`) whose calls are awaited on a new loop in this
    thread, one loop for every call of the check, closed after it with ``asyncio.run``'s steps
    (cancel what is left, finalize async generators, close)."""
    __tracebackhide__ = True  # a failure points at the caller's line
    require_no_running_loop(getattr(check, "__name__", "the helper"), method)
    import asyncio  # noqa: PLC0415 - a coroutine method: asyncio is needed now

    return asyncio.run(checked_on_worker(check, obj, method, **options))


class Awaiting:
    """A shutdown method that the sync helpers call; what the call returns is awaited.

    ``call()`` calls the method; a result that is awaitable (a coroutine method's coroutine, a
    future) is awaited on the dispatch loop when this thread works for an ``*_async`` helper, else
    on a new loop (no loop may be running in this thread then). A call is awaited every time, the
    second call's result too. An await that does not finish within ``deadline`` seconds is
    cancelled and raises ``TimeoutError`` (the helper reports it as the call raising).
    """

    def __init__(self, bound: Callable[[], Any], name: str, deadline: float = CALL_DEADLINE_S):
        self.bound: Callable[[], Any] | None = bound
        self.name = name
        self.deadline = deadline

    def __call__(self) -> Any:
        bound = self.bound
        if bound is None:
            raise RuntimeError(f"{self.name}() was released")
        result = bound()
        del bound
        if not inspect.isawaitable(result):
            return result
        return await_here(result, self.name, self.deadline)

    def release(self) -> None:
        """Drop the bound method (and with it the object)."""
        self.bound = None


def awaiting(obj: object, method: str, helper: str) -> Awaiting:
    """``Awaiting(getattr(obj, method))``; a coroutine method called by the sync ``helper`` from a
    running loop's thread is a usage error, raised here (at once, before any call)."""
    if is_coroutine_method(obj, method) and dispatch_loop() is None:
        require_no_running_loop(helper, method)
    return Awaiting(getattr(obj, method), method)


def await_here(awaitable: Awaitable[T], name: str, deadline: float = CALL_DEADLINE_S) -> T:
    """Await ``awaitable`` from sync code: on the dispatch loop, else on a new loop."""
    import asyncio  # noqa: PLC0415 - an awaitable exists, so asyncio is loaded already

    loop = dispatch_loop()
    if loop is None:
        if running_loop() is not None:
            close = getattr(awaitable, "close", None)
            if callable(close):
                close()  # never awaited: no "coroutine was never awaited" warning from the helper
            raise RuntimeError(
                f"{name}() returned an awaitable in a thread whose event loop is running; "
                "use the *_async helper (pytest_shutdown.helpers.async_shutdown)"
            )
        return asyncio.run(asyncio.wait_for(awaitable, deadline))
    future = asyncio.run_coroutine_threadsafe(_charged(awaitable, sys.getprofile()), loop)
    try:
        return future.result(timeout=deadline)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"{name}() did not complete within {deadline:g}s") from None


#: Per loop thread: how many charged awaitables run, and the profile hook to restore after them.
_CHARGED: dict[int, list[Any]] = {}


async def _charged(awaitable: Awaitable[T], hook: Any) -> T:
    """Await ``awaitable`` with ``hook`` (the cleanup counter's profile hook of the calling
    round) installed on the loop thread, so that the cleanups it runs there are counted; racing
    calls share one installation, and the loop thread's own hook comes back after the last."""
    if hook is None:
        return await awaitable
    key = threading.get_ident()
    entry = _CHARGED.get(key)
    if entry is None:
        entry = _CHARGED[key] = [0, sys.getprofile()]
        sys.setprofile(hook)
    entry[0] += 1
    try:
        return await awaitable
    finally:
        entry[0] -= 1
        if entry[0] == 0:
            del _CHARGED[key]
            sys.setprofile(entry[1])


async def run_on_worker(func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run the sync helper ``func`` on a worker thread whose awaited shutdown calls are dispatched
    to the running loop (which stays free to run them); the thread is joined before returning."""
    import asyncio  # noqa: PLC0415 - called from a coroutine

    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        _DISPATCH.set(loop)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    worker = threading.Thread(target=work, name="pytest-shutdown-async-check", daemon=True)
    worker.start()
    try:
        return await done
    finally:
        worker.join(WORKER_JOIN_S)


async def checked_on_worker(
    check: Callable[..., T], obj: object, method: str, *args: Any, **kwargs: Any
) -> T:
    """:func:`run_on_worker` for ``check(obj, method, ...)``; its findings name the coroutine
    method that was awaited (``details["shutdown"]``, and the message)."""
    __tracebackhide__ = True  # a failure points at the caller's line
    try:
        return await run_on_worker(check, obj, method, *args, **kwargs)
    except ShutdownContractError as exc:
        raise naming_coroutine(exc, obj, method) from None


def naming_coroutine(exc: ShutdownContractError, obj: object, method: str) -> ShutdownContractError:
    """The findings of a coroutine method's check, each naming the coroutine that was awaited."""
    name = f"{type(obj).__qualname__}.{method}"
    findings = [
        replace(
            f,
            message=f"{f.message} (shutdown: await {name}())",
            details={**f.details, "shutdown": name},
        )
        for f in exc.findings
    ]
    return ShutdownContractError(findings)
