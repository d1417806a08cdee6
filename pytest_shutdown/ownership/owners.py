"""Whose is it? The owner of a thread or child process that outlives a test.

A survivor is the test's leak only when nothing that outlives the test reaches it. Owners,
narrowest first: a wider-scope fixture's value; a module global or class attribute; a
process-lifetime helper of the standard library; last, the import of a module whose top-level
code created it. :func:`find_owners` searches forwards from the known owners, then backwards
through ``gc.get_referrers``, one heap pass per level for all suspects, bounded.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from pytest_shutdown._base.frozen_at_import import FROZEN_AT_IMPORT as _FROZEN_AT_IMPORT
from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown._fast.moments import reading
from pytest_shutdown.ownership import origins
from pytest_shutdown.ownership.slots import slot_names

__all__ = ["Owner", "find_owners", "module_holding", "singleton_slot", "stdlib_helper_threads"]

#: Levels walked backwards at most (an engine's pool is about ten references deep).
MAX_DEPTH = 14
MAX_NODES = 50_000
MAX_SECONDS = 2.0
RECENT_OWNERS = 8
#: Objects a forward search visits at most before the backward walk takes over.
SHORTCUT_NODES = 5_000

#: ``("module", module, name)`` / ``("class", weakref to the class, name)`` that owned something
#: lately, most recent last: a forward search from one costs a few hundred objects, where each
#: backward level is a heap pass (~10 ms with numpy loaded).
_recent: collections.OrderedDict[tuple[str, Any, str], None] = collections.OrderedDict()

#: The test tools' objects are never owners, except the reference engine's, and ``ray_cluster``'s
#: value: it holds the replacement node's tree (a walk stopped at it blamed that tree on the test
#: that called ``restore()``).
_TOOL_PACKAGES = origins._TOOL_PACKAGES
_CODE_UNDER_TEST = ("pytest_shutdown.engine", "pytest_shutdown.plugin.ray_cluster")
#: ... and execnet's master side: only a test suite makes a ``Group`` or ``Gateway`` here, and a
#: session fixture's group owns the gateways a function fixture makes (skipping them made fail
#: mode kill the gateway under every later test).
_SUITES_OWN_TOOL_MODULES = frozenset(
    {"execnet.multi", "execnet.gateway", "execnet.gateway_io", "execnet.xspec", "execnet.rsync"}
)

#: The standard library's registries: they reference everything and own nothing.
_REGISTRIES = (
    ("threading", "_active"),
    ("threading", "_limbo"),
    ("threading", "_shutdown_locks"),
    ("multiprocessing.process", "_children"),
    ("multiprocessing.util", "_finalizer_registry"),
    ("multiprocessing.util", "_afterfork_registry"),
    ("subprocess", "_active"),
    ("weakref", "finalize._registry"),
    ("concurrent.futures.thread", "_threads_queues"),
    ("concurrent.futures.process", "_threads_wakeups"),
)


@lazy_dataclass(frozen=True)
class Owner:
    """What outlives the test and reaches a thread or process.

    ``kind``: ``"fixture"``, ``"module-global"``, ``"class-attribute"``, ``"stdlib-helper"``
    or ``"import"``; ``name``: what it is; ``path``: the reference path down to the object;
    ``key``: the caller's handle of a fixture owner (not rendered).
    """

    kind: str
    name: str
    path: str = ""
    key: Any = None

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "path": self.path}

    def describe(self) -> str:
        label = {
            "fixture": "fixture",
            "module-global": "module global",
            "class-attribute": "class attribute",
            "stdlib-helper": "standard-library helper",
            "import": "the import of",
        }.get(self.kind, self.kind)
        return f"{label} {self.name}"


def stdlib_helper_threads() -> dict[threading.Thread, Owner]:
    """Threads of the standard library's process-lifetime helpers (``resource_sharer``)."""
    found: dict[threading.Thread, Owner] = {}
    sharer_module = sys.modules.get("multiprocessing.resource_sharer")
    sharer = getattr(sharer_module, "_resource_sharer", None)
    thread = getattr(sharer, "_thread", None)
    if isinstance(thread, threading.Thread):
        found[thread] = Owner("stdlib-helper", "multiprocessing.resource_sharer")
    return found


def _registry_ids() -> set[int]:
    ids: set[int] = set()
    for module_name, path in _REGISTRIES:
        obj: Any = sys.modules.get(module_name)
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        if obj is not None:
            ids.add(id(obj))
            data = getattr(obj, "data", None)  # WeakKeyDictionary and friends
            if data is not None:
                ids.add(id(data))
    return ids


#: A stack is no owner (a failed test's traceback holds its locals); a module is its namespace.
_NEVER_OWNERS = (types.FrameType, types.TracebackType, types.ModuleType)


def _is_tool_module(name: str) -> bool:
    return (
        name.partition(".")[0] in _TOOL_PACKAGES
        and not name.startswith(_CODE_UNDER_TEST)
        and name not in _SUITES_OWN_TOOL_MODULES
    )


