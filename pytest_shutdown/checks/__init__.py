"""Deprecated: the helpers' modules moved to :mod:`pytest_shutdown.helpers` (issue 47).

``import pytest_shutdown.checks.leaks`` (and every other ``checks.<module>`` of 0.2.0) still
works for one release: it warns (``DeprecationWarning``) and gives the module it moved to (of the
same name under ``pytest_shutdown.helpers``, or :data:`_BELOW`), the same object, so no state is
loaded twice. Nothing of the package imports this one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

_OLD = __name__ + "."
#: 0.2.0's modules that moved below the helpers (issue 47); every other one is under helpers/.
_BELOW = {
    "backrefs": "pytest_shutdown.ownership.backrefs",
    "hidden": "pytest_shutdown._base.hidden",
    "phases": "pytest_shutdown._os.phases",
}


def _new(old: str) -> str:
    name = old[len(_OLD) :]
    return _BELOW.get(name, "pytest_shutdown.helpers." + name)


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``pytest_shutdown.checks.X`` and loads it as ``pytest_shutdown.helpers.X``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(_OLD):
            return None
        if importlib.util.find_spec(_new(fullname)) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _new(spec.name)
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        # The import system sets the alias's spec on the module next: keep the module's own.
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        assert spec is not None
        module.__spec__ = spec.loader_state  # the module stays itself (reload, pickling)


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Moved())
