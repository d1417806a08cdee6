"""The fixtures the plugin registers: the reference engine, its configuration, timeout matrices,
the orphan matrix's cells and tree launcher, a Ray cluster.

Every engine fixture shuts its engine down in teardown and checks the engine's contracts there
(idempotent shutdown, no force kill unless expected, nothing left running); each also takes a
cycle count by indirect parametrization (:mod:`pytest_shutdown.plugin.cycles`). Nothing here imports
torch at import time.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from pytest_shutdown._fast.node_markers import ORPHAN_MATRIX as ORPHAN_MATRIX_MARKER
from pytest_shutdown._fast.node_markers import SHUTDOWN_MATRIX as MATRIX_MARKER
from pytest_shutdown._fast.node_markers import marker_names, scanned_module_names

# This module is a registered plugin object: pytest looks at each of its names at start-up, so
# names used only in annotations are imported for the type checker alone.
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from pytest_shutdown.engine.config import EngineConfig
    from pytest_shutdown.engine.core import EngineCore
    from pytest_shutdown.engine.llm import ReferenceLLM
    from pytest_shutdown.engine.processes import EngineProcManager, ShutdownOutcome
    from pytest_shutdown.engine.renderer import ReferenceRenderer
    from pytest_shutdown.engine.supervisor import DPSupervisor
    from pytest_shutdown.findings.finding import Finding
    from pytest_shutdown.helpers.tree_launcher import TreeLauncher
    from pytest_shutdown.plugin.matrix import ShutdownTimeouts
    from pytest_shutdown.plugin.orphan_matrix import KillTree, OrphanCell
    from pytest_shutdown.plugin.ray_cluster import RayCluster

#: Graces in tests are this fraction of production (15 s → 1.5 s): the same decisions, cheaper.
TEST_GRACE_SCALE = 0.1
#: How long an engine's own threads may take to end after its shutdown.
THREAD_EXIT_DEADLINE_S = 5.0
#: How long an engine's processes may take to disappear after its shutdown returned.
PROCESS_EXIT_DEADLINE_S = 5.0
SUPERVISOR_CHILDREN = 2

MARKERS = (
    "engine(**fields): override EngineConfig fields for the engine fixtures of this test.",
    f"{MATRIX_MARKER}(request=[...], process=[...], platform=[...], grace=15.0): parametrize the "
    "shutdown_timeouts fixture (and engine_config) over a timeout matrix.",
    "expect_force_kill(reason=...): the engine fixtures' teardown expects a force kill "
    "(without it, a force-killed engine process fails the test).",
    f"{ORPHAN_MATRIX_MARKER}(level=[...], signal=[...], phase=[...]): parametrize the orphan_cell "
    "fixture over every level x signal x phase (ids like worker-SIGKILL-busy); kill_tree(target) "
    "runs a cell.",
)


@pytest.hookimpl
def pytest_report_header(config: pytest.Config) -> str | None:
    """With ``--shutdown-gpu-per-worker``: how the xdist workers spread over the GPUs."""
    if hasattr(config, "workerinput") or not config.getoption("shutdown_gpu_per_worker", False):
        return None
    from pytest_shutdown.plugin import workers

    return workers.sharing_header(config.option, config.getoption("numprocesses", default=None))


#: The markers that parametrize a test (or whose arguments collection checks).
_PARAMETRIZING_MARKERS = frozenset({"engine", ORPHAN_MATRIX_MARKER, MATRIX_MARKER})


@pytest.hookimpl
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = marker_names(metafunc.definition)
    if not names & _PARAMETRIZING_MARKERS:
        return
    for mark in metafunc.definition.iter_markers("engine"):
        _validate_engine_fields(mark.args, mark.kwargs)
    # a matrix's module is imported only where a test uses it
    if ORPHAN_MATRIX_MARKER in names:
        from pytest_shutdown.plugin.orphan_matrix import cells_from_marker as orphan  # noqa: PLC0415

        _parametrize(metafunc, ORPHAN_MATRIX_MARKER, "orphan_cell", orphan)
    if MATRIX_MARKER in names:
        from pytest_shutdown.plugin.matrix import cells_from_marker  # noqa: PLC0415

        _parametrize(metafunc, MATRIX_MARKER, "shutdown_timeouts", cells_from_marker)


def _parametrize(
    metafunc: pytest.Metafunc, marker: str, fixture: str, cells_of: Callable[..., list[Any]]
) -> None:
    """Parametrize ``fixture`` over the cells of the closest ``marker``; bad arguments fail."""
    mark = metafunc.definition.get_closest_marker(marker)
    if mark is None:
        return
    try:
        cells = cells_of(mark.args, mark.kwargs)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)
    if fixture not in metafunc.fixturenames:
        metafunc.fixturenames.append(fixture)
    metafunc.parametrize(fixture, cells, ids=[c.id for c in cells])


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
    if cell is None:
        return None
    from pytest_shutdown.plugin.matrix import ShutdownTimeouts  # noqa: PLC0415 - made by a matrix

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


@pytest.fixture
def orphan_cell(request: pytest.FixtureRequest) -> OrphanCell:
    """One cell of ``@pytest.mark.orphan_matrix(...)``; the marker parametrizes this fixture."""
    pytest.fail(
        f"the orphan_cell fixture needs @pytest.mark.{ORPHAN_MATRIX_MARKER}(level=[...], "
        "signal=[...], phase=[...]) on the test",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def tree_launcher() -> Iterator[TreeLauncher]:
    """The warm process that starts the trees under test (one per session and xdist worker)."""
    from pytest_shutdown.helpers.tree_launcher import TreeLauncher  # noqa: PLC0415

    launcher = TreeLauncher()
    yield launcher
    launcher.close()


@pytest.fixture
def kill_tree(request: pytest.FixtureRequest, tree_launcher: TreeLauncher) -> KillTree:
    """``kill_tree(target, levels=..., phases=..., **options)``: run this test's matrix cell.

    Raises ``ShutdownContractError`` (``orphan-process``, ``exit-hang``, ``collective-hang``) when
    the tree did not die; returns the ``TreeDeath`` record otherwise. ``level``/``signal``/
    ``phase`` default to the test's ``orphan_cell``; pass them to use ``kill_tree`` without the
    marker.
    """
    from pytest_shutdown.plugin.orphan_matrix import kill_tree_of  # noqa: PLC0415

    return kill_tree_of(request, tree_launcher)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A local two-node Ray cluster (CPU only, dashboard off, 127.0.0.1), the session's driver."""
    from pytest_shutdown.plugin.ray_cluster import running_cluster  # noqa: PLC0415

    yield from running_cluster()


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