def _is_a(obj: object, kinds: type | tuple[type, ...]) -> bool:
    """``isinstance`` by the real type: never calls a user's ``__class__``."""
    return issubclass(type(obj), kinds)


def _opaque(obj: object) -> bool:
    """An object whose ``__class__`` raises."""
    try:
        obj.__class__  # noqa: B018 - the lookup is the test
    except Exception:  # noqa: BLE001 - whatever the user's property raises
        return True
    return False


def _is_mock_class(obj: object) -> bool:
    """A ``unittest.mock`` class: its attributes are made on demand, so it owns nothing."""
    mock = sys.modules.get("unittest.mock")
    base = getattr(mock, "NonCallableMock", None)
    return base is not None and _is_a(obj, type) and issubclass(obj, base)  # type: ignore[arg-type]


def _is_tool_object(obj: object) -> bool:
    return _is_tool_module(getattr(type(obj), "__module__", None) or "")


def _edge(parent: object, child: object) -> str:
    if isinstance(parent, dict):
        for key, value in parent.items():
            if value is child:
                return f"[{key!r}]" if not isinstance(key, str) else f".{key}"
        return ".<key>"
    if isinstance(parent, (list, tuple)):
        for index, value in enumerate(parent):
            if value is child:
                return f"[{index}]"
    if isinstance(parent, (set, frozenset)):
        return "{item}"
    attrs = getattr(parent, "__dict__", None)
    if isinstance(attrs, dict):
        for key, value in attrs.items():
            if value is child:
                return f".{key}"
    if isinstance(parent, types.FunctionType):
        return ".<closure>"
    for klass in type(parent).__mro__:
        for slot in slot_names(klass):
            try:
                if getattr(parent, slot) is child:
                    return f".{slot}"
            except (AttributeError, TypeError):
                continue
    return f".<{type(parent).__name__}>"


def _render_path(chain: list[object]) -> str:
    """``chain``: owner first; instance dicts fold into their owner."""
    text = ""
    for parent, child in zip(chain, chain[1:], strict=False):
        if isinstance(child, dict) and (
            getattr(parent, "__dict__", None) is child or isinstance(parent, type)
        ):
            continue  # an instance or class dict: the next edge names the attribute
        text += _edge(parent, child)
    return text


def _owner(chain: list[object], kind: str, name: str, key: Any) -> Owner:
    if kind != "fixture" and len(chain) > 1:
        holder: Any = chain[0]
        below = chain[1]
        if isinstance(holder, type) and isinstance(below, dict) and len(chain) > 2:
            holder, below = dict(vars(holder)), chain[2]
        name += _edge(holder, below)
    return Owner(kind, name, _render_path(chain), key)


def find_owners(
    targets: Mapping[Any, object],
    fixture_roots: Mapping[int, tuple[Any, str, object]],
    *,
    max_depth: int = MAX_DEPTH,
    max_seconds: float = MAX_SECONDS,
    follow_starters: bool = True,
    shortcut: bool = True,
    walk: bool = True,
    near: Mapping[Any, Sequence[object]] | None = None,
) -> Owners:
    """The owner of each target (a thread, a Process/Popen); unowned ones are left out. Those
    whose walk a bound cut short with referrers unexplored are in the answer's ``uncertain``
    (reported, never stopped by fail mode).

    ``targets``: the caller's key -> the object to explain; ``fixture_roots``: ``id(value)`` of
    each live wider-scope fixture's value (and suspended generator) -> ``(key, name, value)``;
    ``near``: a key -> objects known to refer to its target directly (an ``atexit``
    registration's bound method), walked from the first pass on. ``shortcut``: forwards from
    the known owners first; ``walk``: False stops there. ``follow_starters``: an unowned thread
    started by a non-target thread gets that thread's owner.

    Frozen objects (``gc.freeze()``) are invisible to ``gc.get_referrers``: while more are frozen
    than at import (CPython 3.12.1 freezes 375 of its own), what is left is looked for forwards
    from the fixtures' values and the modules' globals.
    """
    if not targets:
        return Owners()
    _schedulers()
    deadline = time.monotonic() + max_seconds
    search = _Search(targets, fixture_roots)
    search.settle_fixture_values()
    forwards = shortcut and search.known_owners_first(max_depth)
    if not walk:
        search.answers.update(_import_owners(targets, search.answers))
        return Owners(search.answers)
    if near:
        search.take_near(near)
    search.walk(max_depth, deadline, forwards)
    return search.last_resorts(deadline, max_seconds, follow_starters)


