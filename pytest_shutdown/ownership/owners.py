"""Whose is it? The owner of a thread or child process that outlives a test.

A thread or process alive after a test is the test's leak only when nothing that outlives the
test reaches it. Owners, narrowest first:

* a wider-scope fixture's value (or the suspended generator of a yield fixture), directly or
  through the objects it holds (an executor's worker set, an engine's renderer pool);
* a module global or a class attribute (a singleton pool, a pool created at import);
* a process-lifetime helper of the standard library (multiprocessing's fork server and resource
  tracker, the ``resource_sharer`` listener thread);
* the import of a module: what a module's top-level code created while it was being imported
  (its recorded creation site ran under the import machinery, see
  :func:`pytest_shutdown.ownership.origins.imported_by`) lives as long as the module, whichever test
  happened to import it first. It is the answer of last resort: a fixture, global or class
  attribute that reaches the object is named instead.

:func:`find_owners` answers for a set of suspects at once, walking *backwards* through
``gc.get_referrers`` one level at a time (one heap scan per level, not per object), from the
``threading.Thread`` objects and from the ``multiprocessing.Process`` / ``subprocess.Popen``
objects of the child processes (see :mod:`pytest_shutdown.ownership.origins`). The walk never passes
through frames, tracebacks, the test tools' objects (a test item's ``funcargs`` is the test's,
not an owner) or the standard library's bookkeeping registries (``threading._active``,
``multiprocessing.process._children``, cleanup registries such as ``weakref.finalize``'s), and
it is bounded by depth, node count and time: a walk that gives up leaves the suspect unowned.
It is only called when something new is still alive after a test.

Each backward level is a pass over the whole heap. Before the walk, forward searches along
``gc.get_referents`` (bounded, the same objects excluded) try the live wider-scope fixtures'
values and the module globals and class attributes that owned something lately: a reusable
executor owning its new workers test after test is answered without a heap pass, and a claim
is only ever made along a live reference path from the owner.
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

from pytest_shutdown import _FROZEN_AT_IMPORT
from pytest_shutdown._base.lazy_dataclass import lazy_dataclass
from pytest_shutdown._os.moments import reading
from pytest_shutdown.ownership import origins

__all__ = ["Owner", "find_owners", "singleton_slot", "stdlib_helper_threads"]

#: Levels walked backwards at most (an engine's pool is about ten references deep).
MAX_DEPTH = 14
#: Objects visited at most.
MAX_NODES = 50_000
#: Seconds the walk may take.
MAX_SECONDS = 2.0

#: Module globals remembered as owners (the most recent last), tried first by a forward search.
RECENT_OWNERS = 8
#: Objects the forward search from remembered owners (and from the fixtures' values) visits at
#: most, before the backward walk takes over.
SHORTCUT_NODES = 5_000

#: The module globals (``("module", module name, global's name)``) and class attributes
#: (``("class", weak reference to the class, attribute)``) that owned something lately, the most
#: recent last: a reusable executor (loky's, joblib's) or a class's monitor thread (tqdm's) owns
#: the new workers, threads and pipes of test after test, and a forward search from it (a few
#: hundred objects) answers where each level of the backward walk is a pass over the whole heap
#: (~10 ms with numpy loaded).
_recent: collections.OrderedDict[tuple[str, Any, str], None] = collections.OrderedDict()

#: Objects of these top-level packages are never owners and are not walked through.
_TOOL_PACKAGES = frozenset(
    {"_pytest", "pytest", "pluggy", "pytest_shutdown", "xdist", "execnet", "pytest_timeout"}
)
#: ... except the reference engine: its objects own pools like any engine's; and the
#: ``ray_cluster`` fixture's value: it holds the replacement node's process tree, the
#: fixture's (a walk stopped at it blamed that tree on the test that called ``restore()``).
_CODE_UNDER_TEST = ("pytest_shutdown.engine", "pytest_shutdown.ray_cluster")
#: ... and execnet's master side: only a test suite makes a ``Group`` or a ``Gateway`` in a
#: process that runs tests (an xdist worker's own gateway is ``execnet.gateway_base``'s). A
#: session fixture's group owns the gateways a function fixture makes (execnet's own suite):
#: walking through them finds that owner, where skipping them made fail mode kill the gateway
#: under every later test.
_SUITES_OWN_TOOL_MODULES = frozenset(
    {"execnet.multi", "execnet.gateway", "execnet.gateway_io", "execnet.xspec", "execnet.rsync"}
)

#: (module, attribute path) of the standard library's registries: they reference every thread or
#: process (or cleanup) by design and own nothing.
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
    or ``"import"``; ``name``: the fixture name, ``module.attribute``, ``Class.attribute``, the
    helper or the module whose import created it;
    ``path``: the reference path from the owner down to the thread or process object.
    ``key`` is the caller's handle of a fixture owner (not rendered).
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


#: Never owners and never walked through: a frame or traceback is a stack, not an owner (a failed
#: test's traceback holds its locals); a module is reached through its namespace dict.
_NEVER_OWNERS = (types.FrameType, types.TracebackType, types.ModuleType)


def _is_tool_module(name: str) -> bool:
    """The test tools' modules; the bundled reference engine is code under test, not a tool."""
    return (
        name.partition(".")[0] in _TOOL_PACKAGES
        and not name.startswith(_CODE_UNDER_TEST)
        and name not in _SUITES_OWN_TOOL_MODULES
    )


