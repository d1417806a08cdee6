"""Async engines for the coroutine-method helper tests: the correct ``aclose`` and its bugs.

Each owns what an asyncio front end owns (an output-handler task, a cache standing for its
sockets) and closes it in ``async def aclose``; ``awaited`` counts the closes that ran to the end,
so a test sees that every call's coroutine was awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import weakref
from typing import Any

from shutdown_subjects import Cache


class AsyncEngine:
    """The correct pattern: a closed flag, the handler cancelled and awaited, the cache closed once
    (through its finalizer, which also runs on collection)."""

    def __init__(self) -> None:
        self.cache = Cache(strict=True)
        self._finalizer = weakref.finalize(self, self.cache.close)
        self._handler: asyncio.Task[None] | None = None
        self._closed = False
        self.awaited = 0

    async def start(self) -> None:
        self._handler = asyncio.get_running_loop().create_task(self._output_handler())

    async def _output_handler(self) -> None:
        while True:
            await asyncio.sleep(0.01)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._handler is not None:
                self._handler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._handler
            await asyncio.sleep(0)
            self._finalizer()
        self.awaited += 1


class ReFreesAsyncEngine(AsyncEngine):
    """No closed flag: every ``aclose`` closes the cache again (a lenient cache: no error)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = Cache(strict=False)
        self._finalizer.detach()

    async def aclose(self) -> None:
        await asyncio.sleep(0)
        self.cache.close()
        self.awaited += 1


class RaisesAsyncEngine(ReFreesAsyncEngine):
    """No closed flag and a strict cache: the second ``aclose`` raises."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = Cache(strict=True)


class AsyncCloseNoFinalizer:
    """Closes its cache on ``aclose`` but has no finalizer: collection leaves the cache open."""

    def __init__(self) -> None:
        self.cache = Cache()

    async def aclose(self) -> None:
        await asyncio.sleep(0)
        self.cache.close()


class ReturnsAwaitable:
    """``shutdown`` is a plain method that returns a coroutine (``return self._aclose()``)."""

    def __init__(self) -> None:
        self.cache = Cache()
        self._closed = False
        self.awaited = 0

    def shutdown(self) -> Any:
        return self._aclose()

    async def _aclose(self) -> None:
        await asyncio.sleep(0)
        if not self._closed:
            self._closed = True
            self.cache.close()
        self.awaited += 1


class SleepsInAclose:
    """Bug: a synchronous ``time.sleep`` inside ``async def aclose`` blocks the event loop."""

    def __init__(self, seconds: float = 0.5) -> None:
        self.seconds = seconds

    async def aclose(self) -> None:
        await asyncio.sleep(0)
        time.sleep(self.seconds)  # the blocking line the finding must name


class JoinsInAclose:
    """Bug: ``aclose`` joins a worker thread without awaiting (``join()`` on the loop thread)."""

    def __init__(self, seconds: float = 0.5) -> None:
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._run, args=(seconds,), daemon=True)
        self._worker.start()

    def _run(self, seconds: float) -> None:
        self._stop.wait(10)
        time.sleep(seconds)  # a slow drain after the stop

    async def aclose(self) -> None:
        self._stop.set()
        self._worker.join(10)  # the blocking line: should be await asyncio.to_thread(...)


class RecvsInAclose:
    """Bug: ``aclose`` waits for the peer's goodbye with a blocking ``recv`` on the loop thread."""

    def __init__(self, seconds: float = 0.5) -> None:
        self.sock, self.peer = socket.socketpair()
        self.sock.settimeout(seconds)

    async def aclose(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.recv(1)  # the blocking line: the peer never answers
        self.sock.close()
        self.peer.close()


class BlocksUntilReleased:
    """Bug: ``aclose`` waits on a ``threading.Event`` on the loop thread, for as long as it takes
    (the test releases it once the helper gave up)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def aclose(self) -> None:
        self.release.wait(30)  # the blocking line


class AwaitsInAclose:
    """Correct, if slow: ``aclose`` awaits for a while without blocking the loop."""

    def __init__(self, seconds: float = 0.5) -> None:
        self.seconds = seconds
        self.awaited = 0

    async def aclose(self) -> None:
        await asyncio.sleep(self.seconds)
        self.awaited += 1


class NeverCloses:
    """Bug: ``aclose`` awaits an event nobody sets."""

    async def aclose(self) -> None:
        await asyncio.Event().wait()


class AsyncSession:
    """A sub-resource whose ``close`` is itself a coroutine that suspends (an HTTP session)."""

    def __init__(self) -> None:
        self.closed = 0

    async def close(self) -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.closed += 1


class ClosesAsyncSession:
    """Correct: ``aclose`` awaits its session's async ``close`` once, on the first call."""

    def __init__(self) -> None:
        self.session = AsyncSession()
        self._closed = False

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self.session.close()


class ReclosesAsyncSession(ClosesAsyncSession):
    """Bug: every ``aclose`` awaits the session's ``close`` again."""

    async def aclose(self) -> None:
        await self.session.close()