class _Search:
    """The state of one :func:`find_owners` call. Each target's label is its index in ``keys``;
    each reached object carries the labels it leads to (``labels_of``) and, per label, the id
    it refers to on the way down (``parents``). The walk's own containers are in ``skip``."""

    def __init__(
        self,
        targets: Mapping[Any, object],
        fixture_roots: Mapping[int, tuple[Any, str, object]],
    ) -> None:
        self.targets = targets
        self.fixture_roots = fixture_roots
        self.modules, shared_skip = _namespaces()
        self.skip = set(shared_skip)  # the walk adds its own bookkeeping
        self.keys = list(targets)
        self.answers: dict[Any, Owner] = {}
        self.objects: dict[int, object] = {}
        self.parents: dict[int, dict[int, int]] = {}  # node id -> {label: id it refers to}
        self.labels_of: dict[int, frozenset[int]] = {}
        self.frontier: list[object] = []
        self.remembered = False  # a global or class attribute settled something this level
        # The keys too: a key ``(kind, thread)`` refers to its target and led the walk up
        # through them, a heap pass a level (a key that is a target stays walkable).
        target_ids = {id(target) for target in targets.values()}
        self.skip.update({id(targets), id(self.objects), id(self.frontier), id(self.keys)})
        self.skip.update(id(key) for key in self.keys if id(key) not in target_ids)
        for index, key in enumerate(self.keys):
            target = targets[key]
            known = self.labels_of.get(id(target))
            self.labels_of[id(target)] = frozenset({index}) | (known or frozenset())
            if known is None:
                self.objects[id(target)] = target
                self.parents[id(target)] = {}
                self.frontier.append(target)

    def unsettled(self) -> bool:
        return len(self.answers) < len(self.keys)

    def chain_from(self, node_id: int, label: int) -> list[object]:
        """The path from ``node_id`` down to the target of ``label``, owner first."""
        chain = []
        current: int | None = node_id
        while current is not None:
            chain.append(self.objects[current])
            current = self.parents[current].get(label)
        return chain

    def settle(self, node_id: int, kind: str, owner_name: str, key: Any) -> None:
        """``node_id`` owns every unanswered target it leads to; a global is remembered."""
        for label in self.labels_of[node_id]:
            if self.keys[label] not in self.answers:
                chain = self.chain_from(node_id, label)
                self.answers[self.keys[label]] = _owner(chain, kind, owner_name, key)
                if kind != "fixture":
                    _remember(kind, chain, owner_name)
                    self.remembered = True

    def unanswered(self, nodes: list[object]) -> list[object]:
        """The nodes that still lead to an unanswered target."""
        return [
            n for n in nodes if any(self.keys[i] not in self.answers for i in self.labels_of[id(n)])
        ]

    def settle_fixture_values(self) -> None:
        for node_id in list(self.objects):
            if node_id in self.fixture_roots:
                key, name, _value = self.fixture_roots[node_id]
                self.settle(node_id, "fixture", name, key)

    def known_owners_first(self, max_depth: int) -> bool:
        """:func:`_known_owners`; True when the fixtures' search was complete: then a global
        found during the walk may be searched forwards too (no fixture can own what is left)."""
        if not self.unsettled():
            return False
        left = {key: self.targets[key] for key in self.keys if key not in self.answers}
        found, complete = _known_owners(
            left, self.fixture_roots, self.modules, self.skip, max_depth
        )
        self.answers.update(found)
        del left  # it holds the targets: the walk would take it for a referrer
        self.frontier = self.unanswered(self.frontier)
        return complete

    def take(self, ref: Any, frontier_ids: AbstractSet[int], into: list[object]) -> None:
        """One referrer: settled when it is an owner, else walked next."""
        ref_id = id(ref)
        if not _walkable(ref, self.skip):
            return
        known = self.labels_of.get(ref_id, frozenset())
        links = self._links(ref, known, frontier_ids)
        if not links:
            return
        self.labels_of[ref_id] = known | frozenset(links)
        self.objects[ref_id] = ref
        self.parents.setdefault(ref_id, {}).update(links)
        if ref_id in self.fixture_roots:
            key, name, _value = self.fixture_roots[ref_id]
            self.settle(ref_id, "fixture", name, key)
        elif ref_id in self.modules:
            self.settle(ref_id, "module-global", self.modules[ref_id], None)
        elif _is_a(ref, type):
            self.settle(ref_id, "class-attribute", f"{ref.__module__}.{ref.__qualname__}", None)
        else:
            into.append(ref)

    def _links(
        self, ref: object, known: frozenset[int], frontier_ids: AbstractSet[int]
    ) -> dict[int, int]:
        """label -> id of the first frontier node ``ref`` refers to, per new unanswered label."""
        links: dict[int, int] = {}
        for child in gc.get_referents(ref):
            child_id = id(child)
            if child_id in frontier_ids:
                for label in self.labels_of[child_id]:
                    if label not in known and self.keys[label] not in self.answers:
                        links.setdefault(label, child_id)
        return links

    def take_near(self, near: Mapping[Any, Sequence[object]]) -> None:
        """Known referrers join the frontier as if a heap pass had found them."""
        self.skip.update({id(near), *(id(objs) for objs in near.values())})
        frontier_ids = {id(n) for n in self.frontier}
        for key in self.keys:
            if key in near and key not in self.answers:
                for ref in near[key]:
                    self.take(ref, frontier_ids, self.frontier)

    def walk(self, max_depth: int, deadline: float, forwards: bool) -> None:
        """Backwards, one heap pass a level, until all is answered or a bound is reached."""
        depth = 0
        while self.frontier and depth < max_depth and self.unsettled():
            if time.monotonic() > deadline or len(self.objects) > MAX_NODES:
                break
            depth += 1
            next_frontier = self.level()
            if forwards and self.remembered and self.unsettled():
                self.remembered = False
                next_frontier = self.follow_remembered(next_frontier, max_depth)
            self.frontier = next_frontier

    def level(self) -> list[object]:
        """One heap pass; returns the referrers to walk next."""
        frontier_ids = {id(n) for n in self.frontier}
        # The call's own argument tuple refers to the frontier: walked, it led to the next
        # level's, to max_depth. Its id is skipped; from 3.13 (fastcall) the call builds a new
        # tuple of the same objects, left out when only ``referrers`` holds it (refcount 3).
        args = tuple(self.frontier)
        referrers = gc.get_referrers(*args)
        next_frontier: list[object] = []
        self.skip.update({id(referrers), id(next_frontier), id(self.frontier), id(args)})
        for ref in referrers:
            if (
                type(ref) is tuple
                and len(ref) == len(args)
                and sys.getrefcount(ref) <= 3
                and all(a is b for a, b in zip(ref, args, strict=True))
            ):
                continue
            self.take(ref, frontier_ids, next_frontier)
        del referrers
        return next_frontier

    def follow_remembered(self, next_frontier: list[object], max_depth: int) -> list[object]:
        """Forwards from the remembered owners for the rest (no heap pass)."""
        keys, targets = self.keys, self.targets
        wanted = {id(targets[key]): targets[key] for key in keys if key not in self.answers}
        found = _remembered_owners(wanted, self.skip | {id(wanted)}, self.modules, max_depth)
        for key in keys:
            if key not in self.answers and id(targets[key]) in found:
                self.answers[key] = found[id(targets[key])]
        return self.unanswered(next_frontier)

    def last_resorts(self, deadline: float, max_seconds: float, follow_starters: bool) -> Owners:
        """For what is left: forwards while gc is frozen, the import that created it, the owner
        of the thread that started it."""
        keys, targets, answers = self.keys, self.targets, self.answers
        if self.unsettled() and gc.get_freeze_count() > _FROZEN_AT_IMPORT:
            left = {key: targets[key] for key in keys if key not in answers}
            answers.update(
                _forward_owners(left, self.fixture_roots, self.modules, deadline + max_seconds)
            )
        if self.unsettled():
            answers.update(_import_owners(targets, answers))
        if follow_starters and self.unsettled():
            answers.update(
                _owners_through_starters(targets, answers, self.fixture_roots, max_seconds)
            )
        owners = Owners(answers)
        if self.frontier:  # referrers left unexplored: no owner found is not "none"
            owners.uncertain = frozenset(key for key in keys if key not in answers)
        return owners


