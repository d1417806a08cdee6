"""Moved to :mod:`pytest_shutdown._os.phases` (issue 47: the reference engine announces its
phases, and the engine sits below the helpers); its names stay importable from here.

No dependencies: safe to import from any engine process.
"""

from __future__ import annotations

from pytest_shutdown._os.phases import (
    KNOWN_PHASES_PREFIX,
    PHASE_LINE_PREFIX,
    WANTED_PHASE_ENV,
    declared_phases,
    phase_pattern,
    report_phase,
    reported_phases,
    wanted_phase,
)

__all__ = [
    "KNOWN_PHASES_PREFIX",
    "PHASE_LINE_PREFIX",
    "WANTED_PHASE_ENV",
    "declared_phases",
    "phase_pattern",
    "report_phase",
    "reported_phases",
    "wanted_phase",
]
