"""Whose is it: of the new items a test's check finds, which are the test's own.

Decided before any grace is waited, so that what others own costs no grace: what a live
wider-scope fixture started or its value reaches, what a module global or class attribute
reaches (long-lived), the standard library's process-lifetime helpers. Threads and processes
on their way out are let go in a brief wait first, which spares the owner search
(:func:`pytest_shutdown.ownership.find_owners`) its heap passes.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

from pytest_shutdown.ownership import origins
from pytest_shutdown.plugin.guard.ledger import FixtureLedger
from pytest_shutdown.plugin.guard.state import Found, _Watch
from pytest_shutdown.resources.base import ResourceKind
from pytest_shutdown.resources.primitives import thread_name

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.ownership.owners import Owner, Owners

#: Seconds into the brief wait (``guard._BRIEF_S``) after which what is still there is searched
#: for an owner: what a global or a live fixture holds (a library's monitor thread, a reusable
#: executor's workers: tqdm's, loky's, joblib's suites) is not waited for any longer. What is
#: on its way out ends well within it (1-3 ms for a closed ``multiprocessing.Pool``'s).
_WALK_AFTER_S = 0.01


class WhoseIsIt(FixtureLedger):
    """The ownership filtering of a test's new items (over the fixture ledger)."""

    def _left(
        self,
        watch: _Watch,
        allowed: set[str],
        moved: set[str] | None,
        asked: Found,
        walked: AbstractSet[tuple[str, Any]] = frozenset(),
    ) -> Found | None:
        """What the test left that is its own (None: nothing); ``allowed`` gets the kinds the
        markers allow; the keys in ``walked`` were searched for an owner already."""
        found: Found = {}
        allow = watch.allow
        later: list[tuple[ResourceKind, Any]] = []
        for kind in self.kinds:
            if moved is not None and kind.name not in moved:
                continue
            allowance = allow.allowance(kind.allow_key) if allow is not None else None
            if allowance is True:
                allowed.add(kind.name)
                self._allowed_late.setdefault(watch.nodeid, set()).add(kind.name)
                continue
            if not kind.ends_by_itself:
                later.append((kind, allowance))
                continue
            items = asked.get(kind.name)
            if items is None:
                items = self._new_in_test(watch, kind, allowance)
            if items:
                found[kind.name] = tuple(items)
        # Threads and processes first: a global found owning a pool's workers is remembered,
        # and the kinds asked next find the pool's pipes forwards from it, with no heap scan.
        nodeid = watch.nodeid
        left = self._without_owned(self._not_live_owned(found), nodeid, walked) if found else {}
        rest: Found = {}
        for kind, allowance in later:
            items = tuple(kind.new_since(watch.before[kind.name], allowance))
            if items:
                rest[kind.name] = items
        if not found and not rest and not watch.finished:
            return None
        if rest:
            left.update(self._without_owned(self._not_live_owned(rest), nodeid))
        return left

    def _new_since(self, watch: _Watch, moved: set[str] | None) -> Found:
        """The new items of the kinds whose items end by themselves (threads, processes)."""
        allow = watch.allow
        asked: Found = {}
        for kind in self._objects:
            if not kind.ends_by_itself:
                continue
            if moved is not None and kind.name not in moved:
                continue
            allowance = allow.allowance(kind.allow_key) if allow is not None else None
            if allowance is not True:
                asked[kind.name] = self._new_in_test(watch, kind, allowance)
        return asked

    @staticmethod
    def _new_in_test(watch: _Watch, kind: ResourceKind, allowance: Any) -> tuple[Any, ...]:
        """A kind's new items; when the gap before the test was not read, less those started
        outside any test (what a set-up reading would have put in the baseline)."""
        items = tuple(kind.new_since(watch.before[kind.name], allowance))
        if items and watch.gap_unread:
            between = kind.started_outside_tests(items)
            if between:
                items = tuple(i for i in items if i not in between)
        return items

    def _leaving(self, asked: Found) -> Found:
        """Of ``asked``, those no live fixture started and no known owner explains without a
        heap pass: those that end within a few milliseconds need no owner search at all."""
        found: Found = {name: items for name, items in asked.items() if items}
        targets = self._targets(found)
        if not found:
            return found
        live_owned = self._live_owned()
        owners: Mapping[Any, object] = {}
        if targets:
            from pytest_shutdown.ownership.owners import find_owners  # noqa: PLC0415 - only when found

            owners = find_owners(targets, self._fixture_roots(), walk=False)
        leaving = {
            name: tuple(
                i for i in items if i not in live_owned.get(name, ()) and (name, i) not in owners
            )
            for name, items in found.items()
        }
        return {name: items for name, items in leaving.items() if items}

    def _let_go(self, leaving: Found, wait_s: float) -> set[tuple[str, Any]]:
        """Wait up to ``wait_s`` for the ``leaving`` items to end; once some did, collect the
        young generations (what they held, a queue's pipe, is garbage now). What is still there
        after :data:`_WALK_AFTER_S` is searched for an owner once, and what has one is not
        waited for. Returns the keys that search left unowned (not walked for again)."""
        start = time.monotonic()
        deadline = start + wait_s
        walk_at = start + min(_WALK_AFTER_S, wait_s)
        unowned: set[tuple[str, Any]] = set()
        walked = ended = False
        delay = 0.001
        while True:
            for name, items in list(leaving.items()):
                left = self._by_name[name].still_there(items)
                ended = ended or len(left) < len(items)
                if left:
                    leaving[name] = tuple(left)
                else:
                    del leaving[name]
            now = time.monotonic()
            if leaving and not walked and now >= walk_at:
                walked = True
                unowned = self._stop_waiting_for_owned(leaving)
                now = time.monotonic()
            if not leaving or now >= deadline:
                break
            time.sleep(min(delay, (deadline if walked else walk_at) - now))
            delay = min(delay * 2, 0.008)
        if ended:
            gc.collect(1)
        return unowned

    def _stop_waiting_for_owned(self, leaving: Found) -> set[tuple[str, Any]]:
        """Drop from ``leaving`` what an owner search finds an owner for; return the rest's keys."""
        targets = self._targets(leaving)
        if not targets:
            return set()
        owners = self._find_owners(targets)
        for name, items in list(leaving.items()):
            kept = tuple(i for i in items if (name, i) not in owners)
            if kept:
                leaving[name] = kept
            else:
                del leaving[name]
        return {key for key in targets if key not in owners}

    def _find_owners(self, targets: dict[Any, object]) -> Owners:
        """The owner search (with its backward walk); a cut-short search's keys are uncertain."""
        from pytest_shutdown.ownership.owners import find_owners  # noqa: PLC0415 - only when found

        owners = find_owners(targets, self._fixture_roots(), near=self._known_referrers(targets))
        self._uncertain |= owners.uncertain
        return owners

    def _targets(
        self, found: Found, walked: AbstractSet[tuple[str, Any]] = frozenset()
    ) -> dict[Any, object]:
        """``(kind name, item)`` -> the object that stands for it in an owner search."""
        targets: dict[Any, object] = {}
        for kind in self._objects:
            items = found.get(kind.name)
            if items:
                for item, obj in kind.targets(items).items():
                    if (kind.name, item) not in walked:
                        targets[(kind.name, item)] = obj
        return targets

    def _known_referrers(self, targets: Mapping[Any, object]) -> dict[Any, Sequence[object]]:
        """``(kind name, item)`` -> objects known to refer to its target."""
        near: dict[Any, Sequence[object]] = {}
        for kind in self._objects:
            items = [item for name, item in targets if name == kind.name]
            if items:
                near.update(
                    ((kind.name, item), objs) for item, objs in kind.known_referrers(items).items()
                )
        return near

    def _without_owned(
        self,
        found: Found,
        nodeid: str,
        walked: AbstractSet[tuple[str, Any]] = frozenset(),
    ) -> Found:
        """Drop what outlives the test: a live wider-scope fixture's (adopted by it), a global's
        (long-lived), the standard library's; the keys in ``walked`` are not searched again."""
        targets = self._targets(found, walked)
        if not targets:
            return found
        owners = self._find_owners(targets)
        if not owners:
            return found
        for fixturedef, owned in self._owned.items():
            for kind in self._objects:
                adopted = tuple(
                    i
                    for i in found.get(kind.name, ())
                    if _fixture_of(owners.get((kind.name, i))) is fixturedef
                )
                if adopted:
                    owned.adopt(kind.name, adopted)
        for key, owner in owners.items():
            if owner.kind != "fixture" and key not in self._long_lived:
                self._long_lived[key] = _long_lived_record(key, owner, nodeid)
        return {
            name: tuple(i for i in items if (name, i) not in owners)
            for name, items in found.items()
        }

    def _kill_children(self, watch: _Watch) -> list[dict[str, Any]]:
        """On budget expiry: kill the test's child processes (not those of live fixtures)."""
        from pytest_shutdown.resources.primitives import kill_process_trees  # noqa: PLC0415
        from pytest_shutdown.resources.processes import ProcessKind, parent_pids  # noqa: PLC0415

        kind = self._by_name.get("processes")
        processes = kind if isinstance(kind, ProcessKind) else ProcessKind()
        before = watch.before.get("processes", frozenset())
        started = processes.new_since(before)
        owned = {p for o in self._owned.values() for p in o.started.get("processes", ())}
        owned.update(item for name, item in self._long_lived if name == "processes")
        pids = tuple(p for p in started if p not in owned)
        if not pids:
            return []
        from pytest_shutdown.ownership.owners import find_owners, objects_of  # noqa: PLC0415

        # A pool a fixture value or a global reaches is not the test's to kill. Bounded: this
        # runs in the signal handler, the budget over.
        others = find_owners(
            objects_of((), pids, parent_pids(pids)), self._fixture_roots(), max_seconds=1.0
        )
        pids = tuple(p for p in pids if p not in others)
        why = f"the shutdown budget of {watch.nodeid}"
        return kill_process_trees(pids, timeout=2.0, why=why) if pids else []


def _fixture_of(owner: Owner | None) -> Any:
    return owner.key if owner is not None and owner.kind == "fixture" else None


def _long_lived_record(key: tuple[str, Any], owner: Owner, nodeid: str) -> dict[str, Any]:
    """What the summary says about an item owned by a global."""
    item = key[1]
    if isinstance(item, threading.Thread):
        origin = origins.origin_of_thread(item)
        what: dict[str, Any] = {"kind": "thread", "name": thread_name(item), "ident": item.ident}
    elif hasattr(item, "long_lived"):  # an OS resource (fd, port, shm segment)
        origin = None
        what = item.long_lived()
    elif not isinstance(item, int):
        origin = getattr(item, "origin", None)
        describe = getattr(item, "describe", None)
        what = {"kind": key[0], "name": describe() if callable(describe) else repr(item)}
    else:
        origin = origins.origin_of_process(item)
        what = {"kind": "process", "pid": item, "name": origin.what if origin else None}
    return {
        **what,
        "owner": owner.to_dict(),
        "first_test": nodeid,
        "started_at": origins.render_origin(origin) if origin is not None else None,
    }
