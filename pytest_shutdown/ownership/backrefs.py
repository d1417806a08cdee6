"""Why is this object still alive? Reference paths, found and rendered as text.

:func:`find_path` walks *forwards* from a finalizer's func/args to the object (the static
finalizer check); :func:`backref_chain` walks *backwards* with ``objgraph`` to a root (a module
or a running thread's frame), for the ``not-collected`` diagnosis; :func:`draw_backrefs` draws
it (a PNG with graphviz's ``dot``, else the ``.dot`` source), into ``graphs_dir=`` or the folder
of :func:`configure_graphs` (``--shutdown-graphs=DIR``).
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import objgraph

from pytest_shutdown.ownership.slots import slot_names

#: Nodes the forward search visits at most before giving up.
PATH_BUDGET = 20_000
BACKREF_MAX_DEPTH = 16
#: CPU seconds of this thread the backward search may take (a busy machine does not cut it
#: short); the wall clock bounds it at :data:`BACKREF_WALL_FACTOR` times as much.
BACKREF_BUDGET_S = 3.0
BACKREF_WALL_FACTOR = 10.0


def _attribute(node: object, name: str) -> Any:
    """``getattr(node, name, None)`` that never raises (``ctypes.cdll.func`` loads a library)."""
    try:
        return getattr(node, name, None)
    except Exception:  # noqa: BLE001 - any error means: no such edge
        return None


def _edges(node: object) -> Iterator[tuple[str, object]]:
    """``(edge label, child)`` for the references the forward search follows."""
    if isinstance(node, (types.MethodType, types.FunctionType, types.CellType)):
        yield from _code_edges(node)
        return
    if isinstance(node, (type, types.ModuleType, types.BuiltinFunctionType, str, bytes)):
        return
    if isinstance(node, (dict, list, tuple, collections.deque, set, frozenset)):
        yield from _container_edges(node)
        return
    if isinstance(node, weakref.ref):
        return
    yield from _object_edges(node)


def _code_edges(
    node: types.MethodType | types.FunctionType | types.CellType,
) -> Iterator[tuple[str, object]]:
    if isinstance(node, types.MethodType):
        yield ".__self__", node.__self__
        yield ".__func__", node.__func__
        return
    if isinstance(node, types.FunctionType):
        for name, cell in zip(node.__code__.co_freevars, node.__closure__ or (), strict=False):
            try:
                yield f".<closure {name}>", cell.cell_contents
            except ValueError:
                continue
        for index, default in enumerate(node.__defaults__ or ()):
            yield f".__defaults__[{index}]", default
        for key, default in (node.__kwdefaults__ or {}).items():
            yield f".__kwdefaults__[{key!r}]", default
        return
    try:
        yield ".cell_contents", node.cell_contents
    except ValueError:
        pass


def _container_edges(
    node: dict[Any, Any] | list[Any] | tuple[Any, ...] | collections.deque[Any] | AbstractSet[Any],
) -> Iterator[tuple[str, object]]:
    """Items, read from a copy: another thread may change them meanwhile."""
    if isinstance(node, dict):
        for key, value in list(node.items()):
            yield f"[{key!r}]", value
            yield f".keys()[{key!r}]", key
        return
    if isinstance(node, (list, tuple, collections.deque)):
        for index, value in enumerate(list(node)):
            yield f"[{index}]", value
        return
    for value in list(node):
        yield "{item}", value


def _object_edges(node: object) -> Iterator[tuple[str, object]]:
    """A partial's parts, ``__self__``, the instance dict and slots (guarded lookups)."""
    func = _attribute(node, "func")
    if func is not None and _attribute(node, "keywords") is not None:
        yield ".func", func
        for index, value in enumerate(_attribute(node, "args") or ()):
            yield f".args[{index}]", value
        for key, value in (_attribute(node, "keywords") or {}).items():
            yield f".keywords[{key!r}]", value
    self_of = _attribute(node, "__self__")
    if self_of is not None and not isinstance(self_of, types.ModuleType):
        yield ".__self__", self_of
    attrs = _attribute(node, "__dict__")
    if isinstance(attrs, dict):
        for key, value in list(attrs.items()):
            yield f".{key}", value
    for klass in type(node).__mro__:
        for name in slot_names(klass):
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                yield f".{name}", getattr(node, name)
            except Exception:  # noqa: BLE001 - an unset slot, or a property that raises
                continue


def find_path(root: object, target: object, root_label: str = "") -> str | None:
    """The shortest reference path from ``root`` to ``target`` as text, or ``None`` (at most
    :data:`PATH_BUDGET` objects visited)."""
    if root is target:
        return root_label
    seen = {id(root)}
    queue: collections.deque[tuple[object, str]] = collections.deque([(root, root_label)])
    visited = 0
    while queue and visited < PATH_BUDGET:
        node, path = queue.popleft()
        visited += 1
        for label, child in _edges(node):
            if child is target:
                return path + label
            if id(child) in seen or child is None:
                continue
            seen.add(id(child))
            queue.append((child, path + label))
    return None


