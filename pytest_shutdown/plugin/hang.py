"""The exit code of a process whose teardown hung past its second budget, and the handlers run
just before it: apart from :mod:`pytest_shutdown.plugin.budget`, which only a test with a budget
needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.plugin.budget import BudgetOutcome

__all__ = ["HANG_HANDLERS", "HUNG_TEARDOWN_EXIT_CODE"]

#: The exit code of a process ended because a teardown did not return within a second budget
#: after its shutdown budget fired (pytest's own codes are 0 to 5).
HUNG_TEARDOWN_EXIT_CODE = 70
#: Called by the budget's watchdog, in order, just before it ends a process whose teardown
#: hung: ``handler(label, outcome)``. The report registers one that writes the JSON report.
HANG_HANDLERS: list[Callable[[str, BudgetOutcome], None]] = []
