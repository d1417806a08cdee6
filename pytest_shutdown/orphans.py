"""The process-tree harness behind ``kill_tree_at`` and ``@pytest.mark.orphan_matrix``.

What a test or an engine under test calls around a killed tree, not a contract of its own (the
contract is :func:`pytest_shutdown.kill_tree_at`, and the ``kill_tree`` fixture): the warm
launcher that starts trees, a tree's process as read from ``/proc``, the phase announcements an
engine makes and reads, and the killer that ends process trees. Names are resolved lazily:
``report_phase`` and ``wanted_phase`` import nothing else, so an engine process can call them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_shutdown._fast.lazy_exports import lazy_exports

_LAZY: dict[str, str] = {
    "TreeLauncher": "pytest_shutdown.helpers.tree_launcher",
    "TreeProcess": "pytest_shutdown.helpers.tree",
    "report_phase": "pytest_shutdown._os.phases",
    "wanted_phase": "pytest_shutdown._os.phases",
    "kill_process_trees": "pytest_shutdown.resources.primitives",
}

__all__ = [
    "TreeLauncher",
    "TreeProcess",
    "report_phase",
    "wanted_phase",
    "kill_process_trees",
]


__getattr__, __dir__ = lazy_exports('pytest_shutdown.orphans', _LAZY, globals())


if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown._os.phases import report_phase, wanted_phase
    from pytest_shutdown.helpers.tree import TreeProcess
    from pytest_shutdown.helpers.tree_launcher import TreeLauncher
    from pytest_shutdown.resources.primitives import kill_process_trees