class SearchGaveUp(Exception):
    """The backward search ran past its time budget."""


class _RootPredicate:
    """Roots are proper modules and frames; raises once the budget is spent."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.deadline = time.thread_time() + budget_s
        self.wall_deadline = time.monotonic() + budget_s * BACKREF_WALL_FACTOR

    def __call__(self, obj: object) -> bool:
        if time.thread_time() > self.deadline or time.monotonic() > self.wall_deadline:
            raise SearchGaveUp
        return isinstance(obj, types.FrameType) or bool(objgraph.is_proper_module(obj))


def _thread_frames() -> tuple[list[types.FrameType], dict[int, str]]:
    """Every frame of every other thread, so that the search can see them."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames: list[types.FrameType] = []
    owner: dict[int, str] = {}
    current = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident == current:
            continue
        walker: types.FrameType | None = frame
        while walker is not None:
            frames.append(walker)
            owner[id(walker)] = names.get(ident, f"thread {ident}")
            walker = walker.f_back
    return frames, owner


def backref_chain(
    target: object, *, max_depth: int = BACKREF_MAX_DEPTH, budget_s: float = BACKREF_BUDGET_S
) -> tuple[list[Any], str]:
    """A shortest chain ``[root, ..., target]`` of referrers, and its text; ``[target]`` and the
    direct referrers when no root is found within ``max_depth`` hops or ``budget_s`` seconds.
    The helper's frames and the ``weakref.finalize`` instances are ignored (each refers to the
    ``finalize`` class: expanding them costs a heap scan each).
    """
    frames, owner = _thread_frames()
    ignore: list[int] = [id(frames), id(owner)]
    ignore += [id(final) for final in list(getattr(weakref.finalize, "_registry", {}))]
    walker: types.FrameType | None = sys._getframe()
    while walker is not None:
        ignore.append(id(walker))
        walker = walker.f_back
    cut_short = False
    try:
        chain = objgraph.find_backref_chain(
            target, _RootPredicate(budget_s), max_depth=max_depth, extra_ignore=ignore
        )
    except SearchGaveUp:
        chain, cut_short = [target], True
    if len(chain) > 1:
        text = render_chain(chain, owner)
    else:
        text = _render_referrers(target, set(ignore) | {id(frames), id(chain)})
        if cut_short:  # never read as "no root"
            text = text.replace(
                "no root found within the search depth",
                f"the search was cut short by its {budget_s:g} s budget before it found a root",
            )
    del frames
    return chain, text


def _node_name(node: object, owner: dict[int, str]) -> str:
    if isinstance(node, types.ModuleType):
        return f"module {node.__name__}"
    if isinstance(node, types.FrameType):
        code = node.f_code
        thread = owner.get(id(node), "a running thread")
        return f"frame {code.co_name} ({code.co_filename}:{node.f_lineno}) on {thread}"
    if isinstance(node, type):
        return f"class {node.__module__}.{node.__qualname__}"
    if isinstance(node, (types.FunctionType, types.MethodType)):
        return f"{type(node).__name__} {node.__qualname__}"
    if isinstance(node, (dict, list, tuple, set)):
        return f"{type(node).__name__} of {len(node)}"
    if isinstance(node, threading.Thread):
        return f"Thread {node.name!r}"
    return f"{type(node).__qualname__} at {id(node):#x}"


def _edge_name(parent: object, child: object) -> str:
    if isinstance(parent, types.FrameType):
        for name, value in parent.f_locals.items():
            if value is child:
                return f"local {name!r}"
        return "frame"
    if isinstance(parent, (types.ModuleType, type)):
        if isinstance(parent, type) and child is getattr(parent, "__dict__", None):
            return ".__dict__"
        for name, value in vars(parent).items():
            if value is child:
                return f".{name}"
        return ".__dict__"
    if isinstance(parent, dict):
        for key, value in parent.items():
            if value is child:
                return f"[{key!r}]" if isinstance(key, (str, int)) else f"[{_node_name(key, {})}]"
            if key is child:
                return "(a key)"
        return "(dict internals)"
    for label, value in _edges(parent):
        if value is child:
            return label
    for name in ("__defaults__", "__kwdefaults__", "__closure__", "__globals__", "__dict__"):
        if getattr(parent, name, None) is child:
            return f".{name}"
    return "(refers to)"


def render_chain(chain: list[Any], owner: dict[int, str] | None = None) -> str:
    """``[root, ..., target]`` as text, one line per hop (``  -> .attr: type``)."""
    owner = owner or {}
    lines = [_node_name(chain[0], owner)]
    for parent, child in zip(chain, chain[1:], strict=False):
        lines.append(f"  -> {_edge_name(parent, child)}: {_node_name(child, owner)}")
    return "\n".join(lines)


