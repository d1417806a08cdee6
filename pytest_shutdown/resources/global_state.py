"""Process-wide state a test changed and did not put back (``global-state``).

What the next test silently inherits: the garbage collector (enabled, thresholds), the handler
of every catchable signal, the ``multiprocessing`` start method when it was forced, the
``sys``/``threading`` excepthooks, and ``os.environ`` (copied only when it changed). Never
reported: what pytest, its plugins and pytest-shutdown change themselves. Fail mode puts back
what it can.

A variable set by a module's import is the import's, not the test's (vLLM's ``vllm._aiter_ops``
sets ``AITER_SITUV2_A4W4=1`` at import): a changed variable is left out when a module imported
since the baseline assigns it in its source (``environ[...] =``, ``environ.setdefault(``/
``.update(``, ``putenv(``; a text search made only when a variable changed).
"""

from __future__ import annotations

import gc
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from pytest_shutdown.findings.finding import Finding
from pytest_shutdown.resources.base import Change, Extra, StateKind

__all__ = ["GlobalStateKind", "catchable_signals"]

#: Modules whose handlers and hooks are the test tools' own: never reported.
_TOOL_MODULES = frozenset(
    {"_pytest", "pytest", "pluggy", "pytest_shutdown", "xdist", "execnet", "pytest_timeout"}
)
#: Handlers and hooks libraries install once, for the process's lifetime, on first use (torch's
#: DataLoader chains a SIGCHLD handler to notice dead workers; ``init_process_group`` chains a
#: ``sys.excepthook`` that prefixes the rank): never a test's change.
PROCESS_LIFETIME_HANDLERS = (
    "torch.utils.data._utils.signal_handling",
    "torch.distributed.distributed_c10d",
)
#: Environment variables the test tools set per test or per worker: never reported.
_TOOL_ENV_PREFIXES = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_", "PYTEST_SHUTDOWN_")
_MISSING = object()
#: pytest's per-phase variable, as ``os.environ``'s raw dict holds it (bytes on POSIX)
_CURRENT_TEST_KEYS = (b"PYTEST_CURRENT_TEST", "PYTEST_CURRENT_TEST")


def catchable_signals() -> tuple[signal.Signals, ...]:
    """Every named signal a handler can be installed for (SIGKILL and SIGSTOP cannot be
    caught; the real-time signals between SIGRTMIN and SIGRTMAX have no name and are left
    out)."""
    uncatchable = {getattr(signal, "SIGKILL", None), getattr(signal, "SIGSTOP", None)}
    named = {int(member): member for member in signal.Signals}  # one pass, not an enum call each
    valid = signal.valid_signals()
    return tuple(
        named[number]
        for number in sorted(named)
        if number in valid and named[number] not in uncatchable
    )


try:  # the C function: signal.getsignal converts every answer to an enum, 30x slower
    from _signal import getsignal as _getsignal
except ImportError:  # pragma: no cover - another interpreter
    _getsignal = signal.getsignal


def _is_tool_callable(value: object) -> bool:
    func = getattr(value, "__func__", value)
    func = getattr(func, "func", func)  # a functools.partial: what it calls
    module = getattr(func, "__module__", None) or ""
    return module.partition(".")[0] in _TOOL_MODULES


#: What a fingerprint shows for a signal handler of the test tools' own.
_TOOLS_HANDLER = "<a test tool's handler>"


def _marked(handler: object) -> object:
    """A signal handler as fingerprints show it: a test tool's as one placeholder."""
    tool = handler is not None and not isinstance(handler, int) and _is_tool_callable(handler)
    return _TOOLS_HANDLER if tool else handler


_SIGNAL_DEFAULTS: tuple[object, ...] = (signal.SIG_DFL, signal.default_int_handler, None)
_HOOK_DEFAULTS: tuple[object, ...] = (sys.__excepthook__, threading.__excepthook__)