def _is_a(obj: object, kinds: type | tuple[type, ...]) -> bool:
    """``isinstance`` by the object's real type: never calls a ``__class__`` of the user's."""
    return issubclass(type(obj), kinds)


def _opaque(obj: object) -> bool:
    """An object whose ``__class__`` raises: never walked through, never an owner."""
    try:
        obj.__class__  # noqa: B018 - the lookup is the test
    except Exception:  # noqa: BLE001 - whatever the user's property raises
        return True
    return False


def _is_mock_class(obj: object) -> bool:
    """A ``unittest.mock`` class (``NonCallableMock`` and its subclasses, each mock's own
    subclass among them): never an owner, never walked through. A mock fabricates attributes on
    demand (``MagicMock.__aiter__``, ``_mock_children``), so reaching a test's object through one
    says nothing about what outlives the test: mocks are never owners."""
    mock = sys.modules.get("unittest.mock")
    base = getattr(mock, "NonCallableMock", None)
    return base is not None and _is_a(obj, type) and issubclass(obj, base)  # type: ignore[arg-type]


def _is_tool_object(obj: object) -> bool:
    return _is_tool_module(getattr(type(obj), "__module__", None) or "")


def _edge(parent: object, child: object) -> str:
    """How ``parent`` refers to ``child``, as a short label."""
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
        for slot in klass.__dict__.get("__slots__", ()) or ():
            try:
                if getattr(parent, slot) is child:
                    return f".{slot}"
            except (AttributeError, TypeError):
                continue
    return f".<{type(parent).__name__}>"


def _render_path(chain: list[object]) -> str:
    """``chain`` runs from the owner down to the target; instance dicts fold into their owner."""
    text = ""
    for parent, child in zip(chain, chain[1:], strict=False):
        if isinstance(child, dict) and (
            getattr(parent, "__dict__", None) is child or isinstance(parent, type)
        ):
            continue  # an instance or class dict: the next edge names the attribute
        text += _edge(parent, child)
    return text


