"""Which zmq socket or context holds an eventfd or epoll descriptor no Python object wraps.

libzmq (epoll and eventfd, Linux) gives each socket a mailbox (an eventfd, the socket's ``FD``
option: exact), and each context, from its construction, a mailbox of its own (an eventfd that
no poller watches); the context's first socket starts its threads, a reaper and ``n`` I/O
threads (``IO_THREADS``), each a mailbox and an epoll instance that watches it (``tfd:`` in
``/proc/self/fdinfo``). Closing the sockets closes their mailboxes; the rest stays until the
context is terminated.

The descriptors no socket explains are given to a context only when their shape is one
context's (each epoll watches exactly one of the eventfds; at most one eventfd is left over,
the context's own mailbox) and exactly one live context could have opened them since the
descriptors were last counted (:func:`_could_own`, from the record of
:mod:`~pytest_shutdown.resources._zmq_record`):

* its own mailbox and its ``1 + n`` threads' pairs: a context made in the current test whose
  first socket was made;
* its own mailbox alone: a context made in the current test that never had a socket;
* ``1 + n`` pairs without a mailbox of its own: a context made earlier (a fixture's) that a
  socket of the current test started.

Anything else (two contexts left at once, another library's eventfds beside them) stays
unexplained: no context is named that is not certainly the holder.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_shutdown._fast import cheap as _cheap
from pytest_shutdown.ownership import origins
from pytest_shutdown.resources import _zmq_record as record

__all__ = ["CONTEXT_ROLE", "context_owning", "name_context_descriptors", "zmq_owners"]

#: What a descriptor given to a context is to it.
CONTEXT_ROLE = "libzmq's mailbox or poller of"
_SOCKET_ROLE = "libzmq's mailbox of a socket of"
_HELPER_KINDS = ("eventfd", "eventpoll")


def zmq_owners(anon: Mapping[int, str | None]) -> dict[int, tuple[object, str]]:
    """fd -> (the zmq context whose native code holds it, what it is to it), for the eventfd and
    epoll descriptors of ``anon`` (fd -> its ``anon_inode`` kind): a socket's mailbox is given
    to the socket's context, the rest to one context (:func:`context_owning`) or to none."""
    found = _sockets_and_contexts(anon)
    if found is None:
        return {}
    owners = found[0]
    owned = _rest_owner(anon, *found)
    if owned is not None:
        owners.update({fd: (owned[0], CONTEXT_ROLE) for fd in owned[1]})
    return owners


def context_owning(anon: Mapping[int, str | None]) -> tuple[object, frozenset[int]] | None:
    """The one live context that holds the eventfd and epoll descriptors of ``anon`` no socket's
    mailbox explains, and those descriptors; None when that is not certain."""
    found = _sockets_and_contexts(anon)
    return _rest_owner(anon, *found) if found is not None else None


def _rest_owner(
    anon: Mapping[int, str | None],
    owners: Mapping[int, object],
    contexts: Mapping[int, list[object]],
) -> tuple[object, frozenset[int]] | None:
    rest = {fd for fd, kind in anon.items() if kind in _HELPER_KINDS} - owners.keys()
    return _context_owning(rest, anon, contexts)


def _sockets_and_contexts(
    anon: Mapping[int, str | None],
) -> tuple[dict[int, tuple[object, str]], dict[int, list[object]]] | None:
    """One heap pass: the descriptors of ``anon`` that are an open socket's mailbox (given to its
    context), and the live contexts by their ``underlying`` address (a context and its shadows
    share one); None when pyzmq is not loaded or nothing is an eventfd or epoll."""
    zmq = sys.modules.get("zmq")
    socket_type, context_type = getattr(zmq, "Socket", None), getattr(zmq, "Context", None)
    if not isinstance(socket_type, type) or not isinstance(context_type, type):
        return None
    wanted = {fd for fd, kind in anon.items() if kind in _HELPER_KINDS}
    if not wanted:
        return None
    fd_option = getattr(zmq, "FD", 14)
    found = _cheap.heap_instances(lambda kind: issubclass(kind, (socket_type, context_type)))
    owners: dict[int, tuple[object, str]] = {}
    contexts: dict[int, list[object]] = {}
    for obj in found:
        try:
            if getattr(obj, "closed", True):
                continue
            if isinstance(obj, socket_type):
                number = obj.get(fd_option)  # type: ignore[attr-defined]
                context = obj.context  # type: ignore[attr-defined]
                if isinstance(number, int) and number in wanted:
                    owners[number] = (context, _SOCKET_ROLE)
            else:
                contexts.setdefault(int(obj.underlying), []).append(obj)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001, S112 - a socket closed meanwhile, a shadow context
            continue
    del found
    return owners, contexts


