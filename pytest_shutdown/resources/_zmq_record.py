"""pyzmq's sockets, recorded as they are made, bound, connected and closed.

While recording is on (:func:`install`, counted: the guard's ``zmq`` kind holds it), four methods
of pyzmq's ``zmq.Socket`` (``zmq.sugar.socket.Socket``: every socket class, the ``zmq.asyncio``
ones included, derives from it) and ``zmq.Context.__init__`` and ``term`` are wrapped. Each
wrapper calls the original and only *records*: what the code under test sees (return values,
exceptions, the blocking of ``term()``) is unchanged:

* ``Context.__init__``: a context was made: the test and its creation site (a shadow, such as
  ``zmq.asyncio.Context(sync_ctx)``, is not: it stands for the context it shadows); its first
  socket then records the test that started it (libzmq starts a context's threads with its
  first socket);
* ``Socket.__init__``: a socket was made: its type (``PUSH``), its context (weakly), the test,
  and its creation site (the first frames outside pyzmq);
* ``Socket.bind`` / ``Socket.connect``: an endpoint (a bind's resolved one: ``tcp://*:0`` is
  recorded as the port it got, from ``LAST_ENDPOINT``);
* ``Socket.close``: the socket was closed, and with which linger (the ``linger`` argument, else
  the socket's ``LINGER`` option, read just before): a socket closed with a linger other than 0
  keeps ``Context.term()`` waiting for as long as it has unsent messages (vLLM PR #13298);
* ``Context.term`` (``destroy()`` and the context's ``__del__`` end in it): when a socket of the
  context is still open, or was closed with a linger other than 0 and can send, the bounded
  probe of :mod:`pytest_shutdown.resources._zmq_term_probe` watches the call.

**Cost.** :func:`seq` is one integer read (the kind's fingerprint): it moves only when a socket
is made or a probe reports. pyzmq is never imported here: when it is not loaded yet, the
wrappers are installed right after its first import (a ``sys.meta_path`` entry waits for it).
The record holds sockets and contexts weakly. A forked child gets the originals back.

Not seen: contexts and sockets made before recording started, sockets of other bindings than
pyzmq's ``zmq.Socket`` (a C extension's own libzmq sockets), and ``Socket.shadow`` copies (not
the socket's owner: they are left out).
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.lazy_wrappers import LazyWrappers

__all__ = [
    "ContextEntry",
    "Event",
    "SocketEntry",
    "call_site",
    "close_with_linger_zero",
    "context_entry",
    "events_since",
    "install",
    "installed",
    "open_sockets",
    "record_event",
    "seq",
    "sockets_of",
    "uninstall",
]

#: Frames kept of a creation site, and walked at most to find them.
SITE_FRAMES = 4
SITE_WALK = 24
#: Sockets kept at most (the oldest dropped first), and events.
LIVE_LIMIT = 100_000
EVENT_LIMIT = 1024
#: Socket types that never send a message of their own: closed with any linger, nothing of
#: theirs can keep ``term()`` waiting.
RECEIVE_ONLY = frozenset({"PULL", "SUB"})


def _where(site: tuple[tuple[str, int, str], ...]) -> str:
    if not site:
        return "an unknown site"
    filename, lineno, _ = site[0]
    return f"{filename}:{lineno}"


class SocketEntry:
    """One recorded socket (``ref``: a weak reference to it)."""

    __slots__ = (
        "seq", "ref", "kind", "endpoints", "bound", "site", "test", "context", "closed",
        "linger", "__weakref__",
    )  # fmt: skip

    def __init__(
        self, seq: int, ref: Any, kind: str, site: tuple[tuple[str, int, str], ...],
        test: str | None, context: Any,
    ) -> None:  # fmt: skip
        self.seq = seq
        self.ref = ref
        self.kind = kind
        self.endpoints: list[str] = []
        #: The endpoints among them it bound (the rest it connected to).
        self.bound: set[str] = set()
        self.site = site
        self.test = test
        #: A weak reference to the socket's context (None: it has none).
        self.context = context
        self.closed = False
        #: The linger it was closed with (ms; -1: forever), once closed.
        self.linger: int | None = None

    def obj(self) -> Any:
        return self.ref() if self.ref is not None else None

    def is_open(self) -> bool:
        sock = self.obj()
        return not self.closed and sock is not None and not getattr(sock, "closed", True)

    def may_linger(self) -> bool:
        """Closed with a linger other than 0, and of a type that sends."""
        return self.closed and self.linger != 0 and self.kind not in RECEIVE_ONLY

    def where(self) -> str:
        return _where(self.site)

    def describe(self) -> str:
        """``zmq socket PUSH tcp://127.0.0.1:5555 created at f.py:12``."""
        endpoints = " ".join(self.endpoints) or "(no endpoint)"
        return f"zmq socket {self.kind} {endpoints} created at {self.where()}"

    def state(self) -> str:
        if not self.closed:
            return "still open"
        linger = "forever" if self.linger is None or self.linger < 0 else f"{self.linger} ms"
        return f"closed with linger {self.linger}: it waits {linger} for its unsent messages"

    def facts(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "endpoints": list(self.endpoints),
            "created_at": self.where(),
            "created_in": self.test,
            "state": self.state(),
        }

    def __repr__(self) -> str:
        return f"<{self.describe()} #{self.seq}>"


