"""The pytest plugin (entry point ``shutdown``): ``pytest -p shutdown``.

Hooks only: options, ini keys, markers, turning the guard on, the report header. The guard itself
lives in :mod:`pytest_shutdown.guard` (accounting), :mod:`pytest_shutdown.budget` (the teardown
budget), :mod:`pytest_shutdown.report` (terminal, JSON, xdist) and :mod:`pytest_shutdown.settings`
(validation).

Installed, the plugin registers its options and markers and changes nothing in a run. The guard is
on when ``-p shutdown`` is given explicitly, or ``--shutdown-guard=warn|fail``, or the ini key
``shutdown_guard``; ``--shutdown-guard=off`` wins over all. Loading it never imports torch.
"""

from __future__ import annotations

import sys

import pytest


def _not_rewritten(package: str = "pytest_shutdown") -> None:
    """Take this package off the list of modules pytest rewrites the asserts of.

    pytest rewrites every module of an installed plugin's distribution as it is imported: its
    import hook finds, checks and loads its own cached bytecode, about 0.25 ms a module more
    than Python's import, and a guarded session imports some forty (10 ms of every session).
    Nothing here needs it: no assert of this package is one a user reads (the checks raise
    ShutdownContractError with their findings). The hook's list is pytest's own state: where it
    is not what this expects, nothing changes and the modules are rewritten as before.
    """
    for finder in sys.meta_path:
        names = getattr(finder, "_must_rewrite", None)
        if isinstance(names, set) and package in names:
            names.discard(package)
            cache = getattr(finder, "_marked_for_rewrite_cache", None)
            if isinstance(cache, dict):
                cache.clear()


_not_rewritten()

import pytest_shutdown  # noqa: E402 - after the rewrite list is changed
from pytest_shutdown.cycles import MARKER_HELP as CYCLES_MARKER_HELP  # noqa: E402
from pytest_shutdown.resources import kind_names  # noqa: E402
from pytest_shutdown.settings import (  # noqa: E402
    ALLOW_LEAKS_KINDS,
    DEFAULT_GRACE_S,
    GUARD_MODES,
    LONG_LIVED_CHOICES,
    PLATFORM_CHOICES,
    SETTINGS_KEY,
    load_settings,
    validate_markers,
)

GUARD_DESC = """
The shutdown guard: 'fail' errors every test that leaves threads, child processes or a
gc.freeze() behind (and enforces the teardown budget), 'warn' emits ShutdownLeakWarning instead,
'off' checks nothing. Default: 'fail' when the plugin is requested with '-p shutdown', otherwise
'off'. '--shutdown-guard=off' wins over '-p shutdown' and the ini key.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
GRACE_DESC = f"""
Seconds a thread or child process started by a test may keep running after the test's teardown
before it is reported as a leak (polled, so clean tests do not wait). Default {DEFAULT_GRACE_S:g}.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
BUDGET_DESC = """
Teardown budget in seconds (0 to 86400): a test's teardown (fixture finalizers included) that
takes longer is interrupted, every thread's stack is captured in the test's report section, the
test's child processes are killed and the test errors; the session goes on. A teardown still not
done one more budget later ends the process with exit code 70 (stacks dumped, report written).
0 (the default) means no budget. A per-test value is set with @pytest.mark.shutdown_budget(seconds).
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
REPORT_DESC = """
Write the guard's findings and shutdown durations as JSON to this path (merged over xdist
workers). Each test's record is appended to PATH's record log (<stem>.records.jsonl) as the
test ends; after a killed run, 'python -m pytest_shutdown.records LOG -o PATH' assembles it.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
GRAPHS_DESC = """
Draw a backref picture (objgraph.show_backrefs) into this folder for every not-collected and
finalizer-* finding of assert_finalizes_on_gc: a PNG when graphviz's 'dot' is on PATH, else the
.dot source and a note. The terminal section 'shutdown graphs' names the files.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
GPU_PER_WORKER_DESC = """
Under pytest-xdist, give each worker one GPU: worker gwN sees the (N mod count)-th visible device
through CUDA_VISIBLE_DEVICES (CUDA) or HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (ROCm), set
before the conftests are imported, so engine fixtures fan out over a multi-GPU machine. The
header says when workers share GPUs. Does nothing without xdist or on the CPU.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
LONG_LIVED_DESC = """
Threads and child processes owned by a module global or a class attribute (a singleton pool)
are never a test's leak; the guard lists those still alive at session end under 'long-lived
resources'. 'list' (default) only lists them; 'fail' also makes the session fail.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
RESOURCES_DESC = f"""
Which resource kinds the guard checks after each test: a comma-separated list of
{', '.join(kind_names())}, or 'all' (the default).
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
NATIVE_ALLOW_DESC = """
Kernel-name glob patterns (one a line) of native threads (not listed by threading) that the
guard never blames: lazily started process-lifetime pools of your libraries, beyond the built-in
list (OpenMP/MKL/torch intra-op, gRPC, CUDA, NVML, tokio, rayon...).
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks
PLATFORM_DESC = """
Device platform for the pytest-shutdown fixtures: 'auto' (default) detects it; 'cuda', 'rocm'
or 'cpu' forces one.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks

