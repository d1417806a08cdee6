"""Why is this object still alive? Reference paths, found and rendered as text.

Two searches live here:

* :func:`find_path` walks *forwards* from a finalizer's func/args to the object (partials,
  bound methods, closures, defaults, containers, instance attributes; any depth, with a visited
  set and a node budget), for the static finalizer check;
* :func:`backref_chain` walks *backwards* from the object to a root (a module in
  ``sys.modules`` or a frame on a running thread's stack) with ``objgraph``, for the
  ``not-collected`` diagnosis. It is only called on failure.

:func:`draw_backrefs` draws the same question as a picture (``objgraph.show_backrefs``; a PNG when
graphviz's ``dot`` is installed, else the ``.dot`` source and a note), into the folder given as
``graphs_dir=`` or set module-wide with :func:`configure_graphs` (the plugin's
``--shutdown-graphs=DIR`` does that).
"""

from __future__ import annotations

import collections
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

#: Nodes the forward search visits at most before giving up.
PATH_BUDGET = 20_000
#: Depth limit of the backward search; engine object graphs are rarely deeper than a dozen.
BACKREF_MAX_DEPTH = 16
#: CPU seconds of this thread the backward search may take before it gives up and lists direct
#: referrers (CPU time: a machine busy with other work does not cut it short); the wall clock
#: bounds it too, at :data:`BACKREF_WALL_FACTOR` times as much.
BACKREF_BUDGET_S = 3.0
BACKREF_WALL_FACTOR = 10.0


def _attribute(node: object, name: str) -> Any:
    """``getattr(node, name, None)`` that never raises: a ``__getattr__`` may do anything
    (``ctypes.cdll.func`` tries to load a library called ``func``)."""
    try:
        return getattr(node, name, None)
    except Exception:  # noqa: BLE001 - any error means: no such edge
        return None


def _edges(node: object) -> Iterator[tuple[str, object]]:
    """``(edge label, child)`` for the references the forward search follows: code objects'
    and containers' by their type, any other object's by its attributes."""
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
    """A bound method's instance and function; a function's closure cells' contents and its
    defaults; a cell's contents (an empty cell has none)."""
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
    """A dict's values and keys, a sequence's items by index, a set's items (read from a
    copy: the search may run while another thread changes them)."""
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
    """Any other object's references: a partial's function and arguments, a bound object's
    ``__self__``, the instance dict and the slots (read through :func:`_attribute` and guarded
    lookups: a user's ``__getattr__`` or property may do anything)."""
    func = _attribute(node, "func")
    # functools.partial and relatives
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
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                yield f".{name}", getattr(node, name)
            except Exception:  # noqa: BLE001 - an unset slot, or a property that raises
                continue


def find_path(root: object, target: object, root_label: str = "") -> str | None:
    """The shortest reference path from ``root`` to ``target`` as text, or ``None``.

    Breadth first, any depth, each object visited once, at most :data:`PATH_BUDGET` objects.
    """
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
    """Roots are proper modules and frames; gives up (raises) once the budget is spent: this
    thread's CPU time, so that a loaded machine gives the search the time it needs (the same
    verdict), with a wall-clock bound so that it still ends."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.deadline = time.thread_time() + budget_s
        self.wall_deadline = time.monotonic() + budget_s * BACKREF_WALL_FACTOR

    def __call__(self, obj: object) -> bool:
        if time.thread_time() > self.deadline or time.monotonic() > self.wall_deadline:
            raise SearchGaveUp
        return isinstance(obj, types.FrameType) or bool(objgraph.is_proper_module(obj))


def _thread_frames() -> tuple[list[types.FrameType], dict[int, str]]:
    """Materialise every frame of every other thread, so that backref search can see them."""
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
    """A shortest chain ``[root, ..., target]`` of referrers, and the chain rendered as text.

    ``objgraph.find_backref_chain`` does the search. It ignores the helper's own frames and the
    ``weakref.finalize`` instances (keys of the registry: they hold nothing, but every one of them
    refers to the ``finalize`` class, and expanding them all would cost one heap scan each). When
    no root is found within ``max_depth`` hops or ``budget_s`` seconds the chain is ``[target]``
    and the text lists the direct referrers instead.
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
        if cut_short:  # said, so that a cut-short search is never read as "no root"
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
    if isinstance(parent, types.ModuleType):
        for name, value in vars(parent).items():
            if value is child:
                return f".{name}"
        return ".__dict__"
    if isinstance(parent, type):
        if child is getattr(parent, "__dict__", None):
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
    if getattr(parent, "__dict__", None) is child:
        return ".__dict__"
    return "(refers to)"