def _render_referrers(target: object, ignore: set[int]) -> str:
    referrers = [r for r in gc.get_referrers(target) if id(r) not in ignore]
    names = [_node_name(r, {}) for r in referrers[:10]]
    del referrers
    if not names:
        return "no referrer found by the garbage collector (held from C code or a thread stack)"
    return "no root found within the search depth; direct referrers: " + "; ".join(names)


def runs_through_finalizer_registry(chain: list[Any]) -> bool:
    """Whether the chain passes through weakref.finalize's or multiprocessing's registry."""
    registries = [getattr(weakref.finalize, "_registry", None)]
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        registries.append(getattr(mp_util, "_finalizer_registry", None))
    return any(node is registry for node in chain for registry in registries if registry)


DOT_TIMEOUT_S = 30.0
GRAPH_MAX_DEPTH = 6
#: Referrers drawn per node; the rest are summarised as "N more backreferences".
GRAPH_TOO_MANY = 8

NO_DOT_NOTE = (
    "graphviz's 'dot' is not on PATH, so no PNG was drawn, only the .dot source; install "
    "graphviz (e.g. 'apt-get install graphviz') or render it elsewhere: dot -Tpng -O {name}"
)


@dataclass(frozen=True)
class BackrefGraph:
    """One backref picture's files: the source, the PNG (``None`` without ``dot``), a note."""

    dot: str
    png: str | None
    note: str | None

    def to_details(self) -> dict[str, str | None]:
        return {"dot": self.dot, "png": self.png, "note": self.note}


class GraphSettings:
    """Where pictures go without ``graphs_dir=``: ``directory`` (``None``: none), ``prefix`` of
    every file name, ``listeners`` called with each picture drawn."""

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.prefix: str = ""
        self.listeners: list[Callable[[BackrefGraph], None]] = []
        self._counter = itertools.count(1)

    def next_stem(self, label: str) -> str:
        head = self.prefix or f"pid{os.getpid()}"
        return _safe_name(f"{head}-{label}-{next(self._counter)}")


GRAPHS = GraphSettings()


def configure_graphs(directory: str | os.PathLike[str] | None, *, prefix: str = "") -> None:
    """Draw a backref picture for every ``not-collected`` diagnosis into ``directory``
    (``None``: stop drawing). ``prefix`` starts the file names (e.g. the current test's id)."""
    GRAPHS.directory = None if directory is None else Path(directory)
    GRAPHS.prefix = prefix


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")
    return name[-150:] or "graph"


def draw_backrefs(
    target: object,
    directory: str | os.PathLike[str],
    label: str,
    *,
    max_depth: int = GRAPH_MAX_DEPTH,
    extra_ignore: Iterable[int] = (),
) -> BackrefGraph:
    """Draw ``target``'s referrers into ``directory``: ``<stem>.dot``, and ``<stem>.png`` when
    ``dot`` is on PATH. Call it while ``target`` is alive; it keeps no reference."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    stem = GRAPHS.next_stem(label)
    dot_path = folder / f"{stem}.dot"
    ignore = list(extra_ignore)
    walker: types.FrameType | None = sys._getframe()
    while walker is not None:  # this call stack is not the story
        ignore.append(id(walker))
        walker = walker.f_back
    target_id = id(target)
    with open(dot_path, "w", encoding="utf-8") as handle:
        objgraph.show_backrefs(
            [target],
            max_depth=max_depth,
            extra_ignore=ignore,
            too_many=GRAPH_TOO_MANY,
            highlight=lambda node: id(node) == target_id,
            output=handle,
        )
    del walker
    dot_exe = shutil.which("dot")
    if dot_exe is None:
        graph = BackrefGraph(str(dot_path), None, NO_DOT_NOTE.format(name=dot_path.name))
    else:
        graph = _render_png(dot_exe, dot_path)
    for listener in list(GRAPHS.listeners):
        listener(graph)
    return graph


def _render_png(dot_exe: str, dot_path: Path) -> BackrefGraph:
    png_path = dot_path.with_suffix(".png")
    try:
        done = subprocess.run(
            [dot_exe, "-Tpng", "-o", str(png_path), str(dot_path)],
            capture_output=True,
            text=True,
            timeout=DOT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return BackrefGraph(str(dot_path), None, f"'dot' failed on {dot_path}: {exc}")
    if done.returncode != 0 or not png_path.exists():
        error = (done.stderr or "").strip()[-300:]
        return BackrefGraph(
            str(dot_path), None, f"'dot' exited {done.returncode} on {dot_path}: {error}"
        )
    return BackrefGraph(str(dot_path), str(png_path), None)
