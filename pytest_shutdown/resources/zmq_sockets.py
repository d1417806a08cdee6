"""The ``zmq`` resource kind: a ``zmq.Context.term()`` that could not return because a socket of
its context was still open, or lingered on unsent messages (``zmq-term-blocked``, vLLM PR
#13298); and the names of the descriptors a ZMQ socket left open owns, for ``fd-leak``.

What the test made is known from :mod:`pytest_shutdown.resources._zmq_record` (wrappers that
only record; pyzmq is not imported for it), and a blocked ``term()`` from its bounded probe
(:mod:`pytest_shutdown.resources._zmq_term_probe`, whose deadline is the guard's grace). The
kind's fingerprint is the record's counter: one integer read, which moves only when a socket is
made or a probe reports. A ZMQ socket left open is an ``fd-leak`` (the ``fds`` kind): its
descriptors are named here (:func:`name_descriptors`): the socket's mailbox (its ``FD`` option,
an eventfd) and the TCP or unix connections of its endpoints (held by libzmq's I/O thread,
matched by port or socket name) read ``zmq socket PUSH tcp://127.0.0.1:5555 created at
f.py:12``; the context's own mailboxes and pollers stay the context's.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources import _zmq_record as record
from pytest_shutdown.resources import _zmq_term_probe as probe
from pytest_shutdown.resources._zmq_contexts import name_context_descriptors
from pytest_shutdown.resources.base import Allowance, Extra, ObjectKind

__all__ = ["ZmqKind", "name_descriptors"]


class ZmqKind(ObjectKind):
    """pyzmq's contexts whose ``term()`` blocked on a socket (see the module)."""

    name = "zmq"
    allow_key = "zmq"
    #: The fingerprint is one integer read, shared with no other kind.
    reads_alone = True

    def __init__(self, settings: Any = None, *, deadline: float | None = None) -> None:
        """The guard's (``settings``: the probe waits the grace, fail mode releases), or a
        helper's (``deadline``: the probe waits that long and only observes; what it reports
        is the helper's, never reported again by the guard)."""
        record.install()  # pyzmq itself is not imported
        self._helper = settings is None
        self._previous: probe.Previous | None = None
        if settings is not None:
            release = settings.mode == "fail"
            self._previous = probe.configure(settings.grace_s, release=release)
        elif deadline is not None:
            self._previous = probe.configure(deadline, release=False)

    def close(self) -> None:
        if self._previous is not None:
            probe.restore(self._previous)
            self._previous = None
        record.uninstall()

    def fingerprint(self) -> int:
        return record._seq

    def snapshot(self) -> int:
        return record._seq

    def absorb(self, before: int, start: int | None, end: int | None) -> int:
        """What a wider-scope fixture's set-up did is its own: the baseline moves past it
        (pytest sets wider-scope fixtures up before the test's own, so nothing of the test's
        comes before them)."""
        if start is None:
            return before
        return max(before, record.seq() if end is None else end)

    def new_since(self, before: int, allow: Allowance = None) -> Sequence[record.Event]:
        if allow is True or record.seq() == before:
            return ()
        found = [
            event
            for event in record.events_since(before)
            if self._helper or (event.test is not None and not event.claimed)
        ]
        if self._helper:
            for event in found:
                event.claimed = True
        if isinstance(allow, tuple):
            from fnmatch import fnmatchcase  # noqa: PLC0415 - only with patterns

            found = [
                e
                for e in found
                if not any(fnmatchcase(s, p) for s in e.detail["described"] for p in allow)
            ]
        return tuple(found)

    def settle(self, items: Sequence[record.Event], deadline: float) -> Sequence[record.Event]:
        return list(items)  # what happened stays happened

    def already_over(self, items: Sequence[record.Event]) -> Sequence[record.Event]:
        return list(items)  # each a term() that blocked: reported with its test in warn mode too

    def findings(
        self, items: Sequence[record.Event], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        return [_finding(event, subject, dict(extra or {})) for event in items]


def _finding(event: record.Event, subject: str, extra: dict[str, Any]) -> Finding:
    detail = event.detail
    status = dict(detail["status"])
    count = len(detail["sockets"])
    where = f" at {detail['called_at']}" if detail.get("called_at") else ""
    if detail["released"]:
        after = "fail mode closed the test's own open sockets with linger 0"
        if status.get("returned"):
            after += ", and term() returned"
    elif status.get("returned"):
        after = f"it returned after {status['returned_after_s']:g} s"
    else:
        after = "it was still blocked when the test ended"
    message = (
        f"zmq Context.term() called in {subject}{where} (thread {detail['thread']!r}) did not "
        f"return within {detail['waited_s']:g} s: it waits for {count} socket"
        f"{'s' if count != 1 else ''} of its context: {'; '.join(detail['described'])}; "
        f"{after}. Close every socket with linger=0 before term() (vLLM PR #13298)."
    )
    details = {
        "sockets": detail["sockets"],
        "called_at": detail.get("called_at"),
        "thread": detail["thread"],
        "waited_s": detail["waited_s"],
        "released": detail["released"],
        "returned": status.get("returned", False),
        "returned_after_s": status.get("returned_after_s"),
        **extra,
    }
    return Finding("zmq-term-blocked", message, details)


# --- the fds kind's names for a ZMQ socket's descriptors ------------------------------------


def _port(endpoint: str) -> str | None:
    """``tcp://host:5555`` -> ``"5555"``; ``ipc://@name`` / ``ipc:///path`` -> its name."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "tcp":
        return rest.rpartition(":")[2] or None
    if scheme == "ipc":
        return rest or None
    return None


def _owner_of_connection(
    fd_record: Mapping[str, Any], sockets: Sequence[record.SocketEntry]
) -> record.SocketEntry | None:
    """The open socket one of whose endpoints this kernel socket is: a bind's local port (its
    listener and the connections it accepted), a connect's remote port, a bound ipc endpoint's
    socket name."""
    local = str(fd_record.get("local") or fd_record.get("address") or "")
    remote = str(fd_record.get("remote") or "")
    for entry in sockets:
        for endpoint in entry.endpoints:
            name = _port(endpoint)
            if name is None:
                continue
            if endpoint in entry.bound:
                mine = local == name if endpoint.startswith("ipc://") else _port_of(local) == name
            else:
                mine = bool(remote) and _port_of(remote) == name
            if mine:
                return entry
    return None


def _port_of(address: str) -> str:
    return address.rpartition(":")[2]


def name_descriptors(records: Sequence[dict[str, Any]]) -> None:
    """Name, in place, the descriptor records (:func:`~.fds.describe_fd`, and the ports kind's)
    that a recorded ZMQ socket still open owns: its mailbox (its ``FD``) and its endpoints'
    connections and listeners. Their
    ``what`` becomes ``zmq socket PUSH tcp://... created at f.py:12 (...)``, and ``zmq_socket``
    holds the socket's facts. Then those a recorded context never terminated holds
    (:func:`~._zmq_contexts.name_context_descriptors`)."""
    zmq = sys.modules.get("zmq")
    if zmq is None or not record.installed():
        return
    sockets = list(record.open_sockets())
    if sockets:
        _name_socket_descriptors(records, sockets, getattr(zmq, "FD", 14))
    name_context_descriptors(records)


def _name_socket_descriptors(
    records: Sequence[dict[str, Any]], sockets: Sequence[record.SocketEntry], fd_option: int
) -> None:
    mailboxes: dict[int, record.SocketEntry] = {}
    for entry in sockets:
        try:
            mailboxes[int(entry.obj().get(fd_option))] = entry
        except Exception:  # noqa: BLE001, S112 - closed or terminated meanwhile
            continue
    for fd_record in records:
        kind = fd_record.get("kind")
        if kind == "eventfd" and fd_record.get("fd") in mailboxes:
            entry, role = mailboxes[fd_record["fd"]], "its mailbox, an eventfd"
        elif (kind == "socket" or "address" in fd_record) and (
            owner := _owner_of_connection(fd_record, sockets)
        ):
            entry, role = owner, f"{fd_record['what']}, held by libzmq's I/O thread"
        else:
            continue
        fd_record["zmq_socket"] = entry.facts()
        fd_record["what"] = f"{entry.describe()} ({role})"