#: asyncio's event loops, handles and futures once asyncio is loaded (:func:`_schedulers`).
_SCHEDULERS: tuple[type, ...] = ()


def _schedulers() -> tuple[type, ...]:
    """asyncio's event loops, callback handles and futures (tasks among them), once asyncio is
    loaded (never imported here): never owners, never walked through. A loop references every
    callback scheduled on it, a future every callback waiting for it (a task's wake-up): they
    schedule and wait, they own nothing; walking through them made a session loop's fixture
    the owner of every task pending on that loop."""
    global _SCHEDULERS
    if not _SCHEDULERS:
        events, futures = sys.modules.get("asyncio.events"), sys.modules.get("asyncio.futures")
        if events is not None and futures is not None:
            found = [events.AbstractEventLoop, events.Handle, futures.Future]
            python_future = getattr(futures, "_PyFuture", None)
            if isinstance(python_future, type) and python_future is not futures.Future:
                found.append(python_future)
            _SCHEDULERS = tuple(found)
    return _SCHEDULERS


def _walkable(ref: object, skip: AbstractSet[int]) -> bool:
    """Whether the backward walk may pass through (or stop at) ``ref`` (never asyncio's
    scheduling: :func:`_schedulers`)."""
    if id(ref) in skip or _is_a(ref, _NEVER_OWNERS) or _is_tool_object(ref) or _opaque(ref):
        return False
    if _SCHEDULERS and _is_a(ref, _SCHEDULERS):
        return False
    return not _is_mock_class(ref)


class Owners(dict):  # type: ignore[type-arg]
    """:func:`find_owners`' answer; ``uncertain``: keys whose search was cut short."""

    uncertain: frozenset[Any] = frozenset()


