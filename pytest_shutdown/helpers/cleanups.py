"""Discovering an object's cleanups and counting the real calls made to them.

Cleanups are found in the object's instance attributes (one level into lists, tuples and dicts):
executors, ``ExitStack`` callbacks, objects whose type defines one of :data:`CLEANUP_METHODS`
(lock-like objects excepted); in its ``weakref.finalize`` and ``multiprocessing.util.Finalize``
registrations; and in ``watch=``. ``ExitStack.close`` and finalizer calls are *routes* to
cleanups, not cleanups themselves.

Calls are counted by a profile hook on the threads the helper drives, keyed by code object and
the identity of ``self``: a bound method captured at registration (by an ExitStack or a
finalizer) is seen, which wrapping an attribute afterwards would miss. Nested entries on one
thread are one call (a cleanup calling its base class's); threads the helper does not drive are
not counted (an executor thread finishing its own work later is no repeat). Specs hold
identities only: nothing installed here keeps the object under test alive.
"""

from __future__ import annotations

import contextlib
import dis
import inspect
import io
import multiprocessing.connection
import multiprocessing.process
import socket
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_shutdown._os.async_exc import reset_async_exc_flag

#: Method names that mark an object as a resource with a cleanup.
CLEANUP_METHODS: tuple[str, ...] = ("close", "shutdown", "terminate", "release", "stop")

#: One watched item: a function, a bound method, an object, or an attribute path.
Watch = object

_ProfileHook = Callable[[types.FrameType, Any, Any], object]
_CODE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
_NOT_RESOURCES = (*_CODE, str, bytes, int, float, weakref.finalize)
_MAX_CONTAINER_ITEMS = 256
_SCALARS = (type(None), bool, int, float, complex, str, bytes)

#: Method name -> the types whose method of that name is idempotent by contract.
IDEMPOTENT_BY_CONTRACT: Mapping[str, tuple[type, ...]] = {
    "shutdown": (Executor,),
    "join": (threading.Thread, multiprocessing.process.BaseProcess),
    "set": (threading.Event,),
    "close": (
        multiprocessing.process.BaseProcess,
        io.IOBase,
        socket.socket,
        multiprocessing.connection.Connection,
    ),
}


@dataclass(frozen=True)
class CleanupSpec:
    """One cleanup to count: which code objects, on which ``self``.

    ``label`` is stable across twins built by the same factory (``"_executor.shutdown"``,
    ``"_resources callback 0 (Logger.debug)"``); ``attribute`` and ``method`` split it for
    reports. A Python frame matches when its code is in ``codes`` and its first argument is the
    object with id ``self_id`` (any object when ``None``) and, for ExitStack callback wrappers,
    its free variable ``closure_var`` is the object with id ``closure_id``. A C method matches
    by ``c_name`` and the id of its ``__self__``.
    """

    label: str
    attribute: str
    method: str
    codes: frozenset[types.CodeType] = frozenset()
    c_name: str | None = None
    self_id: int | None = None
    closure_var: str | None = None
    closure_id: int | None = None
    arg_ids: tuple[tuple[str, int], ...] = ()
    idempotent: bool = False

    @property
    def key(self) -> tuple[object, ...]:
        """What makes two specs the same cleanup (the label is only its name)."""
        if self.arg_ids:
            return ("function", tuple(sorted(map(id, self.codes))), self.arg_ids)
        if self.closure_id is not None:
            return (self.self_id or 0, self.label)
        return (self.self_id or 0, self.method)


def idempotent_by_contract(target: object, name: str) -> bool:
    """True for a cleanup whose repetition is harmless by its library's contract (a no-op)."""
    kinds = IDEMPOTENT_BY_CONTRACT.get(name, ())
    return any(isinstance(target, kind) for kind in kinds)


def is_exit_stack(value: object) -> bool:
    """True for ``contextlib.ExitStack`` and ``AsyncExitStack`` instances."""
    return isinstance(value, contextlib._BaseExitStack)  # their common base, 3.7 on


def exit_stack_callbacks(stack: object) -> list[Callable[..., Any]]:
    """The callbacks still registered on an ExitStack, in registration order."""
    entries = getattr(stack, "_exit_callbacks", ())
    return [cb for _is_sync, cb in list(entries)]