def _is_process_lifetime(value: object) -> bool:
    func = getattr(value, "__func__", value)
    module = getattr(func, "__module__", None) or ""
    return module.startswith(PROCESS_LIFETIME_HANDLERS)


def _tools_own(old: object, new: object, defaults: tuple[object, ...]) -> bool:
    """The test tools' own change (they installed ``new``, or put the default back over their
    ``old``), or a library's process-lifetime handler (:data:`PROCESS_LIFETIME_HANDLERS`)."""
    if _is_tool_callable(new) or _is_process_lifetime(new):
        return True
    return _is_tool_callable(old) and any(new is d or _same_int(new, d) for d in defaults)


def _same_int(a: object, b: object) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a == b


def _describe(value: object) -> str:
    if value is _MISSING:
        return "unset"
    if isinstance(value, int) and value == signal.SIG_DFL:  # the C getsignal answers ints
        return "SIG_DFL (default)"
    if isinstance(value, int) and value == signal.SIG_IGN:
        return "SIG_IGN (ignored)"
    if value is None:
        return "None"
    func = getattr(value, "__func__", value)
    func = getattr(func, "func", func)  # a functools.partial: what it calls
    name = getattr(func, "__qualname__", None)
    module = getattr(func, "__module__", None)
    if name:
        return f"{module}.{name}" if module else name
    return repr(value)


def _set_start_method_context(value: Any) -> None:
    context = sys.modules.get("multiprocessing.context")
    default = getattr(context, "_default_context", None)
    if default is not None:
        default._actual_context = value