def _import_owners(targets: Mapping[Any, object], answers: Mapping[Any, Owner]) -> dict[Any, Owner]:
    found: dict[Any, Owner] = {}
    for key, target in targets.items():
        module = None if key in answers else origins.imported_by(target)
        if module is not None:
            found[key] = Owner("import", module, f"created while {module} was being imported")
    return found


def _namespaces() -> tuple[dict[int, str], set[int]]:
    """Non-tool namespace ids -> module names, and the ids never walked (once per moment)."""
    return reading("module_namespaces", _read_namespaces)


def _read_namespaces() -> tuple[dict[int, str], set[int]]:
    modules: dict[int, str] = {}
    skip: set[int] = _registry_ids()
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict):
            if _is_tool_module(name):
                skip.add(id(namespace))
            else:
                modules[id(namespace)] = name
    return modules, skip


def module_holding(value: object) -> str | None:
    """The name of a loaded module (not a test tool's) that holds ``value`` itself as one of its
    globals, or None: one pass over the modules' namespaces, no heap pass."""
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and not _is_tool_module(name):
            if any(held is value for held in list(namespace.values())):
                return name
    return None


def reached_by_recent_owners(pick: Callable[[object], bool]) -> list[object]:
    """The objects ``pick`` accepts that a remembered owner reaches forwards (no heap pass): held
    by something that outlives the test. What it misses may be held by anything."""
    if not _recent:
        return []
    modules, skip = _namespaces()
    found: dict[int, object] = {}
    for entry in reversed(list(_recent)):
        root = _remembered_root(entry, modules)
        if root is not None:
            value, prefix = root[0], root[1]
            reached = _reached_from(value, {}, skip, modules, MAX_DEPTH - len(prefix), pick)
            found.update((key, chain[-1]) for key, chain in reached.items())
    return list(found.values())


def _remember(kind: str, chain: list[object], owner_name: str) -> None:
    holder: Any = chain[0]
    below = {id(obj) for obj in chain[1:3]}
    where: Any
    try:
        if kind == "module-global" and isinstance(holder, dict):
            what, where, items = "module", owner_name, list(holder.items())
        elif kind == "class-attribute" and isinstance(holder, type):
            what, where, items = "class", weakref.ref(holder), list(vars(holder).items())
        else:
            return
        name = next((k for k, v in items if id(v) in below and isinstance(k, str)), None)
    except Exception:  # noqa: BLE001 - a hostile class: nothing remembered
        return
    if name is None:
        return
    entry = (what, where, name)
    _recent[entry] = None
    _recent.move_to_end(entry)
    while len(_recent) > RECENT_OWNERS:
        _recent.popitem(last=False)


def forget_recent_owners() -> None:
    """Forget the remembered owners (tests)."""
    _recent.clear()


def _stops(obj: object, skip: set[int], modules: Mapping[int, str]) -> bool:
    """Where a forward search stops, as the backward walk does (a namespace is another owner)."""
    return (
        id(obj) in skip
        or id(obj) in modules
        or _is_a(obj, (type, *_NEVER_OWNERS, *_SCHEDULERS))
        or _is_tool_object(obj)
        or _opaque(obj)
    )


def _forward(
    root: object,
    wanted: Mapping[int, object],
    skip: set[int],
    modules: Mapping[int, str],
    max_depth: int,
    budget: int,
    *,
    pick: Callable[[object], bool] | None = None,
    shared: set[int] | None = None,
    not_through: tuple[type, ...] = (),
) -> tuple[dict[int, list[object]], bool]:
    """Breadth-first along ``gc.get_referents``: id of each wanted (or picked) object reached ->
    the shortest chain from ``root``; False when ``budget`` cut it short. Several roots may
    share ``shared``, the ids visited (and the budget)."""
    parent: dict[int, tuple[int, object] | None] = {id(root): None}
    seen: set[int] | dict[int, tuple[int, object] | None] = parent
    if shared is not None:
        shared.add(id(root))
        seen = shared  # holds every id parent gets
    level = [root]
    reached: dict[int, list[object]] = {}
    for _depth in range(max_depth):
        next_level: list[object] = []
        for node in level:
            for child in gc.get_referents(node):
                child_id = id(child)
                if child_id in seen or _stops(child, skip, modules):
                    continue
                if not_through and _is_a(child, not_through):
                    continue
                parent[child_id] = (id(node), node)
                if shared is not None:
                    shared.add(child_id)
                next_level.append(child)
                if child_id in wanted or (pick is not None and pick(child)):
                    chain = [child]
                    link = parent[child_id]
                    while link is not None:
                        chain.append(link[1])
                        link = parent[link[0]]
                    reached[child_id] = chain[::-1]
                if len(seen) > budget:
                    return reached, False
        level = next_level
    return reached, True  # all within max_depth seen: the backward walk sees no farther