def _owner(chain: list[object], kind: str, name: str, key: Any) -> Owner:
    """The owner at ``chain[0]``; ``name`` gets the attribute that holds the next object."""
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
    max_nodes: int = MAX_NODES,
    max_seconds: float = MAX_SECONDS,
    follow_starters: bool = True,
    shortcut: bool = True,
    walk: bool = True,
    near: Mapping[Any, Sequence[object]] | None = None,
) -> Owners:
    """Find the owner of each target object (a thread, a Process/Popen); unowned ones are left
    out of the answer. Those whose backward walk was cut short by the bounds (time, nodes,
    depth) with referrers still unexplored are in the answer's ``uncertain``: reported, never
    stopped by fail mode.

    First, without a heap pass (``shortcut``): forwards from each live wider-scope fixture's
    value, then from the module globals and class attributes that owned something lately
    (:func:`_known_owners`); then, for what is left (unless ``walk`` is False), backwards.

    A thread that nothing reaches, started by another thread that is not among the targets (a
    pool's manager thread starting a feeder thread), belongs to that thread's owner, if it has
    one (``follow_starters``).

    ``targets`` maps the caller's key (a thread, a pid) to the object to explain;
    ``fixture_roots`` maps ``id(value)`` of each live wider-scope fixture's value (and of its
    suspended generator) to ``(key, name, value)``; ``near`` maps a key to objects known to
    refer to its target directly (the bound method an ``atexit`` registration holds): they are
    walked from the first heap pass on, with the targets, which saves the pass that would find
    them (what is not a direct referrer of the target is ignored).

    Objects in gc's permanent generation (after a ``gc.freeze()``, as engines do after start-up)
    are invisible to ``gc.get_referrers``; while a freeze is in place (more frozen than when the
    package was imported: CPython 3.12.1 starts with 375 frozen objects of its own), what the
    backward walk left unowned is looked for *forwards* from the fixtures' values and the
    modules' globals.
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
    search.walk(max_depth, max_nodes, deadline, forwards)
    return search.last_resorts(deadline, max_seconds, follow_starters)


class _Search:
    """The state of one :func:`find_owners` call, one method per step.

    Each target gets a label (its index in ``keys``); every object the backward walk reaches
    carries the labels of the targets it leads to (``labels_of``) and, per label, the id of the
    object it refers to on the way down (``parents``): the reference path from an owner to a
    target is read back from there (:meth:`chain_from`). The walk's own bookkeeping refers to the
    objects it walks, so each container of it is in ``skip`` and can never read as an owner."""

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
        #: A global or class attribute settled something in this level (worth a forward look).
        self.remembered = False
        # The keys too: a caller's key ``(kind, thread)`` refers to its target, and the list of
        # keys, held by the search itself, led the walk up through them, a heap pass a
        # level. (A key that is a target itself stays walkable.)
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
        """The reference path from ``node_id`` down to the target of ``label``, owner first:
        each node's parent is the node it refers to."""
        chain = []
        current: int | None = node_id
        while current is not None:
            chain.append(self.objects[current])
            current = self.parents[current].get(label)
        return chain

    def settle(self, node_id: int, kind: str, owner_name: str, key: Any) -> None:
        """``node_id`` is an owner: it answers every unanswered target it leads to. A global
        or class attribute is remembered, so the next search tries it forwards first."""
        for label in self.labels_of[node_id]:
            if self.keys[label] not in self.answers:
                chain = self.chain_from(node_id, label)
                self.answers[self.keys[label]] = _owner(chain, kind, owner_name, key)
                if kind != "fixture":
                    _remember(kind, chain, owner_name)
                    self.remembered = True

    def unanswered(self, nodes: list[object]) -> list[object]:
        """The nodes that still lead to a target without an answer (the others are not walked
        on)."""
        return [
            n for n in nodes if any(self.keys[i] not in self.answers for i in self.labels_of[id(n)])
        ]

    def settle_fixture_values(self) -> None:
        """A target may itself be a fixture's value: the fixture owns it."""
        for node_id in list(self.objects):
            if node_id in self.fixture_roots:
                key, name, _value = self.fixture_roots[node_id]
                self.settle(node_id, "fixture", name, key)

    def known_owners_first(self, max_depth: int) -> bool:
        """Forwards from the fixtures' values and the remembered owners, without a heap pass
        (:func:`_known_owners`); the frontier keeps only what is still unanswered. True when the
        fixtures' search was complete: then a global found during the walk may be searched
        forwards too (no fixture can own what is left), a pool's pipes a level or three below
        the workers that led to it."""
        if not self.unsettled():
            return False
        left = {key: self.targets[key] for key in self.keys if key not in self.answers}
        found, complete = _known_owners(
            left, self.fixture_roots, self.modules, self.skip, max_depth
        )
        self.answers.update(found)
        del left  # it holds the targets: the walk would take it for a referrer of each
        self.frontier = self.unanswered(self.frontier)
        return complete

    def take(self, ref: Any, frontier_ids: AbstractSet[int], into: list[object]) -> None:
        """One referrer of the frontier: settled when it is an owner, else walked next."""
        ref_id = id(ref)
        if not _walkable(ref, self.skip):
            return
        # Which frontier nodes does it hold? It carries their unanswered labels.
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
        """label -> id of the frontier node ``ref`` refers to, for each unanswered label it
        does not carry yet (the first such node per label)."""
        links: dict[int, int] = {}
        for child in gc.get_referents(ref):
            child_id = id(child)
            if child_id in frontier_ids:
                for label in self.labels_of[child_id]:
                    if label not in known and self.keys[label] not in self.answers:
                        links.setdefault(label, child_id)
        return links

    def take_near(self, near: Mapping[Any, Sequence[object]]) -> None:
        """Known referrers join the frontier as if a heap pass had found them: the first pass
        then asks for their referrers too (one pass less for an atexit-held object)."""
        self.skip.update({id(near), *(id(objs) for objs in near.values())})
        frontier_ids = {id(n) for n in self.frontier}
        for key in self.keys:
            if key in near and key not in self.answers:
                for ref in near[key]:
                    self.take(ref, frontier_ids, self.frontier)

    def walk(self, max_depth: int, max_nodes: int, deadline: float, forwards: bool) -> None:
        """Backwards, one heap pass a level, until every target is answered, nothing is left
        to walk or a bound (depth, nodes, time) is reached."""
        depth = 0
        while self.frontier and depth < max_depth and self.unsettled():
            if time.monotonic() > deadline or len(self.objects) > max_nodes:
                break
            depth += 1
            next_frontier = self.level()
            if forwards and self.remembered and self.unsettled():
                self.remembered = False
                next_frontier = self.follow_remembered(next_frontier, max_depth)
            self.frontier = next_frontier

    def level(self) -> list[object]:
        """One heap pass: the referrers of the frontier, each taken (:meth:`take`); returns
        those to walk next."""
        frontier_ids = {id(n) for n in self.frontier}
        # The call's own argument tuple holds the frontier and is a (tracked) referrer of it:
        # walked, it led to the next level's argument tuple, and so on to max_depth (every
        # unowned target's walk took 14 heap passes). A call with an exact tuple passes that
        # very tuple, whose id is skipped. From Python 3.13 (a fastcall) the call builds a
        # new tuple of the same objects: one that nothing but ``referrers`` holds (the list,
        # ``ref`` and getrefcount's argument: 3) is left out too; a tuple someone else holds
        # is walked even when it holds just the frontier.
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
        """A global or class attribute settled something in this level: forwards from the
        remembered owners for the rest (no heap pass); the next frontier keeps only what is
        still unanswered."""
        keys, targets = self.keys, self.targets
        wanted = {id(targets[key]): targets[key] for key in keys if key not in self.answers}
        found = _remembered_owners(wanted, self.skip | {id(wanted)}, self.modules, max_depth)
        for key in keys:
            if key not in self.answers and id(targets[key]) in found:
                self.answers[key] = found[id(targets[key])]
        return self.unanswered(next_frontier)

    def last_resorts(self, deadline: float, max_seconds: float, follow_starters: bool) -> Owners:
        """What the backward walk left unowned: forwards while gc is frozen (a frozen object is
        invisible to ``gc.get_referrers``), then the import that created it, then the owner of
        the thread that started it; the answer, with the keys whose walk was cut short as
        ``uncertain``."""
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
    """Whether the backward walk may pass through (or stop at) ``ref``: not its own
    bookkeeping or a registry (``skip``), a frame, traceback or module, the test tools' object,
    an opaque object, a mock class or asyncio's scheduling (:func:`_schedulers`)."""
    if id(ref) in skip or _is_a(ref, _NEVER_OWNERS) or _is_tool_object(ref) or _opaque(ref):
        return False
    if _SCHEDULERS and _is_a(ref, _SCHEDULERS):
        return False
    return not _is_mock_class(ref)


