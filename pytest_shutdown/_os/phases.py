"""Phases a process tree under test announces (``report_phase``: a line on stderr the
tree-death helper reads), and the phase a test wants it to reach (``wanted_phase``). No
dependencies: safe to import from any engine process.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

WANTED_PHASE_ENV = "PYTEST_SHUTDOWN_PHASE"
PHASE_LINE_PREFIX = "[pytest-shutdown] phase: "
KNOWN_PHASES_PREFIX = "[pytest-shutdown] phases: "

_PHASE_LINE = re.compile("^" + re.escape(PHASE_LINE_PREFIX) + r"(.+)$", re.MULTILINE)
_KNOWN_LINE = re.compile("^" + re.escape(KNOWN_PHASES_PREFIX) + r"(.*)$", re.MULTILINE)


def report_phase(name: str) -> None:
    """Announce that this process tree is now in phase ``name`` (one line on stderr)."""
    if not name or "\n" in name:
        raise ValueError(f"report_phase: expected a one-line phase name, got {name!r}")
    sys.stderr.write(f"{PHASE_LINE_PREFIX}{name}\n")
    sys.stderr.flush()


def wanted_phase(known: Iterable[str] | None = None) -> str | None:
    """The phase the test will act in (``PYTEST_SHUTDOWN_PHASE``), or None outside a test.

    ``known``: every phase this tree can reach. It is declared on stderr (one line), so that a
    test waiting for a phase not among them (a typo such as ``"redy"``) fails at once, naming
    the phases known, instead of after its phase timeout.
    """
    if known is not None:
        names = [str(name) for name in known]
        bad = [name for name in names if not name or "\n" in name or "," in name]
        if bad:
            raise ValueError(f"wanted_phase: known= expects one-line phase names, got {bad!r}")
        if os.environ.get(WANTED_PHASE_ENV):  # only a tree under test reads it
            sys.stderr.write(f"{KNOWN_PHASES_PREFIX}{', '.join(names)}\n")
            sys.stderr.flush()
    return os.environ.get(WANTED_PHASE_ENV) or None


def reported_phases(output: str) -> list[str]:
    """The phases a tree's output announced with ``report_phase``, first report first."""
    return list(dict.fromkeys(m.group(1).strip() for m in _PHASE_LINE.finditer(output)))


def declared_phases(output: str) -> list[str] | None:
    """The phases a tree declared with ``wanted_phase(known=...)``; None when it declared none."""
    found = _KNOWN_LINE.findall(output)
    if not found:
        return None
    return [name.strip() for line in found for name in line.split(",") if name.strip()]


def phase_pattern(name: str) -> re.Pattern[str]:
    """The regular expression matching the line ``report_phase(name)`` writes."""
    return re.compile("^" + re.escape(PHASE_LINE_PREFIX + name) + "$", re.MULTILINE)
