"""The fixtures the plugin registers: the reference engine, its configuration, timeout matrices.

Every engine fixture shuts its engine down in teardown and checks the engine's contracts there
(shutdown idempotent, nothing force-killed unless the test said it expects that, nothing left
running), so a downstream suite that uses them gets those checks without writing them.

Nothing here imports torch at import time: the engine is imported when a fixture asks for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_shutdown.findings import Finding, ShutdownContractError, raise_if_any
from pytest_shutdown.matrix import MARKER as MATRIX_MARKER
from pytest_shutdown.matrix import ShutdownTimeouts, cells_from_marker

if TYPE_CHECKING:
    from pytest_shutdown.engine.config import EngineConfig
    from pytest_shutdown.engine.core import EngineCore
    from pytest_shutdown.engine.renderer import ReferenceRenderer

#: Graces in tests are this fraction of production (15 s → 1.5 s): the same decisions, cheaper.
TEST_GRACE_SCALE = 0.1
#: How long an engine's own threads may take to end after its shutdown.
THREAD_EXIT_DEADLINE_S = 5.0

MARKERS = (
    "engine(**fields): override EngineConfig fields for the engine fixtures of this test.",
    f"{MATRIX_MARKER}(request=[...], process=[...], platform=[...], grace=15.0): parametrize the "
    "shutdown_timeouts fixture (and engine_config) over a timeout matrix.",
    "expect_force_kill(reason=...): the engine fixtures' teardown expects a force kill "
    "(without it, a force-killed engine process fails the test).",
)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


# -- collection: markers become parametrizations, bad arguments collection errors ----------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for mark in metafunc.definition.iter_markers("engine"):
        _validate_engine_fields(mark.args, mark.kwargs)
    marks = list(metafunc.definition.iter_markers(MATRIX_MARKER))
    if not marks:
        return
    try:
        cells = cells_from_marker(marks[0].args, marks[0].kwargs)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    if "shutdown_timeouts" not in metafunc.fixturenames:
        metafunc.fixturenames.append("shutdown_timeouts")
    metafunc.parametrize("shutdown_timeouts", cells, ids=[c.id for c in cells])


def _validate_engine_fields(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    from dataclasses import fields as dataclass_fields

    from pytest_shutdown.engine.config import EngineConfig

    accepted = [f.name for f in dataclass_fields(EngineConfig) if f.name != "device"]
    if args:
        pytest.fail(
            f"engine marker: takes keyword arguments only; accepted: {', '.join(accepted)}",
            pytrace=False,
        )
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        pytest.fail(
            f"engine marker: unknown field(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(accepted)}",
            pytrace=False,
        )
    try:
        EngineConfig(**{"platform": "cpu", **kwargs})
    except ValueError as exc:
        pytest.fail(f"engine marker: {exc}", pytrace=False)


# -- configuration fixtures -----------------------------------------------------------------
@pytest.fixture(scope="session")
def shutdown_platform(pytestconfig: pytest.Config) -> str:
    """The platform of this run: ``--shutdown-platform`` when forced, else the detected one."""
    forced = pytestconfig.getoption("shutdown_platform", default="auto") or "auto"
    if forced != "auto":
        return str(forced)
    from pytest_shutdown.devices import detect_platform

    return detect_platform()


def scaled_down_config(platform: str) -> EngineConfig:
    """An EngineConfig for tests: graces scaled down by :data:`TEST_GRACE_SCALE`."""
    from pytest_shutdown.engine.config import EngineConfig

    defaults = EngineConfig(platform="cpu")
    return EngineConfig(
        platform=platform,
        rocm_process_grace_s=defaults.rocm_process_grace_s * TEST_GRACE_SCALE,
        child_exit_grace_s=defaults.child_exit_grace_s * TEST_GRACE_SCALE,
        startup_timeout_s=60.0,
    )


@pytest.fixture
def shutdown_timeouts(request: pytest.FixtureRequest) -> ShutdownTimeouts:
    """One cell of ``@pytest.mark.shutdown_matrix(...)``; the marker parametrizes this fixture."""
    pytest.fail(
        f"the shutdown_timeouts fixture needs @pytest.mark.{MATRIX_MARKER}(request=[...], "
        "process=[...], platform=[...]) on the test",
        pytrace=False,
    )


def current_cell(request: pytest.FixtureRequest) -> ShutdownTimeouts | None:
    """The matrix cell of the running test, if it is parametrized by a shutdown matrix."""
    callspec = getattr(request.node, "callspec", None)
    cell = callspec.params.get("shutdown_timeouts") if callspec is not None else None
    return cell if isinstance(cell, ShutdownTimeouts) else None


@pytest.fixture
def engine_config(request: pytest.FixtureRequest, shutdown_platform: str) -> EngineConfig:
    """The EngineConfig every engine fixture uses; override this fixture to change them all.

    Built from :func:`scaled_down_config` for the run's platform, then the test's matrix
    cell (request timeout → ``shutdown_timeout``, platform, grace → ``rocm_process_grace_s``),
    then ``@pytest.mark.engine(**fields)`` (the closest marker wins).
    """
    config = scaled_down_config(shutdown_platform)
    cell = current_cell(request)
    if cell is not None:
        config = config.replace(
            shutdown_timeout=cell.request_timeout,
            platform=cell.platform,
            rocm_process_grace_s=cell.grace,
        )
    for mark in reversed(list(request.node.iter_markers("engine"))):
        config = config.replace(**mark.kwargs)
    return config


# -- expectations ----------------------------------------------------------------------------
class ForceKillExpectation:
    """Whether this test expects its engine processes to be force-killed at shutdown.

    Call it: ``expect_force_kill()`` or ``expect_force_kill(cell.expected_process_timeout == 0)``.
    """

    def __init__(self, expected: bool) -> None:
        self.expected = expected

    def __call__(self, expected: bool = True) -> None:
        self.expected = bool(expected)

    def __bool__(self) -> bool:
        return self.expected


@pytest.fixture
def expect_force_kill(request: pytest.FixtureRequest) -> ForceKillExpectation:
    """Declare that the engine fixtures' shutdown is expected to force-kill (or not)."""
    return ForceKillExpectation(request.node.get_closest_marker("expect_force_kill") is not None)