class ContextEntry:
    """One recorded context: where and in which test it was made, and in which test its first
    socket started it (``started``: whether one did)."""

    __slots__ = ("site", "test", "started", "started_in", "kind", "__weakref__")

    def __init__(self, site: tuple[tuple[str, int, str], ...], test: str | None, kind: str) -> None:
        self.site = site
        self.test = test
        self.started = False
        self.started_in: str | None = None
        #: ``zmq.Context``, ``zmq.asyncio.Context``, ...
        self.kind = kind

    def where(self) -> str:
        return _where(self.site)

    def describe(self) -> str:
        """``zmq Context created at f.py:12``."""
        return f"zmq Context created at {self.where()}"

    def facts(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "created_at": self.where(),
            "created_in": self.test,
            "started_in": self.started_in,
        }

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


class Event:
    """One thing the record saw happen (a ``term()`` the probe found blocked)."""

    __slots__ = ("seq", "what", "test", "detail", "claimed")

    def __init__(self, seq: int, what: str, test: str | None, detail: dict[str, Any]) -> None:
        self.seq = seq
        self.what = what
        self.test = test
        self.detail = detail
        #: Reported by a helper (``no_os_leaks``) already: the guard does not report it again.
        self.claimed = False

    def __repr__(self) -> str:
        return f"<zmq {self.what} in {self.test} #{self.seq}>"


_seq = 0
_live: dict[int, SocketEntry] = {}
_sockets: weakref.WeakKeyDictionary[Any, SocketEntry] = weakref.WeakKeyDictionary()
_contexts: weakref.WeakKeyDictionary[Any, ContextEntry] = weakref.WeakKeyDictionary()
_events: deque[Event] = deque(maxlen=EVENT_LIMIT)
_lock = threading.Lock()
_ZMQ_DIR = ""
#: ``term_watcher(context, entries, term)``: how ``Context.term`` runs while sockets of its
#: context may keep it waiting (set by the probe's module; None: the original, unwatched).
term_watcher: Callable[[Any, list[SocketEntry], Callable[[], Any]], Any] | None = None


def seq() -> int:
    """The number of sockets and events recorded so far: one read."""
    return _seq


def installed() -> bool:
    return bool(_wrappers.installs)


def _next() -> int:
    global _seq
    with _lock:
        _seq += 1
        return _seq


#: The files of the recorder and its probe: never a site.
_OWN_PREFIX = __file__.rpartition("_zmq_record")[0] + "_zmq_"


def call_site() -> tuple[tuple[str, int, str], ...]:
    """The first frames outside pyzmq, the recorder and its probe."""
    frames: list[tuple[str, int, str]] = []
    frame: Any = sys._getframe(1)
    walked = 0
    while frame is not None and walked < SITE_WALK and len(frames) < SITE_FRAMES:
        code = frame.f_code
        filename = code.co_filename
        if not (_ZMQ_DIR and filename.startswith(_ZMQ_DIR)) and not filename.startswith(
            _OWN_PREFIX
        ):
            frames.append((filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)))
        frame = frame.f_back
        walked += 1
    return tuple(frames)


def record_event(what: str, test: str | None, **detail: Any) -> Event:
    event = Event(_next(), what, test, detail)
    _events.append(event)
    return event


def events_since(start: int) -> list[Event]:
    """The events recorded after ``start``, oldest first."""
    return [event for event in list(_events) if event.seq > start]


def sockets_of(context: Any) -> list[SocketEntry]:
    """The recorded sockets of ``context`` that were not closed, or may linger."""
    return [
        entry
        for entry in list(_live.values())
        if entry.context is not None
        and entry.context() is context
        and (entry.is_open() or entry.may_linger())
    ]


def close_with_linger_zero(sock: Any) -> None:
    """Close ``sock`` with linger 0 as a plain ``zmq.Socket`` (an asyncio socket's own close
    would touch its event loop from this thread)."""
    sys.modules["zmq.sugar.socket"].Socket.close(sock, linger=0)


def context_entry(context: Any) -> ContextEntry | None:
    """The record of ``context``, or of the context it shadows; None: made before recording."""
    for candidate in (context, getattr(context, "_shadow_obj", None)):
        try:
            entry = _contexts.get(candidate)
        except TypeError:  # None, an address: not weakly referenceable
            continue
        if entry is not None:
            return entry
    return None


def open_sockets() -> Iterator[SocketEntry]:
    """The recorded sockets still open, newest first."""
    for entry in reversed(list(_live.values())):
        if entry.is_open():
            yield entry


