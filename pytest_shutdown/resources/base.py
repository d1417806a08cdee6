"""The resource model: what the guard walks, one kind per thing a test can leave behind.

Every resource kind (threads, processes, file descriptors, ports, shared memory, process-wide
state ...) answers the same questions, so the guard has no branch per kind:

* ``fingerprint()``: the cheapest reading that moves whenever ``new_since`` could find something
  or ``snapshot`` would answer otherwise (a count, an identity, the set itself when cheap). All
  of a test's fingerprints equal before and after it: no kind is asked anything more, and the
  next test starts from the last clean test's snapshots. Inside one moment
  (:mod:`pytest_shutdown._fast.moments`) the kinds share their readings.
* ``snapshot()``: what exists now; cheap, taken before a test whose fingerprints moved and around
  every wider-scope fixture's set-up. Compare counts or identities first, list only on a change.
* ``new_since(before, allow)``: what appeared since ``before`` (an *object kind*: threads, pids,
  descriptors) or what changed (a *state kind*: :class:`Change` records), minus what ``allow``
  permits. Cheap first.
* ``diff(before, after)``: a state kind's changes between two snapshots (a fixture's, from
  before its set-up to after its teardown); object kinds answer ``()``.
* ``absorb(before, start, end)``: the test's baseline with what a wider-scope fixture did
  between the snapshots ``start`` and ``end`` counted as already there (it is the fixture's,
  checked at its teardown).
* ``targets(items)``: for kinds whose items an object in the heap can own, the objects the
  ownership search (:func:`pytest_shutdown.ownership.owners.find_owners`) explains, by item.
* ``settle(items, deadline)``: what is still there when the grace runs out (polled: a clean
  test waits for nothing).
* ``findings(items, subject, grace, extra)``: what is left, as :class:`Finding` data.
* ``restore(items)``: fail mode only, after the findings: put order back for the next test
  (kill a process tree, undo a freeze, put back a signal handler). Warn mode changes nothing.

The optional parts (the fingerprint's sharing: ``mark``, ``reads_alone``, ``fingerprinted_by``,
``unmoved_since``; ``ends_by_itself`` with ``still_there``; ``already_over``;
``started_outside_tests``,
``known_referrers``, ``kept_by_libraries``, ``settle_long_lived``;
``finds_late``/``track_late``/``late_items``; ``close``, called at ``pytest_unconfigure``; and
the session-end hooks ``sweep_session_end`` and ``blocking_exit``, given a
:class:`SessionEndContext`) are declared once, with their defaults and meaning, on
:class:`KindDefaults`, which :class:`ObjectKind` and :class:`StateKind` derive from: the guard
calls them directly, never probing for them.

A new kind is a new module with a subclass of :class:`ObjectKind` or :class:`StateKind` and one
line in :data:`pytest_shutdown.resources.KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown.findings.finding import Finding

if TYPE_CHECKING:  # pragma: no cover
    import threading

    from pytest_shutdown.ownership.containment import Containment

__all__ = [
    "Allowance",
    "Change",
    "KindDefaults",
    "ObjectKind",
    "ResourceKind",
    "SessionEndContext",
    "SessionEndReport",
    "StateKind",
    "after_grace",
    "left_findings",
]


#: What ``@pytest.mark.allow_leaks(<allow_key>=...)`` gave one kind: True (anything), or
#: glob patterns matched against the item's name (threads), or None (nothing allowed).
Allowance = bool | tuple[str, ...] | None
#: What a caller adds to every finding's details (``findings(..., extra=...)``).
Extra = Mapping[str, Any] | None


@runtime_checkable
class ResourceKind(Protocol):
    """One kind of thing a test can leave behind. See the module docstring for the contract."""

    #: The kind's name, as ``--shutdown-resources`` lists it ("threads", "processes", ...).
    name: str
    #: The ``@pytest.mark.allow_leaks`` keyword that silences this kind.
    allow_key: str
    #: True for a state kind (its items are :class:`Change` records, not objects that end).
    stateful: bool

    def fingerprint(self) -> Any: ...

    def snapshot(self) -> Any: ...

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[Any]: ...

    def absorb(self, before: Any, start: Any, end: Any) -> Any: ...

    def diff(self, before: Any, after: Any) -> Sequence[Any]: ...

    def targets(self, items: Sequence[Any]) -> Mapping[Any, object]: ...

    def settle(self, items: Sequence[Any], deadline: float) -> Sequence[Any]: ...

    def findings(
        self, items: Sequence[Any], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]: ...

    def restore(self, items: Sequence[Any]) -> None: ...

    # --- the optional parts: their defaults and what they mean are on KindDefaults ---

    mark: str | None
    reads_alone: bool
    fingerprinted_by: tuple[str, ...]
    ends_by_itself: bool
    finds_late: bool
    track_late: bool

    def unmoved_since(self, before: Any, moved: AbstractSet[str]) -> bool: ...

    def still_there(self, items: Sequence[Any]) -> Sequence[Any]: ...

    def already_over(self, items: Sequence[Any]) -> Sequence[Any]: ...

    def started_outside_tests(self, items: Sequence[Any]) -> AbstractSet[Any]: ...

    def known_referrers(self, items: Sequence[Any]) -> Mapping[Any, Sequence[object]]: ...

    def kept_by_libraries(self, items: Sequence[Any]) -> Mapping[Any, str]: ...

    def settle_long_lived(
        self, items: Sequence[Any], deadline: float, *, thorough: bool = False
    ) -> Sequence[Any]: ...

    def late_items(self) -> Mapping[str, Sequence[Any]]: ...

    def close(self) -> None: ...

    def sweep_session_end(self, end: SessionEndContext) -> None: ...

    def blocking_exit(self, end: SessionEndContext) -> Sequence[Any]: ...


@lazy_dataclass(frozen=True)
class Change:
    """One piece of process-wide state a test changed: what it was, what it is now.

    ``key`` names the piece (``"gc.freeze_count"``, ``"signal SIGTERM"``, ``"os.environ['X']"``);
    ``before`` and ``after`` are the values themselves (rendered by the kind's findings);
    ``undo`` puts ``before`` back, when that is possible (fail mode only).
    """

    key: str
    before: Any
    after: Any
    undo: Callable[[], None] | None = None


class SessionEndReport(Protocol):
    """What a session-end hook may tell the report (the guard's report object)."""

    def add_findings(self, nodeid: str, findings: list[dict[str, Any]]) -> None: ...

    def exit_blocked(
        self, threads: list[threading.Thread], described: list[dict[str, Any]]
    ) -> None: ...


@lazy_dataclass(frozen=True)
class SessionEndContext:
    """What the session-end hooks (``sweep_session_end``, ``blocking_exit``) are given: the
    guard's data at the session's end, never the guard itself."""

    #: The guard's mode, ``"warn"`` or ``"fail"``.
    mode: str
    #: The grace, in seconds (``--shutdown-grace``): fail mode's bound on the exit's wait.
    grace_s: float
    #: Where findings of ``<session end>`` go (:class:`SessionEndReport`).
    report: SessionEndReport
    #: The descendants of this process when the session began (none of its tests').
    session_start_pids: AbstractSet[int]
    #: The threads alive when the session began (none of its tests').
    session_start_threads: AbstractSet[threading.Thread]
    #: The session's containment (its marker, whether this process is a subreaper).
    containment: Containment
    #: ``(kind name, item)`` of the long-lived resources (a module global's pool): listed as
    #: long-lived, not reported again.
    long_lived: tuple[tuple[str, Any], ...]
    #: ``(kind name, item)`` of the last tests' leaks reported with their test at session end
    #: (warn mode, pending.py): not reported again.
    reported_at_end: AbstractSet[tuple[str, Any]]


class KindDefaults:
    """The optional parts of :class:`ResourceKind`, each declared once with its default (what
    a kind that does not define it answers), and the defaults :class:`ObjectKind` and
    :class:`StateKind` share (the fingerprint is the snapshot; no targets); the guard calls
    these directly."""

    #: The one shared reading that stands for the kind's fingerprint, which the guard takes for
    #: all kinds in one pass (:data:`pytest_shutdown._fast.marks.MARKS`); None: asked itself.
    mark: str | None = None
    #: With the marks ``"atexit_count"`` and ``"c10d"``: the function (no ``self``) whose
    #: answer is the kind's fingerprint, called by the pass directly.
    mark_reading: Callable[[], Any] | None = None
    #: The kind's fingerprint shares no reading with another kind's: asked outside a moment.
    reads_alone: bool = False
    #: The kinds whose fingerprints move whenever this one's would (the ports kind: the fds
    #: and the processes): while they are on, the guard compares theirs, not this one's.
    fingerprinted_by: tuple[str, ...] = ()
    #: The kind's items end by themselves (threads, processes): :meth:`still_there` says which
    #: have, and the guard gives new ones a brief wait before the ownership search.
    ends_by_itself: bool = False
    #: The kind reports items found after their test had ended (:meth:`late_items`).
    finds_late: bool = False
    #: Set by the guard on a kind that :attr:`finds_late`: keep the current test, to tell late
    #: items apart.
    track_late: bool = False

    def fingerprint(self) -> Any:
        return self.snapshot()  # compared as it is: by identity, then equality

    def snapshot(self) -> Any:
        raise NotImplementedError

    def targets(self, items: Sequence[Any]) -> Mapping[Any, object]:
        return {}

    def settle(self, items: Sequence[Any], deadline: float) -> Sequence[Any]:
        raise NotImplementedError

    def unmoved_since(self, before: Any, moved: AbstractSet[str]) -> bool:
        """With :attr:`fingerprinted_by`: whether the kind's own fingerprint cannot have moved
        since the snapshot ``before`` although the kinds named in ``moved`` did. Default: it
        may have (the kind counts as moved with them)."""
        return False

    def still_there(self, items: Sequence[Any]) -> Sequence[Any]:
        """With :attr:`ends_by_itself`: what of ``items`` is still there now, without waiting
        or collecting. Default: all of them."""
        return items

    def already_over(self, items: Sequence[Any]) -> Sequence[Any]:
        """Of ``items``, those that no grace can change any more: events that happened (a task
        a runner cancelled, a coroutine never awaited, a ``term()`` that blocked). Warn mode
        reports them with their test at once, instead of deferring their verdict to the end of
        the grace (then "still running when the session ended" was wrong of them). Default:
        none."""
        return ()

    def started_outside_tests(self, items: Sequence[Any]) -> AbstractSet[Any]:
        """Of new ``items``, those whose recorded start was outside any test (in the gap
        before it, when the guard did not read that gap). Default: none known."""
        return frozenset()

    def known_referrers(self, items: Sequence[Any]) -> Mapping[Any, Sequence[object]]:
        """With ``targets``: objects known to refer to an item's target directly (an
        ``atexit`` registration's bound method), keyed by item; the ownership search walks
        them from its first heap pass on. Default: none known."""
        return {}

    def kept_by_libraries(self, items: Sequence[Any]) -> Mapping[Any, str]:
        """Of a fixture's leftover ``items``, those a loaded native library keeps for the
        process's lifetime, with the library's name: listed as long-lived, not a finding.
        Default: none."""
        return {}

    def settle_long_lived(
        self, items: Sequence[Any], deadline: float, *, thorough: bool = False
    ) -> Sequence[Any]:
        """:meth:`settle` for the long-lived list at session end; a kind whose items a
        collection releases collects the whole heap only when ``thorough`` (the list fails the
        session). Default: :meth:`settle`."""
        return self.settle(items, deadline)

    def late_items(self) -> Mapping[str, Sequence[Any]]:
        """With :attr:`finds_late`: items found after the test that made them had ended, by
        that test's node id (a process that left the test's tree later); each handed out
        once. Default: none."""
        return {}

    def close(self) -> None:
        """Remove what the kind installed for the session (a recorder): called at
        ``pytest_unconfigure``. Default: nothing installed."""
        return None

    def sweep_session_end(self, end: SessionEndContext) -> None:
        """At session end, what the session's tests left of this kind that no test's check
        saw (a process re-parented away from its test's tree): reported to ``end.report`` as
        findings of ``<session end>``; fail mode stops them. Called for every kind in order,
        not on the xdist controller (its workers sweep their own). Default: nothing to
        sweep."""
        return None

    def blocking_exit(self, end: SessionEndContext) -> Sequence[Any]:
        """At session end, after every kind's :meth:`sweep_session_end`: what the tests left
        of this kind that will block the interpreter's exit (a non-daemon thread), reported to
        ``end.report`` as findings of ``<session end>``, and returned: fail mode bounds the
        exit's wait for them (``pytest_unconfigure``). Called for every kind in order.
        Default: nothing blocks."""
        return ()


class ObjectKind(KindDefaults):
    """Defaults for a kind whose items are objects that end by themselves (threads, pids)."""

    stateful = False

    def absorb(self, before: Any, start: Any, end: Any) -> Any:
        """Items a wider-scope fixture started between ``start`` and ``end`` are no test's."""
        new = set(self.new_since(start)) if start is not None else set()
        return before | frozenset(new) if new else before

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[Any]:
        raise NotImplementedError

    def diff(self, before: Any, after: Any) -> Sequence[Any]:
        return ()

    def restore(self, items: Sequence[Any]) -> None:
        return None


class StateKind(KindDefaults):
    """Defaults for a kind whose items are :class:`Change` records of process-wide state.
    Subclasses define ``snapshot()``, ``diff(before, after)`` and ``absorb``."""

    stateful = True

    def diff(self, before: Any, after: Any) -> Sequence[Any]:
        raise NotImplementedError

    def absorb(self, before: Any, start: Any, end: Any) -> Any:
        raise NotImplementedError

    def new_since(self, before: Any, allow: Allowance = None) -> Sequence[Any]:
        if allow is True:
            return ()
        return self.diff(before, self.snapshot())

    def settle(self, items: Sequence[Any], deadline: float) -> Sequence[Any]:
        return items  # state does not go away by waiting

    def restore(self, items: Sequence[Any]) -> None:
        for change in items:
            if change.undo is not None:
                try:
                    change.undo()
                except Exception:  # noqa: BLE001 - restoring must never break the run
                    pass


def after_grace(grace: float) -> str:
    """When something was found still there: after a grace, or at once (none was given)."""
    return f"after the {grace:g} s grace" if grace > 0 else "(no grace was given)"


def left_findings(
    code: str,
    key: str,
    records: Sequence[Mapping[str, Any]],
    texts: Sequence[str],
    what: str,
    *,
    grace: float,
    extra: Extra,
    note: str = "",
) -> list[Finding]:
    """One ``code`` finding for the ``records`` left (under ``key`` in its details): ``what``,
    when it was seen, the first eight ``texts`` (one per record), ``note``."""
    if not records:
        return []
    more = f"; and {len(texts) - 8} more" if len(texts) > 8 else ""
    when = f"{grace:g} s after it ended" if grace > 0 else "when it ended"
    details = {key: [dict(r) for r in records], "grace_s": grace, **dict(extra or {})}
    return [Finding(code, f"{what} {when}: {'; '.join(texts[:8])}{more}.{note}", details)]