DETAILS_DESC = """
Show every fact of each finding (its JSON details: stacks, pids, command lines, the cell) in the
failure and in the terminal section 'shutdown'; -vv does the same.
""".strip().replace("\n", " ")  # one paragraph: pytest --help keeps line breaks

MARKERS = (
    f"allow_leaks({', '.join(k + '=False' for k in ALLOW_LEAKS_KINDS)}, reason=...): "
    "let this test leave the given kinds behind under the shutdown guard (all kinds when none is "
    "given); threads= also takes thread-name glob patterns; reason is required.",
    "shutdown_budget(seconds): the teardown budget of this test, overriding --shutdown-budget "
    "(0 = none).",
    CYCLES_MARKER_HELP,
)


@pytest.hookimpl
def pytest_addoption(parser: pytest.Parser) -> None:
    """Options and ini keys of the shutdown guard."""
    group = parser.getgroup("shutdown", "pytest-shutdown: leaks, frozen GC and hung teardowns")
    group.addoption(
        "--shutdown-guard",
        dest="shutdown_guard",
        metavar="|".join(GUARD_MODES),
        default=None,
        help=GUARD_DESC,
    )
    group.addoption(
        "--shutdown-grace",
        dest="shutdown_grace",
        metavar="SECONDS",
        default=None,
        help=GRACE_DESC,
    )
    group.addoption(
        "--shutdown-budget",
        dest="shutdown_budget",
        metavar="SECONDS",
        default=None,
        help=BUDGET_DESC,
    )
    group.addoption(
        "--shutdown-report",
        dest="shutdown_report",
        metavar="PATH",
        default=None,
        help=REPORT_DESC,
    )
    group.addoption(
        "--shutdown-graphs",
        dest="shutdown_graphs",
        metavar="DIR",
        default=None,
        help=GRAPHS_DESC,
    )
    group.addoption(
        "--shutdown-platform",
        dest="shutdown_platform",
        metavar="|".join(PLATFORM_CHOICES),
        default=None,
        help=PLATFORM_DESC,
    )
    group.addoption(
        "--shutdown-gpu-per-worker",
        dest="shutdown_gpu_per_worker",
        action="store_true",
        default=False,
        help=GPU_PER_WORKER_DESC,
    )
    group.addoption(
        "--shutdown-long-lived",
        dest="shutdown_long_lived",
        metavar="|".join(LONG_LIVED_CHOICES),
        default=None,
        help=LONG_LIVED_DESC,
    )
    group.addoption(
        "--shutdown-details",
        dest="shutdown_details",
        action="store_true",
        default=False,
        help=DETAILS_DESC,
    )
    group.addoption(
        "--shutdown-resources",
        dest="shutdown_resources",
        metavar="KIND,...|all",
        default=None,
        help=RESOURCES_DESC,
    )
    parser.addini("shutdown_guard", GUARD_DESC, default="")
    parser.addini("shutdown_resources", RESOURCES_DESC, default="")
    parser.addini(
        "shutdown_native_threads_allow", NATIVE_ALLOW_DESC, type="linelist", default=[]
    )
    parser.addini("shutdown_long_lived", LONG_LIVED_DESC, default="")
    parser.addini("shutdown_grace", GRACE_DESC, default="")
    parser.addini("shutdown_budget", BUDGET_DESC, default="")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """``--shutdown-gpu-per-worker``: an xdist worker's GPU is set before any conftest runs."""
    if getattr(early_config.known_args_namespace, "shutdown_gpu_per_worker", False):
        from pytest_shutdown.workers import assign_worker_gpu_early

        assign_worker_gpu_early(early_config.known_args_namespace)


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    """Register the markers, validate the options, and turn the guard on when asked."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    settings = load_settings(config)  # raises pytest.UsageError (exit code 4) on bad input
    config.stash[SETTINGS_KEY] = settings

    # The fixtures are registered always, whether or not the guard is on.
    from pytest_shutdown import fixtures

    if not config.pluginmanager.is_registered(fixtures):
        config.pluginmanager.register(fixtures, "pytest-shutdown-fixtures")
    # @pytest.mark.shutdown_cycles(n): the call phase repeated under the growth check.
    from pytest_shutdown import cycles

    if not config.pluginmanager.is_registered(cycles):
        config.pluginmanager.register(cycles, "pytest-shutdown-cycles")
    # Every ShutdownContractError of a test: codes on the status line, findings in the reports
    # (with the guard on, its report wrapper notes them: one wrapper per phase, not three; the
    # status-line hook comes with the first code, or now on an xdist controller).
    from pytest_shutdown import contract_errors

    if not settings.enabled:
        config.pluginmanager.register(
            contract_errors.ContractErrorsReported(), contract_errors.PLUGIN_NAME
        )
    elif not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no":
        contract_errors.show_codes_on_status_line(config)

    if settings.graphs_dir is not None:
        from pytest_shutdown.report import GraphsRecorder

        config.pluginmanager.register(
            GraphsRecorder(config, settings.graphs_dir), "pytest-shutdown-graphs"
        )

    if settings.enabled or settings.report_path is not None:
        from pytest_shutdown.report import ShutdownReport

        report = ShutdownReport(config, settings)
        config.pluginmanager.register(report, "pytest-shutdown-report")
        from pytest_shutdown.interrupts import SigtermEndsSessionInOrder

        # Ended at once (a SIGTERM the main thread cannot take): the report is written first.
        sigterm = SigtermEndsSessionInOrder(report.end_at_once)
        config.pluginmanager.register(sigterm, "pytest-shutdown-sigterm")
        if settings.enabled:
            from pytest_shutdown.guard import ShutdownGuard

            guard = ShutdownGuard(config, settings, report)
            config.pluginmanager.register(guard, "pytest-shutdown-guard")
        else:
            from pytest_shutdown.report import RecordsTravelWithReports

            carrier = RecordsTravelWithReports(report)
            config.pluginmanager.register(carrier, "pytest-shutdown-report-records")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One rule for bad marker arguments: a collection error naming the test and the marker."""
    try:
        validate_markers(metafunc.definition)
    except pytest.UsageError as exc:
        error = str(exc)
    else:
        return
    pytest.fail(error, pytrace=False)


def pytest_report_header(config: pytest.Config) -> str:
    """One header line: version and guard mode."""
    line = f"shutdown: pytest-shutdown {pytest_shutdown.__version__}"
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None or not settings.enabled:
        return line + ", guard off"
    budget = f"{settings.budget_s:g} s" if settings.budget_s else "none"
    return f"{line}, guard {settings.mode} (grace {settings.grace_s:g} s, budget {budget})"
