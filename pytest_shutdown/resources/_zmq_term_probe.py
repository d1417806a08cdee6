"""The bounded probe of ``zmq.Context.term()``: a ``term()`` that cannot return because a socket
of its context is still open, or lingers on unsent messages, is reported instead of hanging the
test unseen (vLLM PR #13298).

``term()`` runs as always, in its caller's thread. Only when the record knows sockets of its
context that can keep it waiting (one not closed; one closed with a linger other than 0 that
can send) does a watcher (one of the plugin's own short-lived threads) wait for the call to
return, at most the probe's deadline. When the deadline passes first, the watcher records a
``term-blocked`` event (the kind reports it as ``zmq-term-blocked``, naming each socket: type,
endpoints, creation site, state), writes one line to stderr at once (the run may be stuck
here), and then:

* warn mode: nothing more. ``term()`` keeps blocking as it would without the plugin (until
  something closes the sockets or delivers the messages);
* fail mode: the sockets *the test itself made* that are still open are closed with linger 0,
  from the watcher, so that ``term()`` returns and the test errors with the finding. A socket
  that lingers on unsent messages cannot be released that way (libzmq has no call for it):
  ``term()`` keeps waiting for it.
"""

from __future__ import annotations

import sys
import threading
import time
from _thread import allocate_lock
from typing import Any

from pytest_shutdown._os.own_threads import start_own_thread
from pytest_shutdown.ownership import origins
from pytest_shutdown.resources import _zmq_record as record

__all__ = ["PROBE_FLOOR_S", "configure", "restore"]

#: The shortest deadline the probe waits, whatever the grace (a ``term()`` that flushes a last
#: message takes a few milliseconds: that is no hang).
PROBE_FLOOR_S = 0.1

_deadline_s = 2.0
_release = False


#: What :func:`configure` replaced: (deadline, release, watcher), given back to :func:`restore`.
Previous = tuple[float, bool, Any]


def configure(deadline_s: float, *, release: bool) -> Previous:
    """Watch every ``term()`` whose sockets may keep it waiting, for ``deadline_s`` (at least
    :data:`PROBE_FLOOR_S`); ``release``: fail mode's release of the test's open sockets.
    Returns what it replaced (a helper's block nested in a guarded test puts it back)."""
    global _deadline_s, _release
    previous = (_deadline_s, _release, record.term_watcher)
    _deadline_s = max(deadline_s, PROBE_FLOOR_S)
    _release = release
    record.term_watcher = _watch_term
    return previous


def restore(previous: Previous) -> None:
    global _deadline_s, _release
    _deadline_s, _release, record.term_watcher = previous


class _Probe:
    __slots__ = ("done", "suspects", "test", "called_at", "thread", "status", "deadline_s")

    def __init__(self, suspects: list[record.SocketEntry], deadline_s: float) -> None:
        self.done = allocate_lock()
        self.done.acquire()
        self.suspects = suspects
        self.test = origins.current_test()
        site = record.call_site()
        self.called_at = f"{site[0][0]}:{site[0][1]} in {site[0][2]}" if site else None
        self.thread = threading.current_thread().name
        #: Shared with the event: whether and when ``term()`` returned.
        self.status: dict[str, Any] = {"returned": False}
        self.deadline_s = deadline_s


def _watch_term(context: Any, suspects: list[record.SocketEntry], term: Any) -> Any:
    __tracebackhide__ = True  # the user's traceback of a failed term() is as without the probe
    probe = _Probe(suspects, _deadline_s)
    started = time.monotonic()
    try:
        start_own_thread(_watch, (probe,))
    except Exception:  # noqa: BLE001 - no watcher (the interpreter is exiting): unwatched
        probe.done.release()
    try:
        return term()
    finally:
        probe.status["returned_after_s"] = round(time.monotonic() - started, 3)
        probe.status["returned"] = True
        if probe.done.locked():
            probe.done.release()


def _watch(probe: _Probe) -> None:
    if probe.done.acquire(timeout=probe.deadline_s):
        return
    try:
        _report(probe)
    except Exception:  # noqa: BLE001 - the watcher never raises into the run
        pass


def _report(probe: _Probe) -> None:
    waiting = [e for e in probe.suspects if e.is_open() or e.may_linger()] or probe.suspects
    sockets = [entry.facts() for entry in waiting]  # as they were when the deadline passed
    described = [f"{entry.describe()} ({entry.state()})" for entry in waiting]
    released = _release_own_sockets(waiting, probe.test) if _release else []
    record.record_event(
        "term-blocked",
        probe.test,
        sockets=sockets,
        described=described,
        called_at=probe.called_at,
        thread=probe.thread,
        waited_s=probe.deadline_s,
        released=released,
        status=probe.status,
    )
    stream = sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
    what = "; ".join(described)
    then = (
        f"closed {len(released)} of the test's own open sockets with linger 0 (fail mode)"
        if released
        else "it keeps blocking"
    )
    stream.write(
        f"\npytest-shutdown: zmq Context.term() called in {probe.test or 'no test'} "
        f"(thread {probe.thread!r}) has not returned after {probe.deadline_s:g} s: it waits "
        f"for {what}; {then}.\n"
    )
    stream.flush()


def _release_own_sockets(entries: list[record.SocketEntry], test: str | None) -> list[str]:
    """Fail mode: close the sockets ``test`` made that are still open, with linger 0."""
    released = []
    for entry in entries:
        sock = entry.obj()
        if test is None or entry.test != test or sock is None or not entry.is_open():
            continue
        try:
            record.close_with_linger_zero(sock)
        except Exception:  # noqa: BLE001, S112 - closed meanwhile
            continue
        released.append(entry.describe())
    return released
