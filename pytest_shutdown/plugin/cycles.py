"""``@pytest.mark.shutdown_cycles(n)`` and the engine fixtures' cycle count.

The marker re-runs a test's call phase in the same process, ``warmup`` then ``n`` times, under
:func:`~pytest_shutdown.assert_no_growth` (fixtures set up once, as CPython's ``-R`` does); an
engine fixture given a count by indirect parametrization builds, uses and shuts down that many
engines before the test gets its own. Growth fails the test (the fixture's setup). Nothing here
imports torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from pytest_shutdown._fast.node_markers import CYCLES as MARKER
from pytest_shutdown._fast.node_markers import marker_names

DEFAULT_WARMUP = 2
#: The most calls ``n`` and ``warmup`` may each ask for: past this, a typo (``10**12``).
MAX_CYCLES = 100_000


def _positive(value: object, minimum: int) -> bool:
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and minimum <= value <= MAX_CYCLES
    )


def cycles_of(item: pytest.Item) -> tuple[int, int] | None:
    """``(n, warmup)`` of the closest ``shutdown_cycles`` marker of ``item``, or None; bad
    arguments raise :class:`pytest.UsageError`."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return None
    where = f"{item.nodeid}: @pytest.mark.{MARKER}"
    accepted = (
        f"accepted: n (an integer from 1 to {MAX_CYCLES}, also as cycles=), "
        f"warmup (an integer from 0 to {MAX_CYCLES})"
    )
    unknown = sorted(set(marker.kwargs) - {"cycles", "warmup"})
    if unknown:
        raise pytest.UsageError(f"{where}: unknown argument(s) {', '.join(unknown)}; {accepted}")
    args = list(marker.args)
    if "cycles" in marker.kwargs:
        args.append(marker.kwargs["cycles"])
    if len(args) != 1 or not _positive(args[0], 1):
        shown = args[0] if len(args) == 1 else tuple(args)
        raise pytest.UsageError(
            f"{where} takes one integer n from 1 to {MAX_CYCLES}, got {shown!r}; {accepted}"
        )
    warmup = marker.kwargs.get("warmup", DEFAULT_WARMUP)
    if not _positive(warmup, 0):
        raise pytest.UsageError(
            f"{where}: warmup= takes an integer from 0 to {MAX_CYCLES}, got {warmup!r}"
        )
    return int(args[0]), int(warmup)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Under ``shutdown_cycles``: call the test function through the other implementations of
    this hook (pytest's own, pytest-asyncio's, ...) once per cycle, and check for growth."""
    if MARKER not in marker_names(pyfuncitem):  # known since collection: no marker lookup
        return None
    cycles = cycles_of(pyfuncitem)
    if cycles is None:
        return None
    __tracebackhide__ = True
    from pytest_shutdown.helpers.growth import assert_no_growth

    n, warmup = cycles
    others = pyfuncitem.config.pluginmanager.subset_hook_caller(
        "pytest_pyfunc_call", remove_plugins=[sys.modules[__name__]]
    )

    def call() -> None:
        __tracebackhide__ = True
        others(pyfuncitem=pyfuncitem)

    assert_no_growth(call, cycles=n, warmup=warmup)
    return True


def check_engine_cycles(
    request: pytest.FixtureRequest,
    fixture: str,
    build: Callable[[], Any],
    use: Callable[[Any], object] | None = None,
) -> None:
    """When the fixture was given a cycle count (``indirect`` parametrization): build, use and
    shut down an engine that many times (after the default warm-up) and fail on growth."""
    __tracebackhide__ = True
    cycles = getattr(request, "param", None)
    if cycles is None:
        return
    if not _positive(cycles, 1):
        pytest.fail(
            f"fixture {fixture!r}: its parameter is a cycle count (an integer from 1 to "
            f"{MAX_CYCLES}, e.g. "
            f'@pytest.mark.parametrize("{fixture}", [10], indirect=True)), got {cycles!r}',
            pytrace=False,
        )
    from pytest_shutdown.helpers.growth import assert_no_growth

    def cycle() -> None:
        engine = build()
        try:
            if use is not None:
                use(engine)
        finally:
            engine.shutdown()

    assert_no_growth(cycle, cycles=int(cycles))