def _known_owners(
    targets: Mapping[Any, object],
    fixture_roots: Mapping[int, tuple[Any, str, object]],
    modules: Mapping[int, str],
    skip: set[int],
    max_depth: int,
) -> tuple[dict[Any, Owner], bool]:
    """Owners found forwards: the nearest fixture value, else a remembered owner (most recent
    first), else a creation site's module; and whether the fixtures' search was complete (if
    not, it might have reached any target: nothing is answered)."""
    wanted = {id(target): target for target in targets.values()}
    skip = skip | {id(wanted), id(targets)}
    by_id: dict[int, Owner] = {}
    lengths: dict[int, int] = {}
    for key, name, value in fixture_roots.values():
        if _stops(value, skip, modules):
            continue
        reached, complete = _forward(value, wanted, skip, modules, max_depth, SHORTCUT_NODES)
        if not complete:
            return {}, False
        for target_id, chain in reached.items():
            if len(chain) < lengths.get(target_id, max_depth + 2):
                lengths[target_id] = len(chain)
                by_id[target_id] = _owner(chain, "fixture", name, key)
    for target_id in by_id:
        wanted.pop(target_id, None)
    by_id.update(_remembered_owners(wanted, skip, modules, max_depth))
    if wanted:
        by_id.update(_creation_site_owners(wanted, skip, modules, max_depth))
    return {key: by_id[id(t)] for key, t in targets.items() if id(t) in by_id}, True


def _remembered_owners(
    wanted: dict[int, object], skip: set[int], modules: Mapping[int, str], max_depth: int
) -> dict[int, Owner]:
    """Owners found forwards from the remembered owners; what they reach leaves ``wanted``."""
    by_id: dict[int, Owner] = {}
    for entry in reversed(list(_recent)):
        if not wanted:
            break
        root = _remembered_root(entry, modules)
        if root is None:
            continue
        value, prefix, kind, owner_name = root
        reached = _reached_from(value, wanted, skip, modules, max_depth - len(prefix))
        for target_id, chain in reached.items():
            by_id[target_id] = _owner([*prefix, *chain], kind, owner_name, None)
            wanted.pop(target_id, None)
        if reached:
            _recent.move_to_end(entry)
    return by_id


def _creation_site_owners(
    wanted: dict[int, object], skip: set[int], modules: Mapping[int, str], max_depth: int
) -> dict[int, Owner]:
    """Owners found forwards from the globals and classes of the creation sites' modules."""
    files: dict[str, None] = {}
    for target in wanted.values():
        origin = origins.origin_of(target)
        if origin is not None:
            files.update((frame[0], None) for frame in origin.frames if frame[3])
    if not files:
        return {}
    by_id: dict[int, Owner] = {}
    visited: set[int] = set()  # one budget for every root
    for filename in files:
        found = _module_of_file(filename, modules)
        if found is None:
            continue
        namespace, module_name = found
        roots: list[tuple[object, str, str]] = [(namespace, "module-global", module_name)]
        for value in list(namespace.values()):
            if _is_a(value, type) and vars(value).get("__module__") == module_name:
                roots.append((value, "class-attribute", f"{module_name}.{value.__qualname__}"))
        for root, kind, owner_name in roots:
            if not wanted:
                return by_id
            reached, complete = _forward(
                root,
                wanted,
                skip,
                modules,
                max_depth,
                SHORTCUT_NODES,
                shared=visited,
                not_through=_CODE_TYPES,
            )
            for target_id, chain in reached.items():
                by_id[target_id] = _owner(chain, kind, owner_name, None)
                wanted.pop(target_id, None)
                _remember(kind, chain, owner_name)
            if not complete:
                return by_id  # the budget is spent: the backward walk decides the rest
    return by_id


#: Not walked through from a creation site's module: most of what it holds, rarely an owner (the
#: backward walk still finds one).
_CODE_TYPES = (types.FunctionType, types.MethodType, staticmethod, classmethod, property)


#: Source file -> module name, and ``sys.modules``' size and (weakly) last module when read:
#: reading ``sys.modules`` at every search took a third of its time.
_modules_by_file: dict[str, str] = {}
_modules_by_file_mark: tuple[int, weakref.ref[Any] | None] = (-1, None)


def _sys_modules_unchanged_since(mark: tuple[int, weakref.ref[Any] | None]) -> bool:
    """As many modules, the same last one (by identity: pytester reloads under the same name)."""
    size, last = mark
    if last is None or size != len(sys.modules):
        return False
    last_name = next(reversed(sys.modules), None)
    module = last()
    return module is not None and last_name is not None and module is sys.modules.get(last_name)


def _mark_of_sys_modules() -> tuple[int, weakref.ref[Any] | None]:
    last_name = next(reversed(sys.modules), None)
    try:
        last = weakref.ref(sys.modules[last_name]) if last_name is not None else None
    except TypeError:  # not weakly referable: read again
        last = None
    return len(sys.modules), last


