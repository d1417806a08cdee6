"""Phases a process tree under test announces, and the phase a test wants it to reach.

An engine (or its launcher) names the phase it is in with ``report_phase("ready")``: one line
``[pytest-shutdown] phase: ready`` on its standard error, which the tree-death helper reads. A
launcher that cannot call Python prints the same line, or the test matches its own log lines
with a regular expression instead. ``wanted_phase()`` tells the target which phase the test will
act in (``"busy"``: start serving requests; ``"shutting_down"``: begin a shutdown by itself), so
a target can reach phases no signal from outside would bring about.

No dependencies: safe to import from any engine process.
"""

from __future__ import annotations

import os
import re
import sys

#: The environment variable carrying the phase the test wants the tree to reach.
WANTED_PHASE_ENV = "PYTEST_SHUTDOWN_PHASE"
PHASE_LINE_PREFIX = "[pytest-shutdown] phase: "


def report_phase(name: str) -> None:
    """Announce that this process tree is now in phase ``name`` (one line on stderr)."""
    if not name or "\n" in name:
        raise ValueError(f"report_phase: expected a one-line phase name, got {name!r}")
    sys.stderr.write(f"{PHASE_LINE_PREFIX}{name}\n")
    sys.stderr.flush()


def wanted_phase() -> str | None:
    """The phase the test will act in (``PYTEST_SHUTDOWN_PHASE``), or None outside a test."""
    return os.environ.get(WANTED_PHASE_ENV) or None


def phase_pattern(name: str) -> re.Pattern[str]:
    """The regular expression matching the line ``report_phase(name)`` writes."""
    return re.compile("^" + re.escape(PHASE_LINE_PREFIX + name) + "$", re.MULTILINE)
