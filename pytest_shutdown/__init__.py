"""pytest-shutdown: make the shutdown paths of inference engines testable.

The helpers are re-exported here, one name per contract (docs/api.md states the rule), resolved
lazily: importing the package (or loading the plugin) stays cheap and never imports torch.
Names that left the top level still resolve for one release, with a ``DeprecationWarning``
naming their replacement (``_DEPRECATED``).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Any


def _not_rewritten(package: str = "pytest_shutdown") -> None:
    """Take this package off the list of modules pytest rewrites the asserts of: its import
    hook costs about 0.25 ms a module, 10 ms of a guarded session, and no assert of this package
    is one a user reads. Where pytest's list is not what this expects, nothing changes. Done
    here, before this package imports any module of its own (the plugin loads this first)."""
    for finder in sys.meta_path:
        names = getattr(finder, "_must_rewrite", None)
        if isinstance(names, set) and package in names:
            names.discard(package)
            cache = getattr(finder, "_marked_for_rewrite_cache", None)
            if isinstance(cache, dict):
                cache.clear()


_not_rewritten()

# The package's own modules, imported once they are off pytest's rewrite list.
from pytest_shutdown._base.frozen_at_import import (  # noqa: E402
    FROZEN_AT_IMPORT as _FROZEN_AT_IMPORT,
)
from pytest_shutdown._base.moved import alias_moved_modules  # noqa: E402

__version__ = "0.3.0"

_LAZY: dict[str, str] = {
    "FINDING_CODES": "pytest_shutdown.findings.finding",
    "Finding": "pytest_shutdown.findings.finding",
    "ShutdownContractError": "pytest_shutdown.findings.finding",
    "assert_idempotent_shutdown": "pytest_shutdown.helpers.idempotence",
    "NothingCountedError": "pytest_shutdown.helpers.idempotence",
    "assert_finalizes_on_gc": "pytest_shutdown.helpers.finalization",
    "assert_finalizers_ok": "pytest_shutdown.helpers.finalization",
    "assert_nonblocking_shutdown": "pytest_shutdown.helpers.executors",
    "no_leaks": "pytest_shutdown.helpers.leaks",
    "no_task_leaks": "pytest_shutdown.helpers.tasks",
    "assert_no_collateral": "pytest_shutdown.helpers.collateral",
    "no_global_state_changes": "pytest_shutdown.helpers.state",
    "no_logged_errors": "pytest_shutdown.helpers.quiet",
    "assert_device_memory_released": "pytest_shutdown.helpers.leaks",
    "no_os_leaks": "pytest_shutdown.resources.check",
    "timeout_matrix": "pytest_shutdown.helpers.timeouts",
    "assert_timeout_decoupling": "pytest_shutdown.helpers.timeouts",
    "TimeoutCell": "pytest_shutdown.helpers.timeouts",
    "TimeoutMatrix": "pytest_shutdown.helpers.timeouts",
    "probe_exit": "pytest_shutdown.helpers.exits",
    "ExitRecord": "pytest_shutdown.helpers.exits",
    "assert_not_force_killed": "pytest_shutdown.helpers.exits",
    "assert_freeze_policy": "pytest_shutdown.helpers.freeze",
    "FreezeScenario": "pytest_shutdown.helpers.freeze",
    "timeout_passed_to": "pytest_shutdown.helpers.spies",
    "NotCalledError": "pytest_shutdown.helpers.spies",
    "kill_tree_at": "pytest_shutdown.helpers.orphans",
    "TreeDeath": "pytest_shutdown.helpers.orphans",
    "assert_process_group_destroyed": "pytest_shutdown.helpers.process_groups",
    "assert_ray_released": "pytest_shutdown.helpers.ray_resources",
    "CheckReport": "pytest_shutdown.helpers.report",
    "assert_no_growth": "pytest_shutdown.helpers.growth",
    "GrowthRecord": "pytest_shutdown.helpers.growth",
    "assert_second_engine_clean": "pytest_shutdown.helpers.second_engine",
    "ShutdownLeakWarning": "pytest_shutdown.findings.leak_warning",
    "ShutdownBudgetExceeded": "pytest_shutdown.plugin.budget",
    # the values of the plugin's fixtures, for type hints in a test or conftest
    "ShutdownTimeouts": "pytest_shutdown.plugin.matrix",
    "ForceKillExpectation": "pytest_shutdown.plugin.fixtures",
    "ShutdownCheck": "pytest_shutdown.plugin.fixtures",
}

__all__ = ["__version__", *_LAZY]

_ORPHANS = "pytest_shutdown.orphans"
_HARNESS = "pytest_shutdown.harness"
_DEVICES = "pytest_shutdown.devices"

#: Names that left the top level: ``name -> (module to take it from, what to use instead)``.
_DEPRECATED: dict[str, tuple[str, str]] = {
    # harness plumbing, moved to a public submodule
    "TreeLauncher": (_ORPHANS, "pytest_shutdown.orphans.TreeLauncher"),
    "TreeProcess": (_ORPHANS, "pytest_shutdown.orphans.TreeProcess"),
    "report_phase": (_ORPHANS, "pytest_shutdown.orphans.report_phase"),
    "wanted_phase": (_ORPHANS, "pytest_shutdown.orphans.wanted_phase"),
    "kill_process_trees": (_ORPHANS, "pytest_shutdown.orphans.kill_process_trees"),
    "zero_window_override": (_HARNESS, "pytest_shutdown.harness.zero_window_override"),
    "freeze_scenarios": (_HARNESS, "pytest_shutdown.harness.freeze_scenarios"),
    "outcome_from_processes": (_HARNESS, "pytest_shutdown.harness.outcome_from_processes"),
    "configure_graphs": (_HARNESS, "pytest_shutdown.harness.configure_graphs"),
    "process_groups": (_HARNESS, "pytest_shutdown.harness.process_groups"),
    "collective_wait": (_HARNESS, "pytest_shutdown.harness.collective_wait"),
    "release_ray_leftovers": (_HARNESS, "pytest_shutdown.harness.release_ray_leftovers"),
    # exported twice: the device readers' own module is their one home
    "detect_platform": (_DEVICES, "pytest_shutdown.devices.detect_platform"),
    "memory_reader": (_DEVICES, "pytest_shutdown.devices.memory_reader"),
    # a second verb for a contract that keeps one
    "check_finalizers": (
        "pytest_shutdown.helpers.finalization",
        "pytest_shutdown.assert_finalizers_ok (the ShutdownContractError it raises carries "
        "the same findings as .findings)",
    ),
    "ray_leftovers": (
        "pytest_shutdown.helpers.ray_resources",
        "pytest_shutdown.assert_ray_released (the ShutdownContractError it raises carries "
        "the same findings as .findings)",
    ),
    "measure_growth": (
        "pytest_shutdown.helpers.growth",
        "pytest_shutdown.assert_no_growth (it returns the same GrowthRecord when nothing grew; "
        "the ShutdownContractError it raises carries the findings)",
    ),
    "assert_tree_dies": (
        "pytest_shutdown.helpers.orphans",
        "pytest_shutdown.kill_tree_at (assert record.died, record.findings), or the kill_tree "
        "fixture",
    ),
}


_PLUGIN = "pytest_shutdown.plugin."
#: 0.3.0's modules of the package root that moved into the plugin's folder (issue 47): each old
#: path still imports for one release, as the same module, with a DeprecationWarning.
_MOVED_MODULES: dict[str, str] = {
    "pytest_shutdown.guard": _PLUGIN + "guard",
    "pytest_shutdown.guard_state": _PLUGIN + "guard.state",
    "pytest_shutdown.guard_ledger": _PLUGIN + "guard.ledger",
    "pytest_shutdown.guard_owners": _PLUGIN + "guard.owners",
    "pytest_shutdown.guard_reports": _PLUGIN + "guard.reports",
    "pytest_shutdown.guard_session_end": _PLUGIN + "guard.session_end",
    **{
        f"pytest_shutdown.{name}": _PLUGIN + name
        for name in (
            "budget",
            "contract_errors",
            "cycles",
            "exit_bound",
            "fixtures",
            "hang",
            "interrupts",
            "matrix",
            "orphan_matrix",
            "pending",
            "quiet",
            "ray_cluster",
            "records",
            "report",
            "settings",
            "workers",
        )
    },
}


def _moved_module(old: str) -> str | None:
    return _MOVED_MODULES.get(old)


alias_moved_modules(_moved_module)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _DEPRECATED:
        home, replacement = _DEPRECATED[name]
        # not cached in globals(): every import of a deprecated name warns
        warnings.warn(
            f"pytest_shutdown.{name} is deprecated and leaves the top level in 0.4.0; "
            f"use {replacement}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'pytest_shutdown' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.findings.finding import FINDING_CODES, Finding, ShutdownContractError
    from pytest_shutdown.findings.leak_warning import ShutdownLeakWarning
    from pytest_shutdown.helpers.collateral import assert_no_collateral
    from pytest_shutdown.helpers.executors import assert_nonblocking_shutdown
    from pytest_shutdown.helpers.exits import ExitRecord, assert_not_force_killed, probe_exit
    from pytest_shutdown.helpers.finalization import assert_finalizers_ok, assert_finalizes_on_gc
    from pytest_shutdown.helpers.freeze import FreezeScenario, assert_freeze_policy
    from pytest_shutdown.helpers.growth import GrowthRecord, assert_no_growth
    from pytest_shutdown.helpers.idempotence import NothingCountedError, assert_idempotent_shutdown
    from pytest_shutdown.helpers.leaks import assert_device_memory_released, no_leaks
    from pytest_shutdown.helpers.orphans import TreeDeath, kill_tree_at
    from pytest_shutdown.helpers.process_groups import assert_process_group_destroyed
    from pytest_shutdown.helpers.quiet import no_logged_errors
    from pytest_shutdown.helpers.ray_resources import assert_ray_released
    from pytest_shutdown.helpers.report import CheckReport
    from pytest_shutdown.helpers.second_engine import assert_second_engine_clean
    from pytest_shutdown.helpers.spies import NotCalledError, timeout_passed_to
    from pytest_shutdown.helpers.state import no_global_state_changes
    from pytest_shutdown.helpers.tasks import no_task_leaks
    from pytest_shutdown.helpers.timeouts import (
        TimeoutCell,
        TimeoutMatrix,
        assert_timeout_decoupling,
        timeout_matrix,
    )
    from pytest_shutdown.plugin.budget import ShutdownBudgetExceeded
    from pytest_shutdown.plugin.fixtures import ForceKillExpectation, ShutdownCheck
    from pytest_shutdown.plugin.matrix import ShutdownTimeouts
    from pytest_shutdown.resources.check import no_os_leaks