def _module_of_file(filename: str, modules: Mapping[int, str]) -> tuple[dict[str, Any], str] | None:
    """The namespace and name of the non-tool module loaded from ``filename``, if any."""
    global _modules_by_file_mark
    name = _modules_by_file.get(filename)
    if name is None and not _sys_modules_unchanged_since(_modules_by_file_mark):
        _modules_by_file.clear()
        _modules_by_file_mark = _mark_of_sys_modules()
        for module_name, loaded in list(sys.modules.items()):
            module_file = getattr(loaded, "__file__", None)
            if isinstance(module_file, str):
                _modules_by_file[module_file] = module_name
        name = _modules_by_file.get(filename)
    if name is None:
        return None
    module = sys.modules.get(name)
    namespace = getattr(module, "__dict__", None)
    if (
        not isinstance(namespace, dict)
        or id(namespace) not in modules
        or getattr(module, "__file__", None) != filename
    ):
        return None
    return namespace, name


def _reached_from(
    value: object,
    wanted: Mapping[int, object],
    skip: set[int],
    modules: Mapping[int, str],
    max_depth: int,
    pick: Callable[[object], bool] | None = None,
) -> dict[int, list[object]]:
    """What ``value`` reaches of ``wanted`` (or ``pick``), itself included: id -> chain."""
    reached: dict[int, list[object]] = {}
    if not _stops(value, skip, modules):
        reached, _complete = _forward(
            value, wanted, skip, modules, max_depth, SHORTCUT_NODES, pick=pick
        )
    if id(value) in wanted or (pick is not None and pick(value)):
        reached[id(value)] = [value]
    return reached


def _remembered_root(
    entry: tuple[str, Any, str], modules: Mapping[int, str]
) -> tuple[object, list[object], str, str] | None:
    """(value now, chain above it, kind, owner name); None when gone or a test tool's."""
    what, where, name = entry
    if what == "module":
        namespace = getattr(sys.modules.get(where), "__dict__", None)
        if not isinstance(namespace, dict) or id(namespace) not in modules:
            return None
        if name not in namespace:
            return None
        return namespace[name], [namespace], "module-global", where
    cls = where()
    if cls is None:
        return None
    try:
        attrs = vars(cls)
        if name not in attrs:
            return None
        value = attrs[name]
        owner_name = f"{cls.__module__}.{cls.__qualname__}"
    except Exception:  # noqa: BLE001 - a hostile class
        return None
    return value, [cls, {name: value}], "class-attribute", owner_name


def _owners_through_starters(
    targets: Mapping[Any, object],
    answers: Mapping[Any, Owner],
    fixture_roots: Mapping[int, tuple[Any, str, object]],
    max_seconds: float,
) -> dict[Any, Owner]:
    starters: dict[Any, threading.Thread] = {}
    explained = {id(obj) for obj in targets.values()}  # keys may be (kind, item) pairs
    for key, target in targets.items():
        if key in answers or not _is_a(target, threading.Thread):
            continue
        starter = origins.starter_of(target)  # type: ignore[arg-type]
        if starter is not None and id(starter) not in explained and starter.is_alive():
            starters[key] = starter
    if not starters:
        return {}
    owners = find_owners(
        {s: s for s in set(starters.values())},
        fixture_roots,
        max_seconds=max_seconds,
        follow_starters=False,
    )
    found: dict[Any, Owner] = {}
    for key, starter in starters.items():
        owner = owners.get(starter)
        if owner is not None:
            try:
                via = f" (started by its thread {starter.name!r})"
            except Exception:  # noqa: BLE001 - a subclass's hostile name
                via = " (started by one of its threads)"
            found[key] = Owner(owner.kind, owner.name, owner.path + via, owner.key)
    return found


_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep


def _module_rank(namespace: dict[str, Any]) -> int:
    filename = str(namespace.get("__file__") or "")
    if "site-packages" in filename or "dist-packages" in filename:
        return 1
    if not filename or not filename.startswith(_STDLIB_DIR):
        return 0
    return 2


def _forward_owners(
    targets: Mapping[Any, object],
    fixture_roots: Mapping[int, tuple[Any, str, object]],
    modules: Mapping[int, str],
    deadline: float,
) -> dict[Any, Owner]:
    """Forwards from the fixtures, then the modules' globals, one visited set and budget."""
    from pytest_shutdown.ownership.backrefs import _edges  # noqa: PLC0415 - only when frozen

    wanted: dict[int, list[Any]] = {}
    for key, target in targets.items():
        wanted.setdefault(id(target), []).append(key)
    roots: list[tuple[object, str, str, Any]] = [
        (value, "fixture", name, key) for key, name, value in fixture_roots.values()
    ]
    namespaces = [m.__dict__ for m in list(sys.modules.values()) if hasattr(m, "__dict__")]
    loaded = {id(namespace): namespace for namespace in namespaces}
    module_roots = [
        (loaded[i], "module-global", name, None) for i, name in modules.items() if i in loaded
    ]
    # The suite's own modules first, the standard library last: where owners usually are.
    module_roots.sort(key=lambda root: _module_rank(root[0]))
    roots.extend(module_roots)
    answers: dict[Any, Owner] = {}
    seen: set[int] = _registry_ids()  # the bookkeeping registries own nothing
    visited = 0
    for root, kind, name, key in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        queue: collections.deque[tuple[object, str, str]] = collections.deque([(root, "", "")])
        while queue and visited < MAX_NODES and len(answers) < len(targets):
            if visited % 1000 == 0 and time.monotonic() > deadline:
                return answers
            node, path, attribute = queue.popleft()
            visited += 1
            for label, child in _edges(node):
                child_id = id(child)
                if child_id in seen:
                    continue
                seen.add(child_id)
                first = attribute or (f".{label[2:-2]}" if label.startswith("['") else label)
                if child_id in wanted:
                    owner_name = name if kind == "fixture" else name + first
                    for target_key in wanted[child_id]:
                        answers.setdefault(target_key, Owner(kind, owner_name, path + label, key))
                if _opaque(child) or _is_a(child, (type, types.ModuleType)):
                    continue
                if not _is_tool_object(child):
                    queue.append((child, path + label, first))
    return answers