def _context_owning(
    rest: set[int], anon: Mapping[int, str | None], contexts: Mapping[int, list[object]]
) -> tuple[object, frozenset[int]] | None:
    """``rest`` given to the one context of ``contexts`` that could have opened them (see the
    module), with the object that stands for it: the recorded one of a context and its shadows."""
    shape = _threads_shape(rest, anon)
    if shape is None:
        return None
    threads, own_mailbox = shape
    recording = record.installed()
    test = origins.current_test()
    candidates = []
    for objects in contexts.values():
        entry, context = next(
            ((e, obj) for obj in objects if (e := record.context_entry(obj)) is not None),
            (None, objects[0]),
        )
        count = _io_threads(context)
        if count is None or threads not in (0, 1 + count):
            continue
        if not recording or _could_own(entry, threads, own_mailbox, test):
            candidates.append(context)
    if len(candidates) != 1:
        return None
    return candidates[0], frozenset(rest)


def _threads_shape(rest: set[int], anon: Mapping[int, str | None]) -> tuple[int, bool] | None:
    """(how many poller and mailbox pairs, whether one eventfd no poller watches is left) when
    ``rest`` has a context's shape, else None."""
    eventfds = {fd for fd in rest if anon.get(fd) == "eventfd"}
    polls = rest - eventfds
    paired: set[int] = set()
    for fd in polls:
        watched = eventfds.intersection(_watched_by(fd))
        if len(watched) != 1 or watched & paired:
            return None
        paired |= watched
    left = len(eventfds) - len(paired)
    if left > 1 or not rest:
        return None
    return len(polls), left == 1


def _watched_by(epoll_fd: int) -> list[int]:
    """The descriptors the epoll instance ``epoll_fd`` watches (its fdinfo's ``tfd:`` lines)."""
    try:
        with open(f"/proc/self/fdinfo/{epoll_fd}", encoding="ascii") as f:
            return [int(line.split()[1]) for line in f if line.startswith("tfd:")]
    except (OSError, ValueError, IndexError):
        return []


def _could_own(
    entry: record.ContextEntry | None, threads: int, own_mailbox: bool, test: str | None
) -> bool:
    """Whether the recorded context ``entry`` could have opened, in the current test, a new
    mailbox of its own (``own_mailbox``) and ``threads`` pairs; one made before recording
    started opened none."""
    if entry is None:
        return False
    if own_mailbox:
        return entry.test == test and entry.started == bool(threads)
    return bool(threads) and entry.started and entry.started_in == test


def _counted(fds: int, polls: int) -> str:
    """``7 descriptors: 4 eventfds, 3 epoll instances``."""
    eventfds = fds - polls
    parts = [f"{eventfds} eventfd{'s' if eventfds != 1 else ''}"] if eventfds else []
    if polls:
        parts.append(f"{polls} epoll instance{'s' if polls != 1 else ''}")
    return f"{fds} descriptor{'s' if fds != 1 else ''}: {', '.join(parts)}"


def name_context_descriptors(records: Sequence[dict[str, Any]]) -> None:
    """Name, in place, the descriptor records (:func:`~.fds.describe_fd`) that a live context,
    recorded and never terminated, holds (see the module): their ``what`` becomes ``zmq Context
    created at f.py:12, never terminated (its 7 descriptors: 4 eventfds, 3 epoll instances)``,
    and ``zmq_context`` holds the context's facts (``type``: its class, as ``zmq.Context``).
    Records a socket named are left out."""
    if not record.installed():
        return
    anon = {
        r["fd"]: r["kind"]
        for r in records
        if r.get("kind") in _HELPER_KINDS and not r.get("python_objects") and "zmq_socket" not in r
    }
    owned = context_owning(anon) if anon else None
    if owned is None:
        return
    context, fds = owned
    entry = record.context_entry(context)
    if entry is None:
        return
    polls = sum(1 for fd in fds if anon[fd] == "eventpoll")
    what = f"{entry.describe()}, never terminated (its {_counted(len(fds), polls)})"
    facts = {**entry.facts(), "io_threads": _io_threads(context), "fds": sorted(fds)}
    for fd_record in records:
        if fd_record.get("fd") in fds:
            fd_record.update(what=what, zmq_context=facts)


def _io_threads(context: object) -> int | None:
    """The context's ``IO_THREADS``; None once terminated."""
    try:
        return int(context.get(getattr(sys.modules.get("zmq"), "IO_THREADS", 1)))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - terminated meanwhile
        return None