def _copy(registry: dict[Any, Any]) -> dict[Any, Any]:
    """A copy of a finalizer registry, made at once: iterating allocates, and a collection that
    sets off runs finalizers that leave the registry mid-iteration (seen in ``make test``)."""
    for _ in range(100):
        try:
            return registry.copy()
        except RuntimeError:  # not a plain dict after all: try again
            continue
    return {}


def _finalizers(obj: object) -> list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]]:
    """``(finalizer, func, args, kwargs)`` of every pending finalizer whose referent is ``obj``:
    ``weakref.finalize`` and ``multiprocessing.util.Finalize`` registrations."""
    found: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = []
    for final, info in _copy(getattr(weakref.finalize, "_registry", {})).items():
        ref = getattr(info, "weakref", None)
        if ref is not None and ref() is obj:
            found.append((final, info.func, tuple(info.args), dict(info.kwargs or {})))
    mp_util = sys.modules.get("multiprocessing.util")
    for final in _copy(getattr(mp_util, "_finalizer_registry", {})).values():
        ref = getattr(final, "_weakref", None)
        if ref is not None and ref() is obj:
            found.append((final, final._callback, tuple(final._args), dict(final._kwargs or {})))
    return found


def finalizer_registrations(obj: object) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """``(func, args, kwargs)`` of every pending finalizer whose referent is ``obj``."""
    return [(func, args, kwargs) for _final, func, args, kwargs in _finalizers(obj)]


def pending_finalizers(obj: object) -> list[Callable[[], Any]]:
    """The pending finalizer objects of ``obj``: calling one runs what collection would run."""
    return [final for final, *_registration in _finalizers(obj)]


def cleanup_method_names(value: object) -> tuple[str, ...]:
    """The cleanup methods ``value``'s type defines; empty when it is not a resource."""
    if isinstance(value, _NOT_RESOURCES) or is_exit_stack(value):
        return ()
    if isinstance(value, Executor):
        return ("shutdown",)
    kind = type(value)
    if callable(getattr(kind, "acquire", None)):
        return ()  # locks, semaphores, conditions: release() is not a cleanup
    return tuple(name for name in CLEANUP_METHODS if callable(getattr(kind, name, None)))


def method_spec(target: object, name: str, label: str, attribute: str) -> CleanupSpec:
    """A spec counting ``target.<name>()``, whichever class in the MRO implements it."""
    codes: set[types.CodeType] = set()
    c_name: str | None = None
    for klass in type(target).__mro__:
        impl = klass.__dict__.get(name)
        if impl is None:
            continue
        func = getattr(impl, "__func__", impl)
        code = getattr(func, "__code__", None)
        if isinstance(code, types.CodeType):
            codes.add(code)
        else:
            c_name = name
    return CleanupSpec(
        label=label,
        attribute=attribute,
        method=name,
        codes=frozenset(codes),
        c_name=c_name,
        self_id=id(target),
        idempotent=idempotent_by_contract(target, name),
    )


def function_label(func: types.FunctionType) -> str:
    """``package.module.function``: how a module-level cleanup function is named in reports."""
    module = getattr(func, "__module__", None)
    return f"{module}.{func.__qualname__}" if module else func.__qualname__


def function_spec(
    func: types.FunctionType, args: tuple[Any, ...], kwargs: Mapping[str, Any], attribute: str
) -> CleanupSpec:
    """A spec counting calls of ``func`` with the same (non-scalar) arguments as registered.

    Arguments are matched by identity, parameter by parameter, so ``_stop(ev, t)`` registered on
    an ExitStack and ``weakref.finalize(self, _stop, ev, t)`` are one cleanup, while
    ``_stop(other_ev, other_t)`` is another. Scalars are not compared (equal, not identical).
    """
    code = func.__code__
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    pairs: list[tuple[str, int]] = []
    for position, value in enumerate(args[: code.co_argcount]):
        if not isinstance(value, _SCALARS):
            pairs.append((names[position], id(value)))
    for key, value in kwargs.items():
        if key in names and not isinstance(value, _SCALARS):
            pairs.append((key, id(value)))
    label = function_label(func)
    return CleanupSpec(
        label=label,
        attribute=attribute,
        method=label,
        codes=frozenset({code}),
        arg_ids=tuple(sorted(pairs)),
    )