def objects_of(
    threads: Iterable[threading.Thread], pids: Iterable[int], parents: Mapping[int, int]
) -> dict[Any, object]:
    """Each thread itself; for a pid, the Process/Popen object of it or of its nearest
    recorded ancestor (``parents``: pid -> ppid)."""
    found: dict[Any, object] = {thread: thread for thread in threads}
    for pid in pids:
        current: int | None = pid
        for _ in range(16):
            if current is None:
                break
            obj = origins.process_object(current)
            if obj is not None:
                found[pid] = obj
                break
            current = parents.get(current)
    return found


def singleton_slot(origin: origins.Origin | None, obj: object) -> tuple[Owner, object] | None:
    """The class attribute or module global the code that created ``obj`` assigned it to (a
    singleton: tqdm's ``cls.monitor = TMonitor(cls, ...)``), read from the source line of the
    first user frame of ``origin`` outside ``obj``'s own methods; None otherwise. Returned with
    what the slot holds now (maybe ``obj`` no more: the library released its singleton)."""
    if origin is None:
        return None
    classes = type(obj).__mro__[:-1]
    own = {getattr(klass, "__qualname__", "") + "." for klass in classes}
    # Before 3.11 a frame has no co_qualname: a method is told by its code's file and lines.
    spans = [span for klass in classes for span in _method_spans(klass)]
    for filename, lineno, qualname, is_user in origin.frames:
        if not is_user:
            continue
        if any(qualname.startswith(prefix) for prefix in own) or any(
            filename == file and first <= lineno <= last for file, first, last in spans
        ):
            continue  # the object's own method
        return _assigned_slot(filename, lineno, qualname)
    return None


def _method_spans(klass: type) -> list[tuple[str, int, int]]:
    spans = []
    for value in vars(klass).values():
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is None:
            continue
        lines = [line for _, _, line in code.co_lines() if line is not None]
        if lines:
            spans.append((code.co_filename, code.co_firstlineno, max(lines)))
    return spans


def _assigned_slot(filename: str, lineno: int, qualname: str) -> tuple[Owner, object] | None:
    import ast  # noqa: PLC0415 - only for an atexit registration left after a test
    import linecache  # noqa: PLC0415

    line = linecache.getline(filename, lineno).strip()
    try:
        statement = ast.parse(line).body[0] if line else None
    except (SyntaxError, IndexError, ValueError):
        return None  # a statement over several lines: not read
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    else:
        return None
    found = _module_of_file(filename, _namespaces()[0])
    if found is None:
        return None
    namespace, module_name = found
    for target in targets:
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            holder = target.value.id
            if holder == "cls" and "." in qualname:
                holder = qualname.rsplit(".", 2)[-2]  # the classmethod's class
            klass = namespace.get(holder)
            if _is_a(klass, type):
                owner = Owner(
                    "class-attribute",
                    f"{module_name}.{klass.__qualname__}.{target.attr}",  # type: ignore[union-attr]
                    f"assigned at {filename}:{lineno}",
                )
                return owner, vars(klass).get(target.attr)
        elif isinstance(target, ast.Name) and target.id in namespace:
            if qualname == "<module>" or target.id in _declared_global(namespace, qualname):
                where = f"assigned at {filename}:{lineno}"
                owner = Owner("module-global", f"{module_name}.{target.id}", where)
                return owner, namespace.get(target.id)
    return None


def _declared_global(namespace: dict[str, Any], qualname: str) -> frozenset[str]:
    """The names the function ``qualname`` of the module declares ``global``."""
    obj: Any = namespace.get(qualname.split(".")[0])
    for part in qualname.split(".")[1:]:
        obj = getattr(obj, part, None)
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    if code is None:
        return frozenset()
    # A global assigned in it is in co_names (STORE_GLOBAL), not in co_varnames.
    return frozenset(n for n in code.co_names if n not in code.co_varnames)
