"""``assert_freeze_policy``: the ``gc.freeze()`` at exit happens exactly where it should.

vLLM's EngineCore ends a clean ROCm shutdown with ``gc.freeze()`` (skipping one more slow
cyclic-GC scan at exit). The rule (DESIGN R3): frozen only on a clean ROCm exit with a zero drain
budget. A freeze elsewhere is left behind in a reused process; a missing one costs the scan.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pytest_shutdown._base.arguments import require_callable
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.exits import ExitRecord, probe_exit
from pytest_shutdown.helpers.report import CheckReport, is_seconds

#: The platforms and exits a scenario may name.
FREEZE_PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "cpu")
EXITS: tuple[str, ...] = ("clean", "error")


@dataclass(frozen=True)
class FreezeScenario:
    """One way an engine process ends.

    ``platform`` is the platform the process believes it runs on; ``shutdown_timeout`` its
    request-drain budget (0: abort at once); ``exit`` is ``"clean"`` (asked to stop, stopped
    with exit code 0) or ``"error"`` (the engine raised). ``expected_frozen`` is the rule.
    """

    platform: str
    shutdown_timeout: float
    exit: str = "clean"

    def __post_init__(self) -> None:
        if self.platform not in FREEZE_PLATFORMS:
            raise ValueError(
                f"platform: unknown platform {self.platform!r}; accepted: "
                f"{', '.join(FREEZE_PLATFORMS)}"
            )
        budget = self.shutdown_timeout
        if not is_seconds(budget, zero_ok=True):
            raise ValueError(f"shutdown_timeout: {budget!r}; accepted: a number of seconds >= 0")
        if self.exit not in EXITS:
            raise ValueError(f"exit: unknown exit {self.exit!r}; accepted: {', '.join(EXITS)}")

    @property
    def expected_frozen(self) -> bool:
        return self.platform == "rocm" and self.shutdown_timeout == 0 and self.exit == "clean"

    @property
    def id(self) -> str:
        """``rocm-drain0-clean``, ``cuda-drain5-error``, ..."""
        return f"{self.platform}-drain{self.shutdown_timeout:g}-{self.exit}"


def freeze_scenarios(
    platforms: Iterable[str] = ("cuda", "rocm"),
    shutdown_timeouts: Iterable[float] = (0, 5.0),
    exits: Iterable[str] = EXITS,
) -> tuple[FreezeScenario, ...]:
    """Every (platform, drain budget, exit) scenario; ``ValueError`` names a bad value."""
    chosen = (
        tuple(platforms) if not isinstance(platforms, str) else (platforms,),
        tuple(shutdown_timeouts),
        tuple(exits) if not isinstance(exits, str) else (exits,),
    )
    for name, values in zip(("platforms", "shutdown_timeouts", "exits"), chosen, strict=True):
        if not values:
            raise ValueError(f"{name}: needs at least one value")
    return tuple(FreezeScenario(*scenario) for scenario in itertools.product(*chosen))


def assert_freeze_policy(
    target: Callable[[FreezeScenario], Any],
    scenarios: Iterable[FreezeScenario] | None = None,
    *,
    start_method: str | None = None,
    timeout: float = 30.0,
) -> CheckReport:
    """Run ``target(scenario)`` in a child per scenario; require the freeze rule at its exit.

    ``target`` is the process entry point wrapped for one scenario: it makes
    ``scenario.platform`` the current platform, gives the engine ``scenario.shutdown_timeout``,
    makes it end as ``scenario.exit`` says, and calls the real entry (``run_engine_core``). The
    child is run with :func:`probe_exit` (``start_method``, ``timeout``), which reads
    ``gc.get_freeze_count()`` when the child starts and after the entry's ``finally`` blocks.
    Default scenarios: :func:`freeze_scenarios` (CUDA and ROCm, drain 0 and 5 s, clean and
    error exits).

    A child that froze where the rule forbids it, or did not freeze where the rule requires it,
    is a ``gc-freeze-policy`` finding; so is a child whose freeze count could not be read (killed,
    ``os._exit``, timed out). All scenarios are run and reported.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    require_callable("assert_freeze_policy", "target", target, "a function target(scenario)")
    chosen = tuple(freeze_scenarios() if scenarios is None else scenarios)
    if not chosen:
        raise ValueError("scenarios: needs at least one FreezeScenario")
    for index, scenario in enumerate(chosen):
        if not isinstance(scenario, FreezeScenario):
            raise ValueError(
                f"scenarios[{index}]: {scenario!r}; accepted: FreezeScenario values "
                "(see freeze_scenarios())"
            )
    started = time.perf_counter()
    findings: list[Finding] = []
    seen: dict[str, dict[str, Any]] = {}
    for scenario in chosen:
        record = probe_exit(target, scenario, start_method=start_method, timeout=timeout)
        seen[scenario.id] = _facts(scenario, record)
        finding = _judge(scenario, record)
        if finding is not None:
            findings.append(finding)
    raise_if_any(findings)
    return CheckReport(
        check="freeze-policy",
        subject=getattr(target, "__qualname__", repr(target)),
        duration_s=time.perf_counter() - started,
        details={"scenarios": seen},
    )


def _facts(scenario: FreezeScenario, record: ExitRecord) -> dict[str, Any]:
    return {
        "scenario": scenario.id,
        "expected_frozen": scenario.expected_frozen,
        "frozen": record.froze,
        "gc_freeze_count": record.gc_freeze_count,
        "gc_freeze_count_at_start": record.gc_freeze_count_at_start,
        "exitcode": record.exitcode,
        "timed_out": record.timed_out,
        "stderr_tail": record.stderr_tail[-1000:],
    }


def _judge(scenario: FreezeScenario, record: ExitRecord) -> Finding | None:
    frozen = record.froze
    facts = _facts(scenario, record)
    if frozen is None:
        how = "timed out" if record.timed_out else f"ended with exit code {record.exitcode}"
        return Finding(
            "gc-freeze-policy",
            f"scenario {scenario.id}: the freeze count at exit could not be read (the child "
            f"{how} before its finally blocks finished).",
            facts,
        )
    if frozen == scenario.expected_frozen:
        return None
    if frozen:
        why = (
            "only a clean ROCm exit with a zero drain budget may freeze"
            if scenario.platform == "rocm"
            else f"{scenario.platform} exits must never freeze"
        )
        what = f"froze its heap at exit ({why})"
    else:
        what = "did not freeze its heap at exit (a clean ROCm exit with a zero drain budget must)"
    return Finding("gc-freeze-policy", f"scenario {scenario.id}: the process {what}.", facts)
