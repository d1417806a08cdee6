"""Lists each check of ``examples/sglang`` against the SGLang code it exercised.

``make sglang-check`` runs them.

``@pytest.mark.exercises("sglang.module.function")`` names that code; the terminal summary
prints one line per check: its outcome, its name, the SGLang code it ran on and the codes of the
findings it raised (``XFAIL ... [atexit-holds-object]``), then, indented, each line the check
recorded with ``record_property("found", text)`` (the finding on SGLang's object and the site
that made it). Runs offline: the only model is ``tiny_model/config.json``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MARKER = "exercises"
#: ``record_property(FOUND, text)``: what the check found, printed under its summary line
FOUND = "found"
#: the codes of a test's ShutdownContractError on its report
#: (pytest_shutdown.plugin.contract_errors)
CODES = "shutdown_codes"
#: Each Engine start spawns workers that import sglang: seconds on a quiet box, minutes on a
#: loaded 2-core one. The project's 120 s pytest-timeout would cut them off.
TIMEOUT_S = 900
_OUTCOMES: dict[str, tuple[str, str, str, list[str]]] = {}

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def reap_finished_workers() -> Iterator[None]:
    """Reaps the engine workers a test's ``Engine.shutdown()`` killed, before the guard looks.

    SGLang's shutdown SIGKILLs them but never joins its ``multiprocessing`` processes: they stay
    zombies until multiprocessing next looks, and the next test's guard would find them.
    """
    yield
    multiprocessing.active_children()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(target): the SGLang code a check runs on")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUT_S))
        marker = item.get_closest_marker(MARKER)
        if marker is not None and marker.args:
            item.user_properties.append((MARKER, str(marker.args[0])))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    target = dict(report.user_properties).get(MARKER)
    if target is not None and (report.when == "call" or not report.passed):
        outcome = "XFAIL" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        codes = str(getattr(report, CODES, "") or "")
        found = [str(value) for name, value in report.user_properties if name == FOUND]
        _OUTCOMES[report.nodeid] = (outcome.upper(), str(target), codes, found)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _OUTCOMES:
        return
    terminalreporter.section("the SGLang code each check exercised")
    rows = [(nodeid.rsplit("::", 1)[-1], *row) for nodeid, row in _OUTCOMES.items()]
    width = max(len(row[0]) for row in rows)
    for name, outcome, target, codes, found in rows:
        shown = f"  [{codes}]" if codes else ""
        terminalreporter.write_line(f"{outcome:<7} {name:<{width}}  {target}{shown}")
        for text in found:
            first, *rest = text.splitlines() or [""]
            terminalreporter.write_line(f"{'':<8}{first}")
            for line in rest:
                terminalreporter.write_line(f"{'':<10}{line}")