def _require_torch(fixture: str) -> None:
    """Where torch is missing, one error naming the extra."""
    __tracebackhide__ = True
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        pytest.fail(
            f"fixture {fixture!r} runs the reference engine, which needs torch ({exc}); "
            "install the 'engine' extra: pip install 'pytest-shutdown[engine]'",
            pytrace=False,
        )


@pytest.fixture
def reference_renderer(
    request: pytest.FixtureRequest, engine_config: EngineConfig
) -> Iterator[ReferenceRenderer]:
    """A ReferenceRenderer; teardown checks that its shutdown is idempotent and its threads end."""
    _require_torch("reference_renderer")
    from pytest_shutdown.engine.renderer import ReferenceRenderer
    from pytest_shutdown.helpers.idempotence import assert_idempotent_shutdown
    from pytest_shutdown.plugin.cycles import check_engine_cycles

    check_engine_cycles(
        request,
        "reference_renderer",
        lambda: ReferenceRenderer(engine_config),
        lambda renderer: renderer.tokenize("hello world").result(60),
    )
    renderer = ReferenceRenderer(engine_config)
    yield renderer
    executors = (renderer._executor, renderer._mm_executor)
    findings = _collect(lambda: assert_idempotent_shutdown(renderer))
    findings += _threads_still_running(renderer, executors)
    _fail_teardown(request, findings)


@pytest.fixture
def engine_core(
    request: pytest.FixtureRequest, engine_config: EngineConfig
) -> Iterator[EngineCore]:
    """An in-process EngineCore; teardown checks idempotent shutdown and the gc freeze count."""
    _require_torch("engine_core")
    import gc

    from pytest_shutdown.engine.core import EngineCore
    from pytest_shutdown.helpers.idempotence import assert_idempotent_shutdown
    from pytest_shutdown.plugin.cycles import check_engine_cycles

    check_engine_cycles(
        request,
        "engine_core",
        lambda: EngineCore(engine_config),
        lambda core: core.generate([1, 2, 3], max_tokens=2),
    )
    freeze_count = gc.get_freeze_count()
    core = EngineCore(engine_config)
    yield core
    findings = _collect(lambda: assert_idempotent_shutdown(core))
    if gc.get_freeze_count() != freeze_count:
        from pytest_shutdown.findings.finding import Finding  # noqa: PLC0415

        findings.append(
            Finding(
                "gc-frozen-leak",
                f"EngineCore left gc.get_freeze_count() at {gc.get_freeze_count()} "
                f"(it was {freeze_count} before the engine started).",
                {"before": freeze_count, "after": gc.get_freeze_count()},
            )
        )
    _fail_teardown(request, findings)