class Owners(dict):  # type: ignore[type-arg]
    """:func:`find_owners`' answer: key -> :class:`Owner`; ``uncertain``: the keys without one
    whose search was cut short (fail mode reports them and stops nothing)."""

    uncertain: frozenset[Any] = frozenset()


def _import_owners(targets: Mapping[Any, object], answers: Mapping[Any, Owner]) -> dict[Any, Owner]:
    """The unanswered targets created while a module was being imported: that import's."""
    found: dict[Any, Owner] = {}
    for key, target in targets.items():
        if key in answers:
            continue
        module = origins.imported_by(target)
        if module is not None:
            found[key] = Owner("import", module, f"created while {module} was being imported")
    return found


def _namespaces() -> tuple[dict[int, str], set[int]]:
    """``id`` of each module namespace (not the test tools') -> module name; and the ids never
    walked through: the tools' namespaces and the standard library's registries. Read once per
    moment (a check asks several times: the fd kind, then each ownership search); callers
    must not change what they get."""
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


def reached_by_recent_owners(pick: Callable[[object], bool]) -> list[object]:
    """The objects ``pick`` accepts that a remembered module global or class attribute (one
    that owned something lately) reaches forwards, within the shortcut's bounds: no heap pass.

    What it returns is held by something that outlives the test; what it misses may be held by
    anything (the caller then scans the heap, as without it)."""
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
    """Remember the module global or class attribute at the top of ``chain`` (owner first)."""
    holder: Any = chain[0]
    below = {id(obj) for obj in chain[1:3]}
    entry: tuple[str, Any, str] | None = None
    try:
        if kind == "module-global" and isinstance(holder, dict):
            module_name = owner_name
            items = list(holder.items())
        elif kind == "class-attribute" and isinstance(holder, type):
            module_name = ""
            items = list(vars(holder).items())
        else:
            return
        name = next((k for k, v in items if id(v) in below and isinstance(k, str)), None)
        if name is None:
            return
        entry = (
            ("module", module_name, name)
            if kind == "module-global"
            else ("class", weakref.ref(holder), name)
        )
    except Exception:  # noqa: BLE001 - a hostile class: nothing remembered
        return
    _recent[entry] = None
    _recent.move_to_end(entry)
    while len(_recent) > RECENT_OWNERS:
        _recent.popitem(last=False)