@dataclass
class _Discovery:
    obj: object
    specs: list[CleanupSpec] = field(default_factory=list)
    seen_keys: set[tuple[object, ...]] = field(default_factory=set)
    stacks: list[tuple[str, object]] = field(default_factory=list)
    seen_stacks: set[int] = field(default_factory=set)
    resource_ids: set[int] = field(default_factory=set)
    names: dict[int, str] = field(default_factory=dict)

    def add(self, spec: CleanupSpec) -> None:
        key = spec.key
        if key in self.seen_keys:
            return
        self.seen_keys.add(key)
        taken = {existing.label for existing in self.specs}
        if spec.label in taken:  # the same function with other arguments: number it
            number = 2
            while f"{spec.label} #{number}" in taken:
                number += 1
            spec = replace(spec, label=f"{spec.label} #{number}")
        self.specs.append(spec)

    def consider(self, label: str, value: object, *, nested: bool = True) -> None:
        if value is self.obj:
            return
        if is_exit_stack(value):
            if id(value) not in self.seen_stacks:
                self.seen_stacks.add(id(value))
                self.stacks.append((label, value))
            return
        names = cleanup_method_names(value)
        if names:
            self.resource_ids.add(id(value))
            self.names.setdefault(id(value), label)
            for name in names:
                self.add(method_spec(value, name, f"{label}.{name}", label))
            return
        if not nested:
            return
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value[:_MAX_CONTAINER_ITEMS]):
                self.consider(f"{label}[{index}]", item, nested=False)
        elif isinstance(value, dict):
            for key, item in list(value.items())[:_MAX_CONTAINER_ITEMS]:
                self.consider(f"{label}[{key!r}]", item, nested=False)

    def expand_stack(self, label: str, stack: object) -> None:
        for index, callback in enumerate(exit_stack_callbacks(stack)):
            self.add_callback(f"{label} callback {index}", callback)

    def add_callback(self, label: str, callback: Callable[..., Any]) -> None:
        wrapped = getattr(callback, "__wrapped__", None)
        inner = wrapped if wrapped is not None else callback
        owner = getattr(inner, "__self__", None)
        name = getattr(inner, "__name__", "")
        if owner is not None and not isinstance(owner, types.ModuleType):
            if id(owner) in self.resource_ids and (name in CLEANUP_METHODS or name == "__exit__"):
                return  # already counted as the resource's own cleanup
            if is_exit_stack(owner) and name in ("close", "__exit__"):
                self.consider(label, owner)  # a nested stack: a route, expand it
                return
            if name in cleanup_method_names(owner) or name == "__exit__":
                attribute = self.names.get(id(owner), f"{label} ({type(owner).__qualname__})")
                self.add(method_spec(owner, name, f"{attribute}.{name}", attribute))
                return
        qualname = getattr(inner, "__qualname__", type(inner).__qualname__)
        if wrapped is not None and isinstance(inner, types.FunctionType):
            args, kwargs = _wrapper_arguments(callback)
            self.add(function_spec(inner, args, kwargs, label))
            return
        if wrapped is not None:
            spec = _closure_spec(label, qualname, callback, wrapped)
            if spec is not None:
                self.add(spec)
                return
        code = getattr(getattr(inner, "__func__", inner), "__code__", None)
        if isinstance(code, types.CodeType):
            self.add(
                _code_spec(label, qualname, code, self_id=None if owner is None else id(owner))
            )

    def add_watch(self, item: Watch) -> None:
        if isinstance(item, str):
            self.add_path(item)
        elif isinstance(item, types.MethodType):
            owner = item.__self__
            label = f"{self.names.get(id(owner), type(owner).__qualname__)}.{item.__name__}"
            self.add(method_spec(owner, item.__name__, label, label.rsplit(".", 1)[0]))
        elif isinstance(item, types.FunctionType):
            if any(item.__code__ in spec.codes for spec in self.specs):
                return  # already counted (as a finalizer's or an ExitStack's function)
            self.add(
                CleanupSpec(
                    label=item.__qualname__,
                    attribute="watch",
                    method=item.__qualname__,
                    codes=frozenset({item.__code__}),
                )
            )
        elif cleanup_method_names(item) or is_exit_stack(item):
            self.consider(self.names.get(id(item), type(item).__qualname__), item)
        else:
            raise ValueError(
                f"watch: cannot count cleanups of {item!r}; accepted: a function, a bound "
                "method, an object with close/shutdown/terminate/release/stop, an ExitStack, "
                "or an attribute path string such as 'cache.close'"
            )

    def add_path(self, path: str) -> None:
        current: object = self.obj
        parts = path.split(".")
        for index, part in enumerate(parts):
            try:
                nxt = getattr(current, part)
            except AttributeError:
                raise ValueError(
                    f"watch: {type(self.obj).__qualname__} has no attribute path {path!r} "
                    f"(missing {part!r})"
                ) from None
            if index == len(parts) - 1 and isinstance(nxt, types.MethodType):
                attribute = ".".join(parts[:-1])
                self.add(method_spec(nxt.__self__, part, path, attribute))
                return
            current = nxt
        if not (cleanup_method_names(current) or is_exit_stack(current)):
            raise ValueError(
                f"watch: {path!r} is neither a method nor an object with "
                f"{'/'.join(CLEANUP_METHODS)}"
            )
        self.consider(path, current)


