"""The resource kinds the guard checks after every test, and the registry that lists them.

Each kind is one module with one class following :class:`.base.ResourceKind`; :data:`KINDS`
names them, in report order, with the ``allow_leaks`` keyword of each. The modules are imported
only when the guard is on; ``--shutdown-resources`` chooses which kinds run.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.resources.base import ResourceKind

__all__ = [
    "ENDS_EVERY_SESSION",
    "KINDS",
    "allow_keys",
    "default_kinds",
    "kind_names",
    "load_kind",
    "session_end_kinds",
]

#: kind name -> (allow_leaks keyword, "module:Class"). Order is the order of the findings.
KINDS: dict[str, tuple[str, str]] = {
    "threads": ("threads", "pytest_shutdown.resources.threads:ThreadKind"),
    "native-threads": ("threads", "pytest_shutdown.resources.native_threads:NativeThreadKind"),
    "processes": ("processes", "pytest_shutdown.resources.processes:ProcessKind"),
    "collateral": ("collateral", "pytest_shutdown.resources.collateral:CollateralKind"),
    "asyncio": ("asyncio", "pytest_shutdown.resources.asyncio_tasks:AsyncioKind"),
    "zmq": ("zmq", "pytest_shutdown.resources.zmq_sockets:ZmqKind"),
    "gc-freeze": ("gc_freeze", "pytest_shutdown.resources.gc_freeze:FreezeKind"),
    "fds": ("fds", "pytest_shutdown.resources.fds:FdKind"),
    "ports": ("ports", "pytest_shutdown.resources.ports:PortKind"),
    "shm": ("shm", "pytest_shutdown.resources.shm:ShmKind"),
    "global-state": ("global_state", "pytest_shutdown.resources.global_state:GlobalStateKind"),
    "atexit": ("atexit", "pytest_shutdown.resources.atexit_holds:AtexitKind"),
    "process-groups": (
        "process_groups",
        "pytest_shutdown.resources.process_groups:ProcessGroupKind",
    ),
}

#: The kinds whose session-end hooks run even when not chosen: nothing the session's tests
#: started may outlive it.
ENDS_EVERY_SESSION: frozenset[str] = frozenset({"processes"})


def kind_names() -> tuple[str, ...]:
    """Every kind's name, as ``--shutdown-resources`` accepts them."""
    return tuple(KINDS)


def allow_keys() -> tuple[str, ...]:
    """The ``allow_leaks`` keywords, one per kind (kinds may share one), in registry order."""
    return tuple(dict.fromkeys(key for key, _ in KINDS.values()))


def load_kind(name: str, **options: Any) -> ResourceKind:
    """Import and build the kind ``name`` (``options`` go to its constructor when it takes them)."""
    _, target = KINDS[name]
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    kind: ResourceKind = cls(**{k: v for k, v in options.items() if k in _parameters(cls)})
    return kind


def _parameters(cls: type) -> tuple[str, ...]:
    """The names ``cls(...)`` takes (``inspect.signature`` costs milliseconds per class)."""
    code = getattr(getattr(cls, "__init__", None), "__code__", None)
    if code is None:  # object.__init__: no options
        return ()
    return tuple(code.co_varnames[1 : code.co_argcount + code.co_kwonlyargcount])


def default_kinds(names: Iterable[str] | None = None, **options: Any) -> list[ResourceKind]:
    """The kinds the guard walks: ``names`` (validated by the settings), else every kind."""
    chosen = set(KINDS if names is None else names)
    return [load_kind(name, **options) for name in KINDS if name in chosen]


def session_end_kinds(chosen: Iterable[ResourceKind], **options: Any) -> list[ResourceKind]:
    """The kinds whose session-end hooks the guard calls, in registry order: the ``chosen`` ones,
    and each of :data:`ENDS_EVERY_SESSION` built now when it was not chosen."""
    by_name = {kind.name: kind for kind in chosen}
    ends = [
        by_name.pop(name) if name in by_name else load_kind(name, **options)
        for name in KINDS
        if name in by_name or name in ENDS_EVERY_SESSION
    ]
    return ends + list(by_name.values())  # a kind outside the registry last (none today)