def forget_recent_owners() -> None:
    """Forget the remembered owners (tests)."""
    _recent.clear()


def _stops(obj: object, skip: set[int], modules: Mapping[int, str]) -> bool:
    """Where a forward search stops, as the backward walk does: the bookkeeping registries,
    module namespaces (another owner), classes, frames, tracebacks, modules, the test tools'
    and opaque objects."""
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
    """Breadth-first along ``gc.get_referents`` from ``root`` (at most ``max_depth`` edges and
    ``budget`` objects): id of each wanted object reached (or of each one ``pick`` accepts) ->
    the chain from ``root`` down to it (the shortest); and False when the budget cut the search
    short. Searches from several roots may share ``shared``, the ids visited (and the budget):
    what one reached is not visited again from the next. Instances of ``not_through`` are not
    walked through."""
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
    """The owners found forwards, without a heap pass: a wider-scope fixture's value that
    reaches a target owns it (the narrowest owner; the nearest of several), else a remembered
    module global or class attribute that reaches it (the most recent first); and whether the
    fixtures' search was complete.

    A fixture search cut short by the bounds might have reached any target: then nothing is
    answered here (the backward walk decides all). What no known owner reaches is left to the
    backward walk."""
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
    """Owners (by target id) found forwards from the remembered module globals and class
    attributes, the most recent first; what they reach leaves ``wanted``."""
    by_id: dict[int, Owner] = {}
    for entry in reversed(list(_recent)):
        if not wanted:
            break
        found = _from_remembered(entry, wanted, skip, modules, max_depth)
        for target_id, owner in found.items():
            by_id[target_id] = owner
            wanted.pop(target_id, None)
        if found:
            _recent.move_to_end(entry)
    return by_id