# -- engine fixtures -------------------------------------------------------------------------
@pytest.fixture
def reference_renderer(engine_config: EngineConfig) -> Iterator[ReferenceRenderer]:
    """A ReferenceRenderer; teardown checks that its shutdown is idempotent and its threads end."""
    from pytest_shutdown.checks.idempotence import assert_idempotent_shutdown
    from pytest_shutdown.engine.renderer import ReferenceRenderer

    renderer = ReferenceRenderer(engine_config)
    yield renderer
    executors = (renderer._executor, renderer._mm_executor)
    findings = _collect(lambda: assert_idempotent_shutdown(renderer))
    findings += _threads_still_running(renderer, executors)
    raise_if_any(findings)


@pytest.fixture
def engine_core(engine_config: EngineConfig) -> Iterator[EngineCore]:
    """An in-process EngineCore; teardown checks idempotent shutdown and the gc freeze count."""
    import gc

    from pytest_shutdown.checks.idempotence import assert_idempotent_shutdown
    from pytest_shutdown.engine.core import EngineCore

    freeze_count = gc.get_freeze_count()
    core = EngineCore(engine_config)
    yield core
    findings = _collect(lambda: assert_idempotent_shutdown(core))
    if gc.get_freeze_count() != freeze_count:
        findings.append(
            Finding(
                "gc-frozen-leak",
                f"EngineCore left gc.get_freeze_count() at {gc.get_freeze_count()} "
                f"(it was {freeze_count} before the engine started).",
                {"before": freeze_count, "after": gc.get_freeze_count()},
            )
        )
    raise_if_any(findings)


def _collect(check: Callable[[], object]) -> list[Finding]:
    try:
        check()
    except ShutdownContractError as exc:
        return list(exc.findings)
    return []


def _threads_still_running(owner: object, executors: tuple[Any, ...]) -> list[Finding]:
    threads: list[threading.Thread] = [t for ex in executors for t in list(ex._threads)]
    deadline = time.monotonic() + THREAD_EXIT_DEADLINE_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if not alive:
        return []
    return [
        Finding(
            "thread-leak",
            f"{type(owner).__name__}'s threads {', '.join(alive)} still ran "
            f"{THREAD_EXIT_DEADLINE_S:g}s after its shutdown.",
            {"threads": alive, "deadline_s": THREAD_EXIT_DEADLINE_S},
        )
    ]
