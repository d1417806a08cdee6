"""pytest-shutdown: make the shutdown paths of inference engines testable.

The public API is re-exported here (the reference engine's in :mod:`pytest_shutdown.engine`, the
device readers in :mod:`pytest_shutdown.devices`; docs/api.md lists all three). Names are resolved
lazily so that importing the package (or loading the pytest plugin) stays cheap and never imports
torch.
"""

from __future__ import annotations

import gc
import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

#: ``gc.get_freeze_count()`` when the package was first imported (the plugin loads it before
#: any conftest): what the interpreter froze by itself, not 0 everywhere (a bare CPython 3.12.1
#: starts with 375 of its built-in types' tuples frozen, immortal and owning nothing).
_FROZEN_AT_IMPORT = gc.get_freeze_count()

_LAZY: dict[str, str] = {
    "FINDING_CODES": "pytest_shutdown.findings",
    "Finding": "pytest_shutdown.findings",
    "ShutdownContractError": "pytest_shutdown.findings",
    "assert_idempotent_shutdown": "pytest_shutdown.checks.idempotence",
    "NothingCountedError": "pytest_shutdown.checks.idempotence",
    "assert_finalizes_on_gc": "pytest_shutdown.checks.finalization",
    "check_finalizers": "pytest_shutdown.checks.finalization",
    "assert_finalizers_ok": "pytest_shutdown.checks.finalization",
    "assert_nonblocking_shutdown": "pytest_shutdown.checks.executors",
    "no_leaks": "pytest_shutdown.checks.leaks",
    "assert_no_collateral": "pytest_shutdown.checks.collateral",
    "no_global_state_changes": "pytest_shutdown.checks.state",
    "kill_process_trees": "pytest_shutdown.checks.leaks",
    "assert_device_memory_released": "pytest_shutdown.checks.leaks",
    "no_os_leaks": "pytest_shutdown.resources.check",
    "timeout_matrix": "pytest_shutdown.checks.timeouts",
    "assert_timeout_decoupling": "pytest_shutdown.checks.timeouts",
    "TimeoutCell": "pytest_shutdown.checks.timeouts",
    "TimeoutMatrix": "pytest_shutdown.checks.timeouts",
    "probe_exit": "pytest_shutdown.checks.exits",
    "ExitRecord": "pytest_shutdown.checks.exits",
    "assert_not_force_killed": "pytest_shutdown.checks.exits",
    "outcome_from_processes": "pytest_shutdown.checks.exits",
    "assert_freeze_policy": "pytest_shutdown.checks.freeze",
    "freeze_scenarios": "pytest_shutdown.checks.freeze",
    "FreezeScenario": "pytest_shutdown.checks.freeze",
    "timeout_passed_to": "pytest_shutdown.checks.spies",
    "NotCalledError": "pytest_shutdown.checks.spies",
    "zero_window_override": "pytest_shutdown.checks.timeouts",
    "kill_tree_at": "pytest_shutdown.checks.orphans",
    "assert_tree_dies": "pytest_shutdown.checks.orphans",
    "TreeDeath": "pytest_shutdown.checks.orphans",
    "assert_process_group_destroyed": "pytest_shutdown.checks.process_groups",
    "process_groups": "pytest_shutdown.checks.process_groups",
    "collective_wait": "pytest_shutdown.checks.collectives",
    "assert_ray_released": "pytest_shutdown.checks.ray_resources",
    "ray_leftovers": "pytest_shutdown.checks.ray_resources",
    "release_ray_leftovers": "pytest_shutdown.checks.ray_resources",
    "TreeLauncher": "pytest_shutdown.checks.tree_launcher",
    "TreeProcess": "pytest_shutdown.checks.tree",
    "report_phase": "pytest_shutdown.checks.phases",
    "wanted_phase": "pytest_shutdown.checks.phases",
    "CheckReport": "pytest_shutdown.checks.report",
    "configure_graphs": "pytest_shutdown.checks.backrefs",
    "assert_no_growth": "pytest_shutdown.checks.growth",
    "measure_growth": "pytest_shutdown.checks.growth",
    "GrowthRecord": "pytest_shutdown.checks.growth",
    "assert_second_engine_clean": "pytest_shutdown.checks.second_engine",
    "detect_platform": "pytest_shutdown.devices",
    "memory_reader": "pytest_shutdown.devices",
    "ShutdownLeakWarning": "pytest_shutdown.leak_warning",
    "ShutdownBudgetExceeded": "pytest_shutdown.budget",
    # the values of the plugin's fixtures, for type hints in a test or conftest
    "ShutdownTimeouts": "pytest_shutdown.matrix",
    "ForceKillExpectation": "pytest_shutdown.fixtures",
    "ShutdownCheck": "pytest_shutdown.fixtures",
}

__all__ = ["__version__", *_LAZY]


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
    from pytest_shutdown.budget import ShutdownBudgetExceeded
    from pytest_shutdown.checks.backrefs import configure_graphs
    from pytest_shutdown.checks.collectives import collective_wait
    from pytest_shutdown.checks.executors import assert_nonblocking_shutdown
    from pytest_shutdown.checks.exits import (
        ExitRecord,
        assert_not_force_killed,
        outcome_from_processes,
        probe_exit,
    )
    from pytest_shutdown.checks.finalization import (
        assert_finalizers_ok,
        assert_finalizes_on_gc,
        check_finalizers,
    )
    from pytest_shutdown.checks.freeze import (
        FreezeScenario,
        assert_freeze_policy,
        freeze_scenarios,
    )
    from pytest_shutdown.checks.growth import GrowthRecord, assert_no_growth, measure_growth
    from pytest_shutdown.checks.idempotence import NothingCountedError, assert_idempotent_shutdown
    from pytest_shutdown.checks.leaks import (
        assert_device_memory_released,
        kill_process_trees,
        no_leaks,
    )
    from pytest_shutdown.checks.orphans import TreeDeath, assert_tree_dies, kill_tree_at
    from pytest_shutdown.checks.phases import report_phase, wanted_phase
    from pytest_shutdown.checks.process_groups import (
        assert_process_group_destroyed,
        process_groups,
    )
    from pytest_shutdown.checks.ray_resources import (
        assert_ray_released,
        ray_leftovers,
        release_ray_leftovers,
    )
    from pytest_shutdown.checks.report import CheckReport
    from pytest_shutdown.checks.second_engine import assert_second_engine_clean
    from pytest_shutdown.checks.spies import NotCalledError, timeout_passed_to
    from pytest_shutdown.checks.timeouts import (
        TimeoutCell,
        TimeoutMatrix,
        assert_timeout_decoupling,
        timeout_matrix,
        zero_window_override,
    )
    from pytest_shutdown.checks.tree import TreeProcess
    from pytest_shutdown.checks.tree_launcher import TreeLauncher
    from pytest_shutdown.devices import detect_platform, memory_reader
    from pytest_shutdown.findings import FINDING_CODES, Finding, ShutdownContractError
    from pytest_shutdown.fixtures import ForceKillExpectation, ShutdownCheck
    from pytest_shutdown.leak_warning import ShutdownLeakWarning
    from pytest_shutdown.matrix import ShutdownTimeouts
    from pytest_shutdown.resources.check import no_os_leaks