def _creation_site_owners(
    wanted: dict[int, object], skip: set[int], modules: Mapping[int, str], max_depth: int
) -> dict[int, Owner]:
    """Owners (by target id) found forwards from the modules whose code started a wanted
    thread or process (the user frames of its recorded creation site): their globals, and the
    attributes of the classes they define (a library's monitor thread in a class attribute,
    its reusable executor in a global), the first time they own something, with no heap pass.
    What is found is remembered; what they do not reach leaves ``wanted`` to the backward
    walk."""
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


#: Not walked through from a creation site's module: its functions and methods are most of what
#: its namespace and classes hold, and a thread one holds (in a closure or a default) is rare; the
#: backward walk still finds it.
_CODE_TYPES = (types.FunctionType, types.MethodType, staticmethod, classmethod, property)


#: Source file -> name of the module loaded from it, and what ``sys.modules`` looked like when it
#: was read (its size and, weakly, its last module): a creation site's file is looked up at every
#: search, and reading ``sys.modules`` for it took a third of a search's time.
_modules_by_file: dict[str, str] = {}
_modules_by_file_mark: tuple[int, weakref.ref[Any] | None] = (-1, None)


def _sys_modules_unchanged_since(mark: tuple[int, weakref.ref[Any] | None]) -> bool:
    """Whether ``sys.modules`` still looks as it did at ``mark``: as many modules, the same
    last one. A module imported since is the last one; one removed changes the size; one
    removed and loaded again under its name (pytester's test modules) is another object, which
    is why the last module is compared by identity, not by name."""
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
    except TypeError:  # not weakly referable (any object may stand in sys.modules): read again
        last = None
    return len(sys.modules), last


def _module_of_file(filename: str, modules: Mapping[int, str]) -> tuple[dict[str, Any], str] | None:
    """The namespace and name of the (non-tool) module loaded from ``filename``, if any.
    ``sys.modules`` is read again only when a file is not known and modules came or went since
    the last reading; a known name is checked against what ``sys.modules`` holds now."""
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


def _from_remembered(
    entry: tuple[str, Any, str],
    wanted: Mapping[int, object],
    skip: set[int],
    modules: Mapping[int, str],
    max_depth: int,
) -> dict[int, Owner]:
    """Owners (by target id) found forwards from one remembered global or class attribute."""
    root = _remembered_root(entry, modules)
    if root is None:
        return {}
    value, prefix, kind, owner_name = root
    reached = _reached_from(value, wanted, skip, modules, max_depth - len(prefix))
    return {
        target_id: _owner([*prefix, *chain], kind, owner_name, None)
        for target_id, chain in reached.items()
    }