def _closure(wrapper: Callable[..., Any]) -> dict[str, Any]:
    """The free variables of an ExitStack ``callback()`` wrapper (empty cells left out)."""
    code = getattr(wrapper, "__code__", None)
    cells = getattr(wrapper, "__closure__", None) or ()
    found: dict[str, Any] = {}
    if isinstance(code, types.CodeType):
        for var, cell in zip(code.co_freevars, cells, strict=False):
            with contextlib.suppress(ValueError):  # an empty cell
                found[var] = cell.cell_contents
    return found


def _wrapper_arguments(wrapper: Callable[..., Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``args`` and ``kwds`` an ExitStack ``callback()`` wrapper will call its function with."""
    found = _closure(wrapper)
    args, kwargs = found.get("args"), found.get("kwds")
    return (
        tuple(args) if isinstance(args, tuple) else (),
        dict(kwargs) if isinstance(kwargs, dict) else {},
    )


def _closure_spec(
    label: str, qualname: str, wrapper: Callable[..., Any], wrapped: object
) -> CleanupSpec | None:
    """A spec matching one ExitStack ``callback()`` wrapper by the callable it closes over."""
    var = next((v for v, value in _closure(wrapper).items() if value is wrapped), None)
    if var is None:
        return None
    return _code_spec(label, qualname, wrapper.__code__, closure_var=var, closure_id=id(wrapped))


def _code_spec(label: str, qualname: str, code: types.CodeType, **match: Any) -> CleanupSpec:
    """A spec counting ``code`` (``match``: the other fields a frame must match)."""
    return CleanupSpec(f"{label} ({qualname})", label, qualname, frozenset({code}), **match)


def instance_attributes(obj: object) -> Iterator[tuple[str, object]]:
    """``(name, value)`` of the instance attributes of ``obj`` (``__dict__`` and slots)."""
    yield from list(getattr(obj, "__dict__", {}).items())
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                yield name, getattr(obj, name)
            except AttributeError:
                continue


def discover_cleanups(
    obj: object, watch: Iterable[Watch] = (), allow_repeat: Iterable[Watch] = ()
) -> list[CleanupSpec]:
    """Every cleanup of ``obj`` that the helpers count, in a stable order.

    A finalizer's module-level function (``weakref.finalize(self, shutdown, self.processes)``)
    is a cleanup of its own, labelled with its module path (``vllm.v1.utils.shutdown``) and
    matched on the arguments it was registered with. ``allow_repeat`` items (the same kinds as
    ``watch``, or the label of a discovered cleanup) are cleanups declared idempotent by
    contract: counted, never reported as repeated; see also :data:`IDEMPOTENT_BY_CONTRACT`.

    Call it before the first shutdown: ExitStack callbacks are consumed when the stack closes.
    """
    found = _Discovery(obj)
    # resources first, ExitStacks last (a stable sort): so that callbacks can name them
    for name, value in sorted(instance_attributes(obj), key=lambda item: is_exit_stack(item[1])):
        found.consider(name, value)
    for index, (func, args, kwargs) in enumerate(finalizer_registrations(obj)):
        label = f"finalizer {index}"
        owner = getattr(func, "__self__", None)
        if owner is not None and is_exit_stack(owner):
            found.consider(found.names.get(id(owner), f"{label} stack"), owner)
        elif owner is not None and owner is not obj:
            found.add_callback(label, func)
        elif isinstance(func, types.FunctionType):
            found.add(function_spec(func, args, kwargs, label))
        for position, arg in enumerate(args):
            found.consider(f"{label} args[{position}]", arg)
        for key, arg in kwargs.items():
            found.consider(f"{label} kwargs[{key!r}]", arg)
    expanded = _expand_stacks(found, 0)
    for item in watch:
        found.add_watch(item)
    _expand_stacks(found, expanded)
    return _allow_repeats(found, tuple(allow_repeat))


def _expand_stacks(found: _Discovery, start: int) -> int:
    """Expand the ExitStacks found from ``start`` on (and those found while expanding)."""
    index = start
    while index < len(found.stacks):
        label, stack = found.stacks[index]
        found.expand_stack(label, stack)
        index += 1
    return index


def _allow_repeats(found: _Discovery, allow_repeat: tuple[Watch, ...]) -> list[CleanupSpec]:
    """Mark the ``allow_repeat`` cleanups idempotent (adding those not discovered)."""
    if not allow_repeat:
        return found.specs
    labels = {spec.label for spec in found.specs}
    by_label: set[str] = set()
    declared = _Discovery(found.obj, names=dict(found.names))
    for item in allow_repeat:
        if isinstance(item, str) and item in labels:
            by_label.add(item)
        else:
            declared.add_watch(item)
    _expand_stacks(declared, 0)
    specs = []
    claimed: set[int] = set()
    for spec in found.specs:
        hits = [i for i, other in enumerate(declared.specs) if _same_cleanup(spec, other)]
        claimed.update(hits)
        specs.append(replace(spec, idempotent=True) if hits or spec.label in by_label else spec)
    for index, other in enumerate(declared.specs):
        if index not in claimed:
            specs.append(replace(other, idempotent=True))
    return specs


def _same_cleanup(spec: CleanupSpec, declared: CleanupSpec) -> bool:
    same_code = bool(spec.codes & declared.codes) or (
        spec.c_name is not None and spec.c_name == declared.c_name
    )
    if not same_code:
        return False
    return declared.self_id is None or declared.self_id == spec.self_id


#: Code flags of functions whose frames suspend and resume (each resumption is a profile "call").
_SUSPENDING = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
_YIELD_VALUE = dis.opmap["YIELD_VALUE"]
_YIELD_FROM = dis.opmap.get("YIELD_FROM", -1)  # 3.10's await
_RESUME = dis.opmap.get("RESUME", -1)  # 3.13 stops after the yield, at the RESUME that follows


def _suspends(frame: types.FrameType) -> bool:
    """A "return" event of a coroutine or generator frame that yields (an ``await`` suspending),
    not one that ends it: the frame stopped at a yield (3.10: before its YIELD_FROM)."""
    code = frame.f_code
    at = frame.f_lasti
    if not code.co_flags & _SUSPENDING or at < 0:
        return False
    ops = code.co_code
    here = ops[at]
    if here == _YIELD_VALUE or (here == _RESUME and at >= 2 and ops[at - 2] == _YIELD_VALUE):
        return True
    return at + 2 < len(ops) and ops[at + 2] == _YIELD_FROM


class _ThreadState:
    __slots__ = ("round", "depth", "frames", "c_stack")

    def __init__(self, round_name: str) -> None:
        self.round = round_name
        self.depth: dict[int, int] = {}
        self.frames: dict[int, list[int]] = {}
        self.c_stack: list[tuple[int, list[int]]] = []


class CleanupCounter:
    """Counts calls to ``specs`` per round, on the threads that :meth:`charge` a round."""

    def __init__(self, specs: Iterable[CleanupSpec]) -> None:
        self.specs: list[CleanupSpec] = list(specs)
        self._by_code: dict[types.CodeType, list[int]] = {}
        self._by_c_name: dict[str, list[int]] = {}
        for index, spec in enumerate(self.specs):
            for code in spec.codes:
                self._by_code.setdefault(code, []).append(index)
            if spec.c_name is not None:
                self._by_c_name.setdefault(spec.c_name, []).append(index)
        self._counts: dict[tuple[int, str], int] = {}
        self._rounds: list[str] = []
        self._lock = threading.Lock()

    @property
    def rounds(self) -> list[str]:
        """The rounds charged so far, in order."""
        return list(self._rounds)

    def count(self, spec_index: int, round_name: str) -> int:
        return self._counts.get((spec_index, round_name), 0)

    def table(self) -> dict[str, dict[str, int]]:
        """``{label: {round: count}}`` for every spec and every round charged."""
        return {
            spec.label: {name: self.count(index, name) for name in self._rounds}
            for index, spec in enumerate(self.specs)
        }

    @contextlib.contextmanager
    def charge(self, round_name: str) -> Iterator[None]:
        """Count the cleanups this thread calls inside the block as ``round_name``.

        The previous profile hook of the thread (coverage, a debugger) keeps being called and is
        restored on exit, also when the block raises. On CPython 3.11 a stuck async-exception
        flag (left by anyone clearing a thread's async exception) is reset first: with it, the
        first profiled Python call would spin forever (see
        :data:`pytest_shutdown._os.async_exc.STALE_ASYNC_EXC_LOOPS`).
        """
        with self._lock:
            if round_name not in self._rounds:
                self._rounds.append(round_name)
        reset_async_exc_flag()
        previous = sys.getprofile()
        hook = self._make_hook(_ThreadState(round_name), previous)
        sys.setprofile(hook)
        try:
            yield
        finally:
            sys.setprofile(previous)

    def _bump(self, index: int, round_name: str) -> None:
        with self._lock:
            key = (index, round_name)
            self._counts[key] = self._counts.get(key, 0) + 1

    def _matches(self, index: int, frame: types.FrameType) -> bool:
        spec = self.specs[index]
        if spec.self_id is None and spec.closure_var is None and not spec.arg_ids:
            return True
        code = frame.f_code
        values = frame.f_locals
        for name, value_id in spec.arg_ids:
            if id(values.get(name)) != value_id:
                return False
        if spec.self_id is not None:
            if code.co_argcount < 1 or id(values.get(code.co_varnames[0])) != spec.self_id:
                return False
        if spec.closure_var is not None:
            if id(values.get(spec.closure_var)) != spec.closure_id:
                return False
        return True

    def _enter(self, state: _ThreadState, indexes: list[int]) -> list[int]:
        for index in indexes:
            depth = state.depth.get(index, 0)
            if depth == 0:
                self._bump(index, state.round)
            state.depth[index] = depth + 1
        return indexes

    def _leave(self, state: _ThreadState, indexes: list[int]) -> None:
        for index in indexes:
            state.depth[index] = max(0, state.depth.get(index, 1) - 1)

    def _make_hook(self, state: _ThreadState, previous: _ProfileHook | None) -> _ProfileHook:
        by_code = self._by_code
        by_c_name = self._by_c_name

        def hook(frame: types.FrameType, event: Any, arg: Any) -> None:
            if previous is not None:
                previous(frame, event, arg)
            if event == "call":
                candidates = by_code.get(frame.f_code)
                if candidates and id(frame) not in state.frames:  # not a coroutine resuming
                    matched = [i for i in candidates if self._matches(i, frame)]
                    if matched:
                        state.frames[id(frame)] = self._enter(state, matched)
            elif event == "return":
                if state.frames:
                    left = state.frames.get(id(frame))
                    if left and not _suspends(frame):  # a coroutine's await is no return
                        del state.frames[id(frame)]
                        self._leave(state, left)
            elif event == "c_call":
                candidates = by_c_name.get(getattr(arg, "__name__", ""))
                if candidates:
                    owner = id(getattr(arg, "__self__", None))
                    matched = [i for i in candidates if self.specs[i].self_id == owner]
                    if matched:
                        state.c_stack.append((id(arg), self._enter(state, matched)))
            elif event in ("c_return", "c_exception"):
                if state.c_stack and state.c_stack[-1][0] == id(arg):
                    self._leave(state, state.c_stack.pop()[1])

        return hook


def labels_performed(counter: CleanupCounter, round_name: str) -> list[str]:
    """Labels of the cleanups that ran at least once in ``round_name``."""
    return [
        spec.label
        for index, spec in enumerate(counter.specs)
        if counter.count(index, round_name) > 0
    ]
