"""Lists each check of ``examples/vllm`` against the vLLM code it exercised (``make vllm-check``).

``@pytest.mark.exercises("vllm.module.Class.method")`` names that code; the terminal summary
prints one line per check: its outcome, its name and the vLLM code it ran on. A check marked
``xfail(strict=True)`` states a gap of this vLLM version (its reason says which): XFAIL while
the gap is there, a failure once vLLM closes it.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

MARKER = "exercises"

# `vllm._aiter_ops` sets os.environ["AITER_SITUV2_A4W4"] = "1" when it is imported (for ROCm's
# AITER kernels, on every platform): an import-time change of process-wide state. The guard
# takes it for the import's, not the test's, when the module's source assigns the variable by
# its quoted name (docs/ownership.md, "Process-wide state"). Should a vLLM set it another way
# (a computed name), it would be reported as `global-state` on whichever check first builds an
# engine config: the module is still imported here, at collection, before any check, as a vLLM
# process has it imported by then.
if importlib.util.find_spec("vllm") is not None:
    try:
        importlib.import_module("vllm._aiter_ops")
    except ImportError:  # another vLLM: nothing to import ahead
        pass
_OUTCOMES: dict[str, tuple[str, str]] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(target): the vLLM code a check runs on")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None and marker.args:
            item.user_properties.append((MARKER, str(marker.args[0])))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    target = dict(report.user_properties).get(MARKER)
    if target is not None and (report.when == "call" or not report.passed):
        _OUTCOMES[report.nodeid] = (_outcome(report), str(target))


def _outcome(report: pytest.TestReport) -> str:
    """PASSED, FAILED, SKIPPED, or XFAIL / XPASS for a check of a gap vLLM is known to have."""
    if hasattr(report, "wasxfail"):
        return "XFAIL" if report.skipped else "XPASS"
    return report.outcome.upper()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _OUTCOMES:
        return
    terminalreporter.section("the vLLM code each check exercised")
    rows = [(o, nodeid.rsplit("::", 1)[-1], t) for nodeid, (o, t) in _OUTCOMES.items()]
    width = max(len(name) for _o, name, _t in rows)
    for outcome, name, target in rows:
        terminalreporter.write_line(f"{outcome:<7} {name:<{width}}  {target}")