def _reached_from(
    value: object,
    wanted: Mapping[int, object],
    skip: set[int],
    modules: Mapping[int, str],
    max_depth: int,
    pick: Callable[[object], bool] | None = None,
) -> dict[int, list[object]]:
    """What a remembered owner's ``value`` reaches forwards of ``wanted`` (or of what ``pick``
    accepts), itself included: id -> the chain from ``value`` down to it."""
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
    """The remembered global's or class attribute's value now, the chain above it, the owner's
    kind and name; None when it is gone (or a test tool's)."""
    what, where, name = entry
    if what == "module":
        namespace = getattr(sys.modules.get(where), "__dict__", None)
        if not isinstance(namespace, dict) or id(namespace) not in modules:
            return None  # gone, or a test tool's
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
    """Unowned threads started by a thread that is not a target: their starter's owner."""
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
    max_nodes: int = MAX_NODES,
) -> dict[Any, Owner]:
    """Search forwards from each owner candidate (fixtures first, then module globals) for the
    targets, one shared visited set and node budget: what an earlier root reaches is its."""
    from pytest_shutdown.ownership.backrefs import _edges  # noqa: PLC0415 - only when frozen

    wanted: dict[int, list[Any]] = {}
    for key, target in targets.items():
        wanted.setdefault(id(target), []).append(key)
    roots: list[tuple[object, str, str, Any]] = [
        (value, "fixture", name, key) for key, name, value in fixture_roots.values()
    ]
    by_id = {id(m.__dict__): m for m in list(sys.modules.values()) if hasattr(m, "__dict__")}
    module_roots = []
    for namespace_id, module_name in modules.items():
        module = by_id.get(namespace_id)
        if module is not None:
            module_roots.append((module.__dict__, "module-global", module_name, None))
    # The suite's own modules first (test modules, conftests, modules made at run time), then
    # installed packages, the standard library last: the budget goes where owners usually are.
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
        while queue and visited < max_nodes and len(answers) < len(targets):
            if visited % 1000 == 0 and time.monotonic() > deadline:
                return answers
            node, path, attribute = queue.popleft()
            visited += 1
            for label, child in _edges(node):
                child_id = id(child)
                if child_id in seen:
                    continue
                seen.add(child_id)
                # A module global's name: the module, then the key of its namespace dict.
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
    """The objects to explain: each thread itself; for a pid, its Process/Popen object, or that
    of its nearest ancestor among this process's children (``parents`` maps pid to ppid)."""
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
    """The class attribute or module global that the code which created ``obj`` assigned it to
    (a process-lifetime singleton: tqdm's ``cls.monitor = TMonitor(cls, ...)``), read from the
    recorded creation site ``origin``: the first user frame outside ``obj``'s own methods is
    the call that made it, and its source line assigns the result to ``cls.attr``, to
    ``Class.attr`` of a class of that module, or to a global of that module. None otherwise (a
    local, an instance attribute, a call whose line says nothing): the object is then the
    caller's. Returned with what the slot holds now: it may hold ``obj`` no more (the library
    released its singleton; what still refers to it, an ``atexit`` registration, is how such a
    singleton is meant to end)."""
    if origin is None:
        return None
    classes = type(obj).__mro__[:-1]
    own = {getattr(klass, "__qualname__", "") + "." for klass in classes}
    # Before Python 3.11 a frame names its function only (no co_qualname): a method of the
    # object's classes is then told by where its code is (file and lines).
    spans = [span for klass in classes for span in _method_spans(klass)]
    for filename, lineno, qualname, is_user in origin.frames:
        if not is_user:
            continue
        if any(qualname.startswith(prefix) for prefix in own) or any(
            filename == file and first <= lineno <= last for file, first, last in spans
        ):
            continue  # the object's own method (its __init__ registering the hook)
        return _assigned_slot(filename, lineno, qualname)
    return None


def _method_spans(klass: type) -> list[tuple[str, int, int]]:
    """(file, first line, last line) of each function defined in ``klass``'s body."""
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
            if qualname == "<module>" or target.id in _declared_global(filename, qualname):
                where = f"assigned at {filename}:{lineno}"
                owner = Owner("module-global", f"{module_name}.{target.id}", where)
                return owner, namespace.get(target.id)
    return None


def _declared_global(filename: str, qualname: str) -> frozenset[str]:
    """The names the function ``qualname`` of the module in ``filename`` declares ``global``."""
    found = _module_of_file(filename, _namespaces()[0])
    if found is None:
        return frozenset()
    obj: Any = found[0].get(qualname.split(".")[0])
    for part in qualname.split(".")[1:]:
        obj = getattr(obj, part, None)
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    if code is None:
        return frozenset()
    # A global assigned in the function is stored by name (STORE_GLOBAL): it is in co_names,
    # not in co_varnames; a local of the same name would be in co_varnames.
    return frozenset(n for n in code.co_names if n not in code.co_varnames)
