"""Recording wrappers put on a library's classes, for as long as someone records.

:class:`LazyWrappers` holds the bookkeeping every such recorder needs: installs are counted
(the guard and a helper may both record), the library is never imported for it (when it is not
loaded yet, ``wrap(module)`` runs right after its first import), the originals come back with
the last ``uninstall()`` (only where nobody replaced the wrapper since), and a forked child gets
them back at once.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from pytest_shutdown._os.forks import forget_in_child, undo_in_forked_child
from pytest_shutdown.ownership.origins import _AfterImport, looks_like

__all__ = ["LazyWrappers"]


class LazyWrappers:
    """The wrappers one recorder puts on ``module``'s objects (see the module docstring).

    ``wrap(module)`` installs them with :meth:`patch`; ``forget()`` drops what was recorded (in a
    forked child: the parent's records are the parent's)."""

    def __init__(
        self, module: str, wrap: Callable[[Any], None], forget: Callable[[], None]
    ) -> None:
        self.module = module
        self._wrap = wrap
        self._forget = forget
        self._key = f"wrappers:{module}"
        self.installs = 0
        #: key -> (owner, attribute, original, wrapper, whether the owner defined it itself)
        self._originals: dict[str, tuple[Any, str, Any, Any, bool]] = {}
        self._waiting: list[_AfterImport] = []

    def wrapped(self, key: str) -> bool:
        return key in self._originals

    def install(self) -> None:
        """Start recording (nested calls are counted)."""
        self.installs += 1
        if self.installs > 1:
            return
        loaded = sys.modules.get(self.module)
        if loaded is not None:
            self._wrap(loaded)
        else:
            waiting = _AfterImport(self.module, self._wrap)
            self._waiting.append(waiting)
            sys.meta_path.insert(0, waiting)
        undo_in_forked_child(self._key, self._in_forked_child)

    def patch(self, key: str, owner: Any, attr: str, wrapper: Any) -> None:
        """Put ``wrapper`` in place of ``owner.attr``, looking like the original (see
        :func:`~pytest_shutdown.ownership.origins.looks_like`)."""
        original = getattr(owner, attr)
        looks_like(wrapper, original)
        if isinstance(owner, types.ModuleType):
            # Pickled by reference as owner.attr (os.kill sent to a process pool): the name
            # finds the wrapper here, and the original in a process without the plugin.
            wrapper.__module__, wrapper.__qualname__ = owner.__name__, attr
        self._originals[key] = (owner, attr, original, wrapper, attr in owner.__dict__)
        setattr(owner, attr, wrapper)

    def uninstall(self) -> None:
        """Put the originals back with the last nested call."""
        self.installs = max(self.installs - 1, 0)
        if self.installs:
            return
        for waiting in self._waiting:
            if waiting in sys.meta_path:
                sys.meta_path.remove(waiting)
        self._waiting.clear()
        for owner, attr, original, wrapper, own in self._originals.values():
            if owner.__dict__.get(attr) is not wrapper:
                continue  # replaced since: theirs now
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)  # it was inherited: inherited again
        self._originals.clear()
        forget_in_child(self._key)

    def _in_forked_child(self) -> None:
        self.installs = 1
        self._forget()
        self.uninstall()
