"""Modules that moved keep their old dotted path for one release (issue 47).

``import OLD`` warns (``DeprecationWarning`` naming the new path) and gives the module it moved
to, the same object, so no state is loaded twice; ``python -m OLD`` runs the new module's code.
A package whose modules moved installs one :class:`MovedModules` for them
(:func:`alias_moved_modules`): ``pytest_shutdown.checks.*`` of 0.2.0, and the package root's
plugin modules of 0.3.0. Nothing here imports :mod:`importlib.abc` (14 ms in a bare interpreter):
a finder and a loader need only their methods.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import CodeType, ModuleType

__all__ = ["MovedModules", "alias_moved_modules"]


class MovedModules:
    """A meta path finder and loader: finds each old name that :attr:`new_name` maps (to a
    module that exists) and loads it as that module."""

    def __init__(self, new_name: Callable[[str], str | None]) -> None:
        #: ``old dotted name -> new dotted name``, or None for a name that did not move.
        self.new_name = new_name

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = self.new_name(fullname)
        if new is None or importlib.util.find_spec(new) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)  # type: ignore[arg-type]

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self._moved(spec.name)
        module = importlib.import_module(new)
        # The import system sets the alias's spec on the module next: keep the module's own.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        assert spec is not None
        module.__spec__ = spec.loader_state  # the module stays itself (reload, pickling)

    def get_code(self, fullname: str) -> CodeType | None:
        """What ``python -m OLD`` runs (:mod:`runpy` asks the loader): the new module's code."""
        new = self._moved(fullname)
        spec = importlib.util.find_spec(new)
        loader = getattr(spec, "loader", None)
        get_code = getattr(loader, "get_code", None)
        return None if get_code is None else get_code(new)  # type: ignore[no-any-return]

    def _moved(self, old: str) -> str:
        new = self.new_name(old)
        assert new is not None, old
        warnings.warn(
            f"{old} moved to {new}; the old path goes in 0.4.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return new


def alias_moved_modules(new_name: Callable[[str], str | None]) -> None:
    """Put a :class:`MovedModules` for ``new_name`` first on :data:`sys.meta_path`, once (a
    module executed again installs no second finder)."""
    key = (new_name.__module__, new_name.__qualname__)
    for finder in sys.meta_path:
        if isinstance(finder, MovedModules):
            known = finder.new_name
            if (known.__module__, known.__qualname__) == key:
                return
    sys.meta_path.insert(0, MovedModules(new_name))
