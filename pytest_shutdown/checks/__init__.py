"""Deprecated: the helpers' modules moved to :mod:`pytest_shutdown.helpers` (issue 47).

``import pytest_shutdown.checks.leaks`` (and every other ``checks.<module>`` of 0.2.0) still
works for one release: it warns (``DeprecationWarning``) and gives the module it moved to (of the
same name under ``pytest_shutdown.helpers``, or :data:`_BELOW`), the same object, so no state is
loaded twice (:mod:`pytest_shutdown._base.moved`). Nothing of the package imports this one.
"""

from __future__ import annotations

from pytest_shutdown._base.moved import alias_moved_modules

_OLD = __name__ + "."
#: 0.2.0's modules that moved below the helpers (issue 47); every other one is under helpers/.
_BELOW = {
    "backrefs": "pytest_shutdown.ownership.backrefs",
    "hidden": "pytest_shutdown._base.hidden",
    "phases": "pytest_shutdown._os.phases",
}


def _new(old: str) -> str | None:
    if not old.startswith(_OLD):
        return None
    name = old[len(_OLD) :]
    return _BELOW.get(name, "pytest_shutdown.helpers." + name)


alias_moved_modules(_new)