def _environment_equal(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    return a is b or a == b


class GlobalStateKind(StateKind):
    """gc, signal handlers, the start method, the excepthooks and the environment."""

    name = "global-state"
    allow_key = "global_state"
    reads_alone = True  # its fingerprint shares no reading: the one-pass reading asks it bare

    def __init__(self) -> None:
        self.signals = catchable_signals()
        self._numbers = tuple(int(s) for s in self.signals)
        self._raw: dict[Any, Any] = {}
        self._environ: dict[str, str] = {}
        self._signals_seen: tuple[Any, ...] = ()
        self._signals_marked: tuple[Any, ...] = ()
        #: variable -> the module whose import set it (not reported: see the module's doc)
        self.set_by_imports: dict[str, str] = {}
        self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        """Everything in one frame. The environment copy is shared while the raw environment
        compares equal (pytest's ``PYTEST_CURRENT_TEST``, set for every phase, is taken into
        the last copy first: it is no change)."""
        raw = getattr(os.environ, "_data", None)  # os.environ's own dict (bytes on POSIX)
        if not isinstance(raw, dict):
            raw = dict(os.environ)
        last = self._raw
        for key in _CURRENT_TEST_KEYS:
            value = raw.get(key, _MISSING)
            if value is _MISSING:
                last.pop(key, None)
            else:
                last[key] = value
        if raw != last:
            self._raw = dict(raw)
            self._environ = dict(os.environ)
        context = sys.modules.get("multiprocessing.context")
        default = getattr(context, "_default_context", None)
        return {
            "modules": _ModulesMark(),
            "gc": (gc.isenabled(), gc.get_threshold()),
            "signals": tuple(map(_getsignal, self._numbers)),
            "start_method": getattr(default, "_actual_context", None),
            "sys.excepthook": sys.excepthook,
            "threading.excepthook": threading.excepthook,
            "environ": self._environ,
        }

    def fingerprint(self) -> dict[str, Any]:
        """The snapshot, with each signal handler of the test tools' own as one placeholder:
        pytest-timeout installs a new one around every test, which would move every gap."""
        state = self.snapshot()
        signals = state["signals"]
        seen = self._signals_seen
        if signals != seen:  # (identity first, in C): normalised once per change
            if len(seen) == len(signals):  # only the handlers that changed are asked
                self._signals_marked = tuple(
                    marked if handler is was else _marked(handler)
                    for handler, was, marked in zip(
                        signals, seen, self._signals_marked, strict=True
                    )
                )
            else:
                self._signals_marked = tuple(map(_marked, signals))
            self._signals_seen = signals
        state["signals"] = self._signals_marked
        return state

    def diff(self, before: dict[str, Any], after: dict[str, Any]) -> Sequence[Change]:
        try:
            if before == after:  # one comparison in C (identity first): the common case
                return ()
        except Exception:  # noqa: BLE001 - a hostile __eq__: compare piece by piece below
            pass
        changes: list[Change] = []
        (was_on, was_thresholds), (is_on, thresholds) = before["gc"], after["gc"]
        if was_on and not is_on:
            changes.append(Change("gc", "enabled", "disabled", undo=gc.enable))
        if was_thresholds != thresholds:
            undo = partial(gc.set_threshold, *was_thresholds)
            changes.append(Change("gc thresholds", was_thresholds, thresholds, undo=undo))
        if before["signals"] is not after["signals"]:
            for sig, old, new in zip(
                self.signals, before["signals"], after["signals"], strict=True
            ):
                if old is new or old == new or _tools_own(old, new, _SIGNAL_DEFAULTS):
                    continue
                key, undo_signal = f"signal handler {sig.name}", _signal_undo(sig, old)
                changes.append(Change(key, _describe(old), _describe(new), undo=undo_signal))
        old_ctx, new_ctx = before["start_method"], after["start_method"]
        if new_ctx is not old_ctx and new_ctx is not None:
            context = sys.modules.get("multiprocessing.context")
            default = getattr(getattr(context, "_default_context", None), "_default_context", None)
            if old_ctx is not None or new_ctx is not default:  # forced, not decided lazily
                was, now = (_start_method_name(c, default) for c in (old_ctx, new_ctx))
                undo = partial(_set_start_method_context, old_ctx)
                changes.append(Change("multiprocessing start method", was, now, undo=undo))
        for hook, setter in (
            ("sys.excepthook", lambda v: setattr(sys, "excepthook", v)),
            ("threading.excepthook", lambda v: setattr(threading, "excepthook", v)),
        ):
            old, new = before[hook], after[hook]
            if old is not new and not _tools_own(old, new, _HOOK_DEFAULTS):
                changes.append(
                    Change(hook, _describe(old), _describe(new), undo=partial(setter, old))
                )
        old_environ, new_environ = before["environ"], after["environ"]
        if not _environment_equal(old_environ, new_environ):
            names = _changed_names(old_environ, new_environ)
            mark = before.get("modules")
            imported = (
                _set_by_imports(names, mark) if names and isinstance(mark, _ModulesMark) else {}
            )
            self.set_by_imports.update(imported)
            changes.extend(
                _environment_change(old_environ, new_environ, key)
                for key in names
                if key not in imported
            )
        return changes

    def absorb(self, before: dict[str, Any], start: dict[str, Any], end: dict[str, Any]) -> Any:
        rebased = dict(before)
        for key in ("gc", "start_method", "sys.excepthook", "threading.excepthook"):
            if start[key] is not end[key] and start[key] != end[key]:
                rebased[key] = end[key]
        if start["signals"] != end["signals"]:
            rebased["signals"] = tuple(
                new if old is not new else base
                for base, old, new in zip(
                    before["signals"], start["signals"], end["signals"], strict=True
                )
            )
        if not _environment_equal(start["environ"], end["environ"]):
            environ = dict(before["environ"])
            for key in set(start["environ"]) | set(end["environ"]):
                old, new = start["environ"].get(key), end["environ"].get(key)
                if old != new:
                    if new is None:
                        environ.pop(key, None)
                    else:
                        environ[key] = new
            rebased["environ"] = environ
        return rebased

    def findings(
        self, items: Sequence[Change], subject: str, *, grace: float, extra: Extra = None
    ) -> list[Finding]:
        if not items:
            return []
        described = "; ".join(_change_text(c) for c in items)
        message = f"{subject} left process-wide state changed: {described}."
        changes = [{"what": c.key, "before": str(c.before), "after": str(c.after)} for c in items]
        return [Finding("global-state", message, {"changes": changes, **dict(extra or {})})]


def _change_text(change: Change) -> str:
    """``key: after (was before)``; a new object that reads as the old one did (a fresh
    ``functools.partial`` of the same method, installed by each test's set-up) says so."""
    after, before = str(change.after), str(change.before)
    if after == before:
        return f"{change.key}: {after}, a new one (the one before reads the same)"
    return f"{change.key}: {after} (was {before})"


def _signal_undo(sig: signal.Signals, handler: Any) -> Callable[[], None] | None:
    if handler is None:  # installed outside Python: cannot be put back from here
        return None

    def undo() -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(sig, handler)

    return undo


def _start_method_name(context: Any, default: Any) -> str:
    if context is None:
        name = getattr(default, "_name", None)
        return f"not set (default {name})" if name else "not set"
    return str(getattr(context, "_name", context))


class _ModulesMark:
    """How ``sys.modules`` looked at a snapshot (its size, its last module): the modules imported
    since are after it. Equal to any other mark: an import moves no fingerprint."""

    __slots__ = ("last", "size")

    def __init__(self) -> None:
        self.size = len(sys.modules)
        self.last = next(reversed(sys.modules), None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ModulesMark)

    def __hash__(self) -> int:
        return 0

    def since(self) -> list[tuple[str, Any]]:
        """The modules imported since the mark (its last module gone: those after ``size``)."""
        items = list(sys.modules.items())
        names = [name for name, _ in items]
        if self.last is not None and self.last in sys.modules:
            start = len(names) - names[::-1].index(self.last)
        else:
            start = min(self.size, len(items))
        return items[start:]


def _assigns(name: str) -> re.Pattern[str]:
    quoted = rf"""['"]{re.escape(name)}['"]"""
    return re.compile(
        rf"environ\s*\[\s*{quoted}\s*\]\s*=(?!=)|environ\s*\.\s*(?:setdefault|update)\s*\(\s*"
        rf"(?:{{\s*)?{quoted}|putenv\s*\(\s*{quoted}"
    )


def _set_by_imports(names: Sequence[str], mark: _ModulesMark) -> dict[str, str]:
    """Of the variables ``names``, those a module imported since ``mark`` assigns -> it."""
    found: dict[str, str] = {}
    patterns = {name: _assigns(name) for name in names}
    for module_name, module in mark.since():
        filename = getattr(module, "__file__", None)
        if not isinstance(filename, str) or not filename.endswith(".py"):
            continue
        try:
            with open(filename, encoding="utf-8", errors="replace") as f:
                source = f.read()
        except OSError:
            continue
        for name, pattern in patterns.items():
            if name not in found and name in source and pattern.search(source):
                found[name] = module_name
        if len(found) == len(names):
            break
    return found


def _changed_names(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    return [
        key
        for key in sorted(set(before) | set(after))
        if not key.startswith(_TOOL_ENV_PREFIXES)
        and before.get(key, _MISSING) != after.get(key, _MISSING)
    ]


def _environment_change(before: Mapping[str, str], after: Mapping[str, str], key: str) -> Change:
    old, new = before.get(key, _MISSING), after.get(key, _MISSING)
    was, now = ("unset" if value is _MISSING else repr(value) for value in (old, new))
    return Change(f"os.environ[{key!r}]", was, now, undo=_environ_undo(key, old))


def _environ_undo(key: str, old: object) -> Callable[[], None]:
    def undo() -> None:
        if old is _MISSING:
            os.environ.pop(key, None)
        else:
            os.environ[key] = str(old)

    return undo