def render_chain(chain: list[Any], owner: dict[int, str] | None = None) -> str:
    """Render ``[root, ..., target]`` as text, one line per hop (``  -> .attr: type``)."""
    owner = owner or {}
    lines = [_node_name(chain[0], owner)]
    for parent, child in zip(chain, chain[1:], strict=False):
        lines.append(f"  -> {_edge_name(parent, child)}: {_node_name(child, owner)}")
    return "\n".join(lines)


def _render_referrers(target: object, ignore: set[int]) -> str:
    import gc

    referrers = [r for r in gc.get_referrers(target) if id(r) not in ignore]
    names = [_node_name(r, {}) for r in referrers[:10]]
    del referrers
    if not names:
        return "no referrer found by the garbage collector (held from C code or a thread stack)"
    return "no root found within the search depth; direct referrers: " + "; ".join(names)


def runs_through_finalizer_registry(chain: list[Any]) -> bool:
    """True when the chain passes through the weakref.finalize or multiprocessing registry."""
    registries = [getattr(weakref.finalize, "_registry", None)]
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        registries.append(getattr(mp_util, "_finalizer_registry", None))
    return any(node is registry for node in chain for registry in registries if registry)


# --- pictures: objgraph.show_backrefs, drawn while the object is still alive ---------------------

#: Seconds graphviz's ``dot`` may take to render one picture.
DOT_TIMEOUT_S = 30.0
#: Depth of the backref picture: the chain's length, at most this many hops.
GRAPH_MAX_DEPTH = 6
#: Referrers drawn per node; the rest are summarised as "N more backreferences".
GRAPH_TOO_MANY = 8

NO_DOT_NOTE = (
    "graphviz's 'dot' is not on PATH, so no PNG was drawn, only the .dot source; install "
    "graphviz (e.g. 'apt-get install graphviz') or render it elsewhere: dot -Tpng -O {name}"
)


@dataclass(frozen=True)
class BackrefGraph:
    """The files of one backref picture: the graphviz source, the PNG (``None`` without
    ``dot``), and a note saying why there is no PNG."""

    dot: str
    png: str | None
    note: str | None

    def to_details(self) -> dict[str, str | None]:
        """The picture as JSON-serialisable finding details."""
        return {"dot": self.dot, "png": self.png, "note": self.note}


class GraphSettings:
    """Where the diagnosis draws pictures when no ``graphs_dir=`` is passed (module-level).

    ``directory`` is ``None`` (the default: no pictures) or a folder; ``prefix`` starts every
    file name (the plugin sets the running test's id); every listener is called with each
    picture drawn (the plugin's terminal summary names the files). Plain Python, no pytest.
    """

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.prefix: str = ""
        self.listeners: list[Callable[[BackrefGraph], None]] = []
        self._counter = itertools.count(1)

    def next_stem(self, label: str) -> str:
        """A file stem unique in this process: prefix (or pid), label, counter."""
        head = self.prefix or f"pid{os.getpid()}"
        return _safe_name(f"{head}-{label}-{next(self._counter)}")


#: The module-level picture settings; :func:`configure_graphs` changes them.
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
    """Draw ``target``'s referrers (``objgraph.show_backrefs``) into ``directory``.

    The graphviz source ``<stem>.dot`` is always written; with graphviz's ``dot`` on PATH it is
    rendered to ``<stem>.png`` (within :data:`DOT_TIMEOUT_S`), otherwise the note says so. Must be
    called while ``target`` is alive; keeps no reference to it.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    stem = GRAPHS.next_stem(label)
    dot_path = folder / f"{stem}.dot"
    ignore = list(extra_ignore)
    walker: types.FrameType | None = sys._getframe()
    while walker is not None:  # this call stack (the helper's, the caller's) is not the story
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