@pytest.fixture
def engine_manager(
    request: pytest.FixtureRequest,
    engine_config: EngineConfig,
    expect_force_kill: ForceKillExpectation,
) -> Iterator[EngineProcManager]:
    """An EngineProcManager with ``data_parallel_size`` EngineCore processes, ready.

    Teardown calls ``shutdown(timeout)`` twice — ``timeout`` is the matrix cell's process timeout
    when the test has one, else None — and checks: the second call changes nothing; the timeout
    used is the cell's expected one; nothing was force-killed unless the test expects it
    (``expect_force_kill``); no engine process is left.
    """
    _require_torch("engine_manager")
    from pytest_shutdown.engine.processes import EngineProcManager
    from pytest_shutdown.plugin.cycles import check_engine_cycles

    check_engine_cycles(request, "engine_manager", lambda: EngineProcManager(engine_config))
    manager = EngineProcManager(engine_config)
    pids = _tree_pids(p.pid for p in manager.processes)
    yield manager
    findings = _check_process_shutdown(
        request, manager, engine_config, expect_force_kill, lambda t: manager.shutdown(t)
    )
    findings += _processes_still_running(manager, pids)
    _fail_teardown(request, findings)


@pytest.fixture
def reference_llm(
    request: pytest.FixtureRequest,
    engine_config: EngineConfig,
    expect_force_kill: ForceKillExpectation,
) -> Iterator[ReferenceLLM]:
    """A ReferenceLLM (renderer + engine processes); teardown checks as ``engine_manager``."""
    _require_torch("reference_llm")
    from pytest_shutdown.engine.llm import ReferenceLLM
    from pytest_shutdown.plugin.cycles import check_engine_cycles

    check_engine_cycles(
        request,
        "reference_llm",
        lambda: ReferenceLLM(engine_config),
        lambda llm: llm.generate("hello world", max_tokens=2),
    )
    llm = ReferenceLLM(engine_config)
    manager = llm.manager
    assert manager is not None
    pids = _tree_pids(p.pid for p in manager.processes)
    yield llm

    def shutdown(timeout: float | None) -> ShutdownOutcome | None:
        llm.shutdown(timeout)
        return manager.last_outcome

    findings = _check_process_shutdown(request, llm, engine_config, expect_force_kill, shutdown)
    if not llm.renderer.is_shut_down:
        from pytest_shutdown.findings.finding import Finding  # noqa: PLC0415

        findings.append(
            Finding(
                "cleanup-missing",
                "ReferenceLLM.shutdown() left its renderer running.",
                {"cleanup": "renderer.shutdown"},
            )
        )
    findings += _processes_still_running(llm, pids)
    _fail_teardown(request, findings)


@pytest.fixture
def dp_supervisor(
    request: pytest.FixtureRequest,
    engine_config: EngineConfig,
    expect_force_kill: ForceKillExpectation,
) -> Iterator[DPSupervisor]:
    """A DPSupervisor with two children, each running an EngineProcManager (a 3-level tree).

    Teardown forwards SIGTERM to each child's process group and waits the supervisor's budget
    (``get_engine_process_shutdown_timeout(t, t) + child_exit_grace_s``, ``t`` the cell's
    request timeout or the config's); checks as ``engine_manager``, over the whole tree.
    """
    _require_torch("dp_supervisor")
    from pytest_shutdown.engine.supervisor import DPSupervisor
    from pytest_shutdown.plugin.cycles import check_engine_cycles

    check_engine_cycles(
        request,
        "dp_supervisor",
        lambda: DPSupervisor(engine_config, num_children=SUPERVISOR_CHILDREN),
    )
    supervisor = DPSupervisor(engine_config, num_children=SUPERVISOR_CHILDREN)
    roots = [p.pid for p in supervisor.children]
    roots += [pid for pids in supervisor.engine_pids.values() for pid in pids]
    pids = _tree_pids(roots)
    yield supervisor
    cell = current_cell(request)
    timeout = cell.request_timeout if cell is not None else None
    findings = _check_idempotent(request, supervisor, lambda: supervisor.shutdown(timeout))
    outcome = supervisor.last_outcome
    if outcome is not None:
        findings += _collect(lambda: _assert_force_kill(outcome, expect_force_kill))
    findings += _processes_still_running(supervisor, pids)
    _fail_teardown(request, findings)


