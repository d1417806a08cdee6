"""The request-drain timeout x process-cleanup timeout x platform matrix.

``timeout_matrix()`` returns :class:`TimeoutCell` values (plain frozen dataclasses, no pytest
needed) in a :class:`TimeoutMatrix`, whose :meth:`~TimeoutMatrix.as_params` turns them into
``pytest.param(cell, id=cell.id)`` for ``@pytest.mark.parametrize("cell", ...)``::

    @pytest.mark.parametrize("cell", timeout_matrix().as_params())
    def test_policy(cell):
        assert policy(cell.request_timeout, cell.process_timeout, cell.platform) == cell.expected

The rule: the process-cleanup timeout becomes the ROCm ``grace`` only when the platform is
``rocm`` and both timeouts are exactly ``0``; otherwise it is ``process_timeout`` unchanged,
``None`` included (a zero *remaining* budget after a positive drain gets no new grace).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pytest_shutdown.checks.report import CheckReport
from pytest_shutdown.findings import Finding, raise_if_any

#: The platforms a cell may name.
PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "cpu")

Policy = Callable[[float | None, float | None, str], Any]


def _fmt(value: float | None) -> str:
    if value is None:
        return "None"
    return f"{value:g}"


@dataclass(frozen=True)
class TimeoutCell:
    """One cell: the inputs of the policy and the process timeout it must return."""

    platform: str
    request_timeout: float | None
    process_timeout: float | None
    expected: float | None

    @property
    def id(self) -> str:
        """A readable test id such as ``rocm-req0-proc0`` or ``cuda-reqNone-proc7``."""
        return f"{self.platform}-req{_fmt(self.request_timeout)}-proc{_fmt(self.process_timeout)}"


class TimeoutMatrix(tuple[TimeoutCell, ...]):
    """The cells of a timeout matrix, in order: platform, then request, then process timeout."""

    def as_params(self) -> list[Any]:
        """``pytest.param(cell, id=cell.id)`` for each cell (imports pytest when called)."""
        import pytest

        return [pytest.param(cell, id=cell.id) for cell in self]

    @property
    def ids(self) -> list[str]:
        return [cell.id for cell in self]


def expected_process_timeout(
    request_timeout: float | None, process_timeout: float | None, platform: str, grace: float
) -> float | None:
    """The process-cleanup timeout the rule of this module asks for: ``grace`` on ROCm when both
    timeouts are exactly 0, else ``process_timeout`` unchanged (``None`` included)."""
    if platform == "rocm" and request_timeout == 0 and process_timeout == 0:
        return grace
    return process_timeout


def _check_timeouts(name: str, values: Iterable[float | None]) -> tuple[float | None, ...]:
    checked: list[float | None] = []
    for value in values:
        ok = value is None or (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not math.isnan(value)
            and value >= 0
        )
        if not ok:
            raise ValueError(
                f"{name}: {value!r} is not a timeout; accepted: None or a number of seconds >= 0"
            )
        if value not in checked:
            checked.append(value)
    if not checked:
        raise ValueError(f"{name}: needs at least one timeout (None or a number >= 0)")
    return tuple(checked)


def _check_platforms(platforms: Iterable[str]) -> tuple[str, ...]:
    if isinstance(platforms, str):
        platforms = (platforms,)
    checked: list[str] = []
    for platform in platforms:
        if platform not in PLATFORMS:
            raise ValueError(
                f"platforms: unknown platform {platform!r}; accepted: {', '.join(PLATFORMS)}"
            )
        if platform not in checked:
            checked.append(platform)
    if not checked:
        raise ValueError(f"platforms: needs at least one of {', '.join(PLATFORMS)}")
    return tuple(checked)


def _check_grace(grace: float) -> float:
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not (
        math.isfinite(grace) and grace > 0
    ):
        raise ValueError(f"grace: {grace!r} is not a positive, finite number of seconds")
    return float(grace)


def timeout_matrix(
    request: Iterable[float | None] = (None, 0, 7.0),
    process: Iterable[float | None] = (None, 0, 7.0),
    platforms: Iterable[str] = ("cuda", "rocm"),
    grace: float = 15.0,
) -> TimeoutMatrix:
    """Every (platform, request timeout, process timeout) cell with its expected process timeout.

    Raises ``ValueError`` naming the argument for a negative or NaN timeout, an unknown
    platform, or a grace that is not a positive number.
    """
    requests = _check_timeouts("request", request)
    processes = _check_timeouts("process", process)
    names = _check_platforms(platforms)
    budget = _check_grace(grace)
    return TimeoutMatrix(
        TimeoutCell(
            platform,
            req,
            proc,
            expected_process_timeout(req, proc, platform, budget),
        )
        for platform in names
        for req in requests
        for proc in processes
    )


def _same(got: Any, expected: float | None) -> bool:
    if expected is None or got is None:
        return got is None and expected is None
    if isinstance(got, bool) or not isinstance(got, (int, float)):
        return False
    return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)


def assert_timeout_decoupling(
    policy: Policy,
    *,
    grace: float,
    platforms: Iterable[str] = ("cuda", "rocm"),
) -> CheckReport:
    """Call ``policy(request_timeout, process_timeout, platform)`` on every matrix cell.

    Every cell whose result differs from the rule (or that raises) is a ``timeout-policy``
    finding naming the cell, what came back and what was expected; all of them are reported.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    if not callable(policy):
        raise ValueError(f"policy must be callable(request, process, platform), got {policy!r}")
    started = time.perf_counter()
    cells = timeout_matrix(platforms=platforms, grace=grace)
    findings: list[Finding] = []
    for cell in cells:
        try:
            got = policy(cell.request_timeout, cell.process_timeout, cell.platform)
        except Exception as exc:  # noqa: BLE001 - a raising policy is a wrong cell
            findings.append(_wrong(cell, None, f"raised {type(exc).__name__}: {exc}"))
            continue
        if not _same(got, cell.expected):
            findings.append(_wrong(cell, got, f"returned {got!r}"))
    raise_if_any(findings)
    return CheckReport(
        check="timeout-decoupling",
        subject=getattr(policy, "__qualname__", repr(policy)),
        duration_s=time.perf_counter() - started,
        details={"cells": cells.ids, "grace": grace},
    )


def _wrong(cell: TimeoutCell, got: Any, what: str) -> Finding:
    return Finding(
        "timeout-policy",
        f"timeout policy cell {cell.id} {what}, expected {cell.expected!r}.",
        {
            "cell": cell.id,
            "platform": cell.platform,
            "request_timeout": cell.request_timeout,
            "process_timeout": cell.process_timeout,
            "expected": cell.expected,
            "got": got if got is None or isinstance(got, (int, float, str)) else repr(got),
            "error": what if what.startswith("raised") else None,
        },
    )
