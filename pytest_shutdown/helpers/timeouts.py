"""The request-drain timeout x process-cleanup timeout x platform matrix (docs/matrices.md).

The rule: the process-cleanup timeout becomes the ROCm ``grace`` only when the platform is
``rocm`` and both timeouts are exactly ``0``; otherwise it is ``process_timeout`` unchanged,
``None`` included (a zero *remaining* budget after a positive drain gets no new grace).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from pytest_shutdown._base.arguments import require_callable
from pytest_shutdown._fast.lazy_dataclass import lazy_dataclass
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.report import CheckReport, is_seconds

#: The platforms a cell may name.
PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "cpu")

#: The shapes a matrix may take: every request x process pair, or request == process only.
SHAPES: tuple[str, ...] = ("product", "diagonal")

#: ``policy(request_timeout, process_timeout, platform)``.
Policy = Callable[[float | None, float | None, str], Any]
#: ``policy(request_timeout, process_timeout)``, its platform read from global state.
Policy2 = Callable[[float | None, float | None], Any]
#: ``platform=``: platform name -> a context manager that makes it the current platform.
PlatformHook = Callable[[str], contextlib.AbstractContextManager[Any]]


def _fmt(value: float | None) -> str:
    return "None" if value is None else f"{value:g}"


@lazy_dataclass(frozen=True)
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


#: ``expected=``: given a cell (carrying the rule's value), the value this code must return.
Expected = Callable[[TimeoutCell], float | None]


def expected_process_timeout(
    request_timeout: float | None, process_timeout: float | None, platform: str, grace: float
) -> float | None:
    """The process-cleanup timeout the rule of this module asks for: ``grace`` on ROCm when both
    timeouts are exactly 0, else ``process_timeout`` unchanged (``None`` included)."""
    if platform == "rocm" and request_timeout == 0 and process_timeout == 0:
        return grace
    return process_timeout


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_timeouts(name: str, values: Iterable[float | None]) -> tuple[float | None, ...]:
    checked = list(values)
    for value in checked:
        if value is not None and not (_is_number(value) and not math.isnan(value) and value >= 0):
            raise ValueError(
                f"{name}: {value!r} is not a timeout; accepted: None or a number of seconds >= 0"
            )
    if not checked:
        raise ValueError(f"{name}: needs at least one timeout (None or a number >= 0)")
    return tuple(dict.fromkeys(checked))  # each once, in order


def _check_platforms(platforms: Iterable[str]) -> tuple[str, ...]:
    checked = [platforms] if isinstance(platforms, str) else list(platforms)
    for platform in checked:
        if platform not in PLATFORMS:
            raise ValueError(
                f"platforms: unknown platform {platform!r}; accepted: {', '.join(PLATFORMS)}"
            )
    if not checked:
        raise ValueError(f"platforms: needs at least one of {', '.join(PLATFORMS)}")
    return tuple(dict.fromkeys(checked))


def _check_grace(grace: float) -> float:
    if not is_seconds(grace):
        raise ValueError(f"grace: {grace!r} is not a positive, finite number of seconds")
    return float(grace)


def timeout_matrix(
    request: Iterable[float | None] = (None, 0, 7.0),
    process: Iterable[float | None] = (None, 0, 7.0),
    platforms: Iterable[str] = ("cuda", "rocm"),
    grace: float = 15.0,
    *,
    shape: str = "product",
    include_none: bool = True,
    expected: Expected | None = None,
    offset: float = 0.0,
) -> TimeoutMatrix:
    """The (platform, request timeout, process timeout) cells with their expected process timeout.

    ``shape="product"`` crosses every request timeout with every process timeout;
    ``shape="diagonal"`` keeps the cells where both are the same value (what a DP supervisor
    passes: ``policy(t, t)``), taken from ``request``. ``include_none=False`` drops ``None``.

    The expected value of a cell is the rule of DESIGN R6; ``expected=`` replaces it: a callable
    given the cell (with the rule's value in ``cell.expected``) that returns what this code must
    return instead, e.g. :func:`zero_window_override` for a documented environment override.
    ``offset`` is then added to every expected value that is not ``None`` (a supervisor that waits
    ``policy(t, t) + CHILD_EXIT_GRACE_S``).

    Raises ``ValueError`` naming the argument for a negative or NaN timeout, an unknown
    platform or shape, a grace that is not a positive number, or a non-callable ``expected``.
    """
    requests = _check_timeouts("request", request)
    processes = _check_timeouts("process", process)
    if not include_none:
        requests = _without_none("request", requests)
        processes = _without_none("process", processes)
    names = _check_platforms(platforms)
    budget = _check_grace(grace)
    if shape not in SHAPES:
        raise ValueError(f"shape: unknown matrix shape {shape!r}; accepted: {', '.join(SHAPES)}")
    if not _is_number(offset) or not math.isfinite(offset):
        raise ValueError(f"offset: {offset!r} is not a finite number of seconds")
    shift = float(offset)
    if expected is not None and not callable(expected):
        raise ValueError(
            f"expected: {expected!r} is not callable; accepted: a function cell -> seconds "
            "(or None), e.g. zero_window_override(3.0)"
        )
    pairs = (
        [(req, req) for req in requests]
        if shape == "diagonal"
        else [(req, proc) for req in requests for proc in processes]
    )
    cells = []
    for platform in names:
        for req, proc in pairs:
            cell = TimeoutCell(
                platform, req, proc, expected_process_timeout(req, proc, platform, budget)
            )
            if expected is not None:
                value = expected(cell)
                _check_timeouts("expected", (value,))
                cell = TimeoutCell(platform, req, proc, value)
            if shift and cell.expected is not None:
                cell = TimeoutCell(platform, req, proc, cell.expected + shift)
            cells.append(cell)
    return TimeoutMatrix(cells)


def _without_none(name: str, values: tuple[float | None, ...]) -> tuple[float | None, ...]:
    kept = tuple(value for value in values if value is not None)
    if not kept:
        raise ValueError(f"{name}: include_none=False leaves no timeout; give at least one number")
    return kept


def zero_window_override(seconds: float) -> Expected:
    """``expected=`` for an override of the 0/0 window on every platform.

    vLLM 0.33.0: with ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` set, that value is the process
    timeout when both timeouts are 0, on CUDA as on ROCm; every other cell keeps the rule.
    """
    window = _check_grace(seconds)

    def override(cell: TimeoutCell) -> float | None:
        if cell.request_timeout == 0 and cell.process_timeout == 0:
            return window
        return cell.expected

    override.__qualname__ = f"zero_window_override({window:g})"
    return override


def _same(got: Any, expected: float | None) -> bool:
    if expected is None or got is None:
        return got is None and expected is None
    return _is_number(got) and math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)


def _positional_arity(policy: Callable[..., Any]) -> int | None:
    """How many positional arguments ``policy`` takes (``None`` when it cannot be told)."""
    try:
        kinds = [p.kind for p in inspect.signature(policy).parameters.values()]
    except (TypeError, ValueError):
        return None
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(kind in positional for kind in kinds)


def _caller(
    policy: Callable[..., Any], platform: PlatformHook | None
) -> Callable[[TimeoutCell], Any]:
    """How to ask ``policy`` for one cell: with the platform as an argument, or inside the hook."""
    require_callable(
        "assert_timeout_decoupling",
        "policy",
        policy,
        "policy(request, process, platform), or policy(request, process) with platform=",
    )
    if platform is not None:
        if not callable(platform):
            raise ValueError(
                f"platform: {platform!r} is not callable; accepted: a function platform-name -> "
                "context manager that makes that platform current"
            )

        def in_platform(cell: TimeoutCell) -> Any:
            with platform(cell.platform):
                return policy(cell.request_timeout, cell.process_timeout)

        return in_platform
    if _positional_arity(policy) == 2:
        raise ValueError(
            f"policy {getattr(policy, '__qualname__', policy)!r} takes (request, process) and "
            "reads its platform from global state: pass platform=, a function platform-name -> "
            "context manager that makes that platform current (e.g. patches current_platform)"
        )

    def with_argument(cell: TimeoutCell) -> Any:
        return policy(cell.request_timeout, cell.process_timeout, cell.platform)

    return with_argument


def assert_timeout_decoupling(
    policy: Policy | Policy2,
    *,
    grace: float,
    platforms: Iterable[str] = ("cuda", "rocm"),
    platform: PlatformHook | None = None,
    expected: Expected | None = None,
    request: Iterable[float | None] = (None, 0, 7.0),
    process: Iterable[float | None] = (None, 0, 7.0),
    shape: str = "product",
    include_none: bool = True,
    offset: float = 0.0,
) -> CheckReport:
    """Ask ``policy`` for the process timeout of every matrix cell; require the expected one.

    ``policy`` is ``policy(request_timeout, process_timeout, platform)``, or, as real code has
    it, ``policy(request_timeout, process_timeout)`` reading its platform from global state: then
    ``platform=`` is a function ``name -> context manager`` entered around each cell's call
    (one that patches ``current_platform``, say). :func:`timeout_passed_to` turns "the timeout a
    shutdown method passes on" into such a policy. The cells and their expected values are those
    of :func:`timeout_matrix` with the same ``request``, ``process``, ``shape``,
    ``include_none``, ``expected`` and ``offset``.

    Every cell whose result differs (or that raises) is a ``timeout-policy`` finding naming the
    cell, what came back and what was expected; all of them are reported.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    ask = _caller(policy, platform)
    started = time.perf_counter()
    cells = timeout_matrix(
        request,
        process,
        platforms=platforms,
        grace=grace,
        shape=shape,
        include_none=include_none,
        expected=expected,
        offset=offset,
    )
    checked = what_is_checked(policy)
    findings: list[Finding] = []
    raised: list[tuple[TimeoutCell, Exception]] = []
    for cell in cells:
        try:
            got = ask(cell)
        except Exception as exc:  # noqa: BLE001 - a raising policy is a wrong cell
            raised.append((cell, exc))
            findings.append(
                _wrong(cell, None, f"raised {type(exc).__name__}: {exc}", checked, shift=offset)
            )
            continue
        if not _same(got, cell.expected):
            findings.append(_wrong(cell, got, f"returned {got!r}", checked, shift=offset))
    _raise_setup_error(raised, len(cells), checked)
    raise_if_any(findings)
    return CheckReport(
        check="timeout-decoupling",
        subject=getattr(policy, "__qualname__", repr(policy)),
        duration_s=time.perf_counter() - started,
        details={
            "cells": cells.ids,
            "grace": grace,
            "shape": shape,
            "offset": offset,
            "expected": getattr(expected, "__qualname__", None) if expected else None,
        },
    )


def what_is_checked(policy: Callable[..., Any]) -> str:
    """What a policy's answer is, in words: the pure policy function, or the timeout a call
    passed to a spied function (:func:`~pytest_shutdown.timeout_passed_to`)."""
    spied = getattr(policy, "spied_target", None)
    if spied:
        argument = getattr(policy, "spied_argument", "timeout")
        return f"the {argument} the call passed to {spied}"
    name = getattr(policy, "__qualname__", None) or repr(policy)
    return f"the pure policy {name}"


#: Exception class names that mean the test's set-up is wrong wherever they are raised (a
#: config rejected by the engine's validation: pydantic's ``ValidationError``).
SETUP_ERROR_NAMES = frozenset({"ValidationError"})


def _raise_setup_error(
    raised: list[tuple[TimeoutCell, Exception]], total: int, checked: str
) -> None:
    """An error of the test's own set-up is the test's error, once, not a finding per cell.

    Set-up errors: every cell raised the same exception type (a spy target never reached, a
    call that cannot build its engine), or any cell raised a ``ValidationError`` (the engine's
    config rejected what the test built). The first such exception is raised again with a note.
    """
    __tracebackhide__ = True
    if not raised:
        return
    setup = [(cell, exc) for cell, exc in raised if type(exc).__name__ in SETUP_ERROR_NAMES]
    if not setup and len(raised) == total and len({type(e) for _, e in raised}) == 1:
        setup = raised
    if not setup:
        return
    cell, exc = setup[0]
    note = (
        f"pytest-shutdown: {checked} raised {type(exc).__name__} in {len(setup)} of {total} "
        f"timeout-matrix cells (first: {cell.id}); this is an error in the test's set-up (the "
        "policy, the call or the config it builds), not a timeout-policy finding"
    )
    add_note = getattr(exc, "add_note", None)
    if callable(add_note):  # Python >= 3.11
        add_note(note)
    raise exc


def _wrong(
    cell: TimeoutCell, got: Any, what: str, checked: str = "the policy", *, shift: float = 0.0
) -> Finding:
    rule = cell.expected - shift if shift and cell.expected is not None else None
    expected = f"{cell.expected!r}" + (
        f" (the rule's {rule:g} + offset {shift:g} s)" if rule is not None else ""
    )
    return Finding(
        "timeout-policy",
        f"timeout matrix cell {cell.id}: {checked} {what}, expected {expected}.",
        {
            "cell": cell.id,
            "platform": cell.platform,
            "request_timeout": cell.request_timeout,
            "process_timeout": cell.process_timeout,
            "expected": cell.expected,
            "offset": shift,
            "checked": checked,
            "got": got if got is None or isinstance(got, (int, float, str)) else repr(got),
            "error": what if what.startswith("raised") else None,
        },
    )
