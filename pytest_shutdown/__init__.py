"""pytest-shutdown: make the shutdown paths of inference engines testable.

The public API is re-exported here. Names are resolved lazily so that importing the package (or
loading the pytest plugin) stays cheap and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pytest_shutdown.findings import FINDING_CODES, Finding, ShutdownContractError

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "assert_idempotent_shutdown": "pytest_shutdown.checks.idempotence",
    "assert_finalizes_on_gc": "pytest_shutdown.checks.finalization",
    "check_finalizers": "pytest_shutdown.checks.finalization",
    "assert_nonblocking_shutdown": "pytest_shutdown.checks.executors",
    "no_leaks": "pytest_shutdown.checks.leaks",
    "timeout_matrix": "pytest_shutdown.checks.timeouts",
    "assert_timeout_decoupling": "pytest_shutdown.checks.timeouts",
    "probe_exit": "pytest_shutdown.checks.exits",
    "ExitRecord": "pytest_shutdown.checks.exits",
    "assert_not_force_killed": "pytest_shutdown.checks.exits",
    "kill_tree_at": "pytest_shutdown.checks.orphans",
    "assert_tree_dies": "pytest_shutdown.checks.orphans",
    "TreeDeath": "pytest_shutdown.checks.orphans",
    "TreeLauncher": "pytest_shutdown.checks.tree_launcher",
    "report_phase": "pytest_shutdown.checks.phases",
    "wanted_phase": "pytest_shutdown.checks.phases",
    "CheckReport": "pytest_shutdown.checks.report",
    "detect_platform": "pytest_shutdown.devices",
    "ShutdownLeakWarning": "pytest_shutdown.guard",
}

__all__ = ["FINDING_CODES", "Finding", "ShutdownContractError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_shutdown' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.checks.executors import assert_nonblocking_shutdown
    from pytest_shutdown.checks.exits import ExitRecord, assert_not_force_killed, probe_exit
    from pytest_shutdown.checks.finalization import assert_finalizes_on_gc, check_finalizers
    from pytest_shutdown.checks.idempotence import assert_idempotent_shutdown
    from pytest_shutdown.checks.leaks import no_leaks
    from pytest_shutdown.checks.orphans import TreeDeath, assert_tree_dies, kill_tree_at
    from pytest_shutdown.checks.phases import report_phase, wanted_phase
    from pytest_shutdown.checks.report import CheckReport
    from pytest_shutdown.checks.timeouts import assert_timeout_decoupling, timeout_matrix
    from pytest_shutdown.checks.tree_launcher import TreeLauncher
    from pytest_shutdown.devices import detect_platform
    from pytest_shutdown.guard import ShutdownLeakWarning