# --- the wrappers ---------------------------------------------------------------------------


def _entry(sock: Any) -> SocketEntry | None:
    try:
        return _sockets.get(sock)
    except TypeError:  # pragma: no cover - not weakly referenceable
        return None


def _made(sock: Any) -> None:
    if getattr(sock, "_shadow", False):
        return
    number = _next()
    context = getattr(sock, "context", None)
    entry = SocketEntry(
        number,
        weakref.ref(sock, lambda _ref: _live.pop(number, None)),
        str(getattr(sock, "_type_name", "?")),
        call_site(),
        origins.current_test(),
        weakref.ref(context) if context is not None else None,
    )
    _sockets[sock] = entry
    _live[number] = entry
    if len(_live) > LIVE_LIMIT:
        _live.pop(next(iter(_live)))
    started = context_entry(context) if context is not None else None
    if started is not None and not started.started:
        started.started, started.started_in = True, entry.test


def _context_made(context: Any) -> None:
    if getattr(context, "_shadow", False):
        return
    kind = type(context)
    name = f"{kind.__module__}.{kind.__qualname__}".replace(".sugar.context", "")
    _contexts[context] = ContextEntry(call_site(), origins.current_test(), name)


def _wrap_zmq(zmq: Any) -> None:
    global _ZMQ_DIR
    socket_class = getattr(getattr(zmq, "sugar", None), "socket", None)
    context_class = getattr(getattr(zmq, "sugar", None), "context", None)
    if not _wrappers.installs or _wrappers.wrapped("init"):
        return
    if socket_class is None or context_class is None:  # pragma: no cover - another pyzmq
        return
    import os  # noqa: PLC0415 - loaded

    _ZMQ_DIR = os.path.dirname(zmq.__file__) + os.sep
    base, context_base = socket_class.Socket, context_class.Context
    init, bind, connect, close = base.__init__, base.bind, base.connect, base.close
    context_init, term = context_base.__init__, context_base.term
    last_endpoint, linger_option = zmq.LAST_ENDPOINT, zmq.LINGER

    def socket_init(self: Any, *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True  # (each wrapper's: the user's traceback is as without it)
        init(self, *args, **kwargs)
        try:
            _made(self)
        except Exception:  # noqa: BLE001 - recording never breaks the code under test
            pass

    def socket_bind(self: Any, addr: Any) -> Any:
        __tracebackhide__ = True
        result = bind(self, addr)
        try:
            entry = _entry(self)
            if entry is not None:
                resolved = self.get(last_endpoint)
                endpoint = resolved.decode() if resolved else str(addr)
                entry.endpoints.append(endpoint)
                entry.bound.add(endpoint)
        except Exception:  # noqa: BLE001
            pass
        return result

    def socket_connect(self: Any, addr: Any) -> Any:
        __tracebackhide__ = True
        result = connect(self, addr)
        try:
            entry = _entry(self)
            if entry is not None:
                entry.endpoints.append(addr.decode() if isinstance(addr, bytes) else str(addr))
        except Exception:  # noqa: BLE001
            pass
        return result

    def socket_close(self: Any, linger: int | None = None) -> None:
        __tracebackhide__ = True
        try:
            entry = _entry(self)
            if entry is not None and not entry.closed and not self.closed:
                entry.closed = True
                entry.linger = linger if linger is not None else self.get(linger_option)
        except Exception:  # noqa: BLE001
            pass
        close(self, linger=linger)

    def context_made(self: Any, *args: Any, **kwargs: Any) -> None:
        __tracebackhide__ = True
        context_init(self, *args, **kwargs)
        try:
            _context_made(self)
        except Exception:  # noqa: BLE001
            pass

    def context_term(self: Any) -> None:
        __tracebackhide__ = True
        watcher = term_watcher
        suspects: list[SocketEntry] = []
        if watcher is not None:
            try:
                suspects = sockets_of(self)
            except Exception:  # noqa: BLE001
                suspects = []
        if not suspects:
            return term(self)  # type: ignore[no-any-return]
        return watcher(self, suspects, functools.partial(term, self))  # type: ignore[misc]

    _wrappers.patch("init", base, "__init__", socket_init)
    _wrappers.patch("bind", base, "bind", socket_bind)
    _wrappers.patch("connect", base, "connect", socket_connect)
    _wrappers.patch("close", base, "close", socket_close)
    _wrappers.patch("term", context_base, "term", context_term)
    _wrappers.patch("context", context_base, "__init__", context_made)


def _forget() -> None:
    _live.clear()
    _contexts.clear()
    _events.clear()


_wrappers = LazyWrappers("zmq", _wrap_zmq, _forget)


def install() -> None:
    """Start recording (nested calls are counted)."""
    _wrappers.install()


def uninstall() -> None:
    """Put the originals back with the last nested call (only where nobody replaced ours)."""
    _wrappers.uninstall()