class ShutdownCheck:
    """The assertion helpers under their own names, bound to the running test.

    Each call behaves exactly like the helper (same arguments, same return value, same
    ``ShutdownContractError``); in addition, every finding is recorded for the test, so it
    reaches the terminal summary, the ``--shutdown-report`` JSON and the JUnit XML properties.
    """

    HELPERS = (
        "assert_idempotent_shutdown",
        "assert_finalizes_on_gc",
        "check_finalizers",
        "assert_finalizers_ok",
        "assert_nonblocking_shutdown",
        "assert_timeout_decoupling",
        "assert_not_force_killed",
        "assert_device_memory_released",
        "no_leaks",
        "probe_exit",
    )

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self.findings: list[Finding] = []

    def record(self, findings: list[Finding]) -> None:
        """Record findings for this test (what every bound helper does with its findings)."""
        self.findings.extend(findings)
        _record(self._request, findings)

    def __getattr__(self, name: str) -> Any:
        if name not in self.HELPERS:
            raise AttributeError(
                f"shutdown_check has no helper {name!r}; accepted: {', '.join(self.HELPERS)}"
            )
        import functools

        import pytest_shutdown
        from pytest_shutdown.findings.finding import ShutdownContractError
        from pytest_shutdown.helpers.finalization import check_finalizers

        # not from the top level: check_finalizers left it (a DeprecationWarning there)
        helper: Callable[..., Any] = (
            check_finalizers if name == "check_finalizers" else getattr(pytest_shutdown, name)
        )
        if name == "no_leaks":
            return self._bound_context(helper)

        @functools.wraps(helper)
        def bound(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            try:
                result = helper(*args, **kwargs)
            except ShutdownContractError as exc:
                self.record(exc.findings)
                raise
            if name == "check_finalizers":
                self.record(list(result))
            return result

        return bound

    def _bound_context(self, helper: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        from pytest_shutdown._base.hidden import contextmanager
        from pytest_shutdown.findings.finding import ShutdownContractError

        @contextmanager  # outermost: wraps() onto it would copy in the helper's own function
        @functools.wraps(helper)
        def bound(*args: Any, **kwargs: Any) -> Iterator[Any]:
            __tracebackhide__ = True
            try:
                with helper(*args, **kwargs) as value:
                    yield value
            except ShutdownContractError as exc:
                self.record(exc.findings)
                raise

        return bound


@pytest.fixture
def shutdown_check(request: pytest.FixtureRequest) -> ShutdownCheck:
    """The helpers bound to this test: ``shutdown_check.assert_idempotent_shutdown(obj)`` etc."""
    return ShutdownCheck(request)


def _record(request: pytest.FixtureRequest, findings: list[Finding]) -> None:
    """Put findings into the test's JUnit properties and the shutdown report, if one runs."""
    if not findings:
        return
    node = request.node
    for finding in findings:
        node.user_properties.append((f"shutdown:{finding.code}", finding.message))
    report = request.config.pluginmanager.get_plugin("pytest-shutdown-report")
    if report is not None:
        report.add_findings(node.nodeid, [f.to_dict() for f in findings])


def _fail_teardown(request: pytest.FixtureRequest, findings: list[Finding]) -> None:
    __tracebackhide__ = True
    from pytest_shutdown.findings.finding import raise_if_any  # noqa: PLC0415

    _record(request, findings)
    raise_if_any(findings)


def _check_process_shutdown(
    request: pytest.FixtureRequest,
    engine: object,
    config: EngineConfig,
    expect_force_kill: ForceKillExpectation,
    shutdown: Callable[[float | None], ShutdownOutcome | None],
) -> list[Finding]:
    from pytest_shutdown.findings.finding import Finding  # noqa: PLC0415

    cell = current_cell(request)
    timeout = cell.process_timeout if cell is not None else None
    outcomes: list[ShutdownOutcome | None] = []
    findings = _check_idempotent(request, engine, lambda: outcomes.append(shutdown(timeout)))
    if not outcomes or outcomes[0] is None:
        return findings
    outcome = outcomes[0]
    if any(later is not outcome for later in outcomes[1:]):
        findings.append(
            Finding(
                "cleanup-repeated",
                f"{type(engine).__name__}.shutdown() stopped its processes again on a later call.",
                {"outcomes": [repr(o) for o in outcomes]},
            )
        )
    if cell is not None:
        expected = cell.expected_process_timeout
        if expected is None:
            expected = config.default_process_timeout_s
        if outcome.timeout != expected:
            findings.append(
                Finding(
                    "timeout-policy",
                    f"timeout matrix cell {cell.id}: the process timeout "
                    f"{type(engine).__name__}.shutdown() used (its outcome's timeout) was "
                    f"{_seconds_text(outcome.timeout)}, expected {_seconds_text(expected)}.",
                    {
                        "cell": cell.id,
                        "got": outcome.timeout,
                        "expected": expected,
                        "checked": f"the outcome of {type(engine).__name__}.shutdown()",
                    },
                )
            )
    findings += _collect(lambda: _assert_force_kill(outcome, expect_force_kill))
    return findings


def _seconds_text(value: float | None) -> str:
    return "None" if value is None else f"{value:g} s"


def _check_idempotent(
    request: pytest.FixtureRequest, engine: object, shutdown: Callable[[], object]
) -> list[Finding]:
    """Call ``shutdown`` twice; each call must return without raising. A call the teardown
    budget interrupts is recorded as ``shutdown-budget``, and the interruption goes on."""
    import traceback

    from pytest_shutdown.findings.finding import Finding
    from pytest_shutdown.plugin.budget import ShutdownBudgetExceeded

    findings: list[Finding] = []
    for number in (1, 2):
        try:
            shutdown()
        except ShutdownBudgetExceeded as exc:
            _record(
                request,
                [
                    *findings,
                    Finding(
                        "shutdown-budget",
                        f"{type(engine).__name__}.shutdown() call {number} was interrupted by "
                        f"the teardown's shutdown budget: {exc}",
                        {"call": number, "traceback": traceback.format_exc()},
                    ),
                ],
            )
            raise
        except Exception as exc:  # noqa: BLE001 - a raising shutdown is the finding
            findings.append(
                Finding(
                    "shutdown-raised",
                    f"{type(engine).__name__}.shutdown() call {number} raised "
                    f"{type(exc).__name__}: {exc}",
                    {"call": number, "traceback": traceback.format_exc()},
                )
            )
    return findings


def _assert_force_kill(outcome: ShutdownOutcome, expectation: ForceKillExpectation) -> None:
    from pytest_shutdown.helpers.exits import assert_not_force_killed

    assert_not_force_killed(outcome, expected=bool(expectation))


def _tree_pids(roots: Iterable[int | None]) -> set[int]:
    from pytest_shutdown._os.killer import tree_of  # noqa: PLC0415

    return {pid for root in roots if root is not None for pid in tree_of(root) or [root]}


def _processes_still_running(owner: object, pids: set[int]) -> list[Finding]:
    import psutil

    from pytest_shutdown.findings.finding import Finding

    deadline = time.monotonic() + PROCESS_EXIT_DEADLINE_S
    alive: list[psutil.Process] = []
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            proc.wait(max(0.0, deadline - time.monotonic()))
        except psutil.TimeoutExpired:
            alive.append(proc)
        except (psutil.Error, ChildProcessError):
            continue
    if not alive:
        return []
    from pytest_shutdown._os.killer import kill_trees

    def describe(pid: int) -> dict[str, object]:
        try:
            proc = psutil.Process(pid)
            return {"pid": pid, "name": proc.name(), "cmdline": proc.cmdline()}
        except psutil.Error:
            return {"pid": pid, "name": None, "cmdline": []}

    # nothing the fixture started may outlive the test
    records = kill_trees(
        [p.pid for p in alive],
        why=f"the engine fixture: {type(owner).__name__}'s process outlived its shutdown",
        timeout=0.0,
        describe=describe,
    )
    return [
        Finding(
            "process-leak",
            f"{len(records)} process(es) of {type(owner).__name__} still ran "
            f"{PROCESS_EXIT_DEADLINE_S:g}s after its shutdown.",
            {"processes": records, "deadline_s": PROCESS_EXIT_DEADLINE_S},
        )
    ]


def _collect(check: Callable[[], object]) -> list[Finding]:
    from pytest_shutdown.findings.finding import ShutdownContractError  # noqa: PLC0415

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
    from pytest_shutdown.findings.finding import Finding  # noqa: PLC0415

    return [
        Finding(
            "thread-leak",
            f"{type(owner).__name__}'s threads {', '.join(alive)} still ran "
            f"{THREAD_EXIT_DEADLINE_S:g}s after its shutdown.",
            {"threads": alive, "deadline_s": THREAD_EXIT_DEADLINE_S},
        )
    ]


#: pytest scans a plugin module's names for hooks and fixtures: it is shown these alone.
__dir__ = scanned_module_names(globals())
