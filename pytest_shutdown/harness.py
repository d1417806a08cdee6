"""Harness plumbing: what builds a helper's inputs, reads a diagnosis, or cleans up after one.

None of these checks a contract (the helpers of :mod:`pytest_shutdown` do): ``expected=`` for
a documented override of the timeout matrix, the freeze policy's default scenarios, an outcome
record read from processes, where backref pictures go, the process groups and the collective a
stack dump shows, and the release of what a leaky engine left on a Ray cluster. Names are
resolved lazily; none imports torch or Ray until it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_shutdown._fast.lazy_exports import lazy_exports

_LAZY: dict[str, str] = {
    "zero_window_override": "pytest_shutdown.helpers.timeouts",
    "freeze_scenarios": "pytest_shutdown.helpers.freeze",
    "outcome_from_processes": "pytest_shutdown.helpers.exits",
    "configure_graphs": "pytest_shutdown.ownership.backrefs",
    "process_groups": "pytest_shutdown.helpers.process_groups",
    "collective_wait": "pytest_shutdown.helpers.collectives",
    "release_ray_leftovers": "pytest_shutdown.helpers.ray_resources",
}

__all__ = [
    "zero_window_override",
    "freeze_scenarios",
    "outcome_from_processes",
    "configure_graphs",
    "process_groups",
    "collective_wait",
    "release_ray_leftovers",
]


__getattr__, __dir__ = lazy_exports('pytest_shutdown.harness', _LAZY, globals())


if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.helpers.collectives import collective_wait
    from pytest_shutdown.helpers.exits import outcome_from_processes
    from pytest_shutdown.helpers.freeze import freeze_scenarios
    from pytest_shutdown.helpers.process_groups import process_groups
    from pytest_shutdown.helpers.ray_resources import release_ray_leftovers
    from pytest_shutdown.helpers.timeouts import zero_window_override
    from pytest_shutdown.ownership.backrefs import configure_graphs
