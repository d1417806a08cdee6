"""The pytest plugin (entry point ``shutdown``): options, ini keys, markers, turning the guard
on, the report header. Installed, it changes nothing in a run: the guard is on with an explicit
``-p shutdown``, ``--shutdown-guard=warn|fail`` or the ini key ``shutdown_guard``;
``--shutdown-guard=off`` wins over all. Loading it never imports torch.

pytest registers this module object itself as the plugin: its hooks are here. The package holds
the plugin's machinery (issue 47), each module imported when a session needs it: ``settings``,
the ``guard`` and its parts, the teardown ``budget`` (``hang``, ``interrupts``, ``exit_bound``),
``report``, ``records`` and ``pending``, ``quiet``, ``contract_errors``, the ``fixtures`` and the
markers behind them (``matrix``, ``orphan_matrix``, ``cycles``, ``ray_cluster``), ``workers``.
No module below this layer imports it (``tests/test_layers.py``).
"""

from __future__ import annotations

import pytest

import pytest_shutdown
from pytest_shutdown._fast.node_markers import CYCLES as CYCLES_MARKER
from pytest_shutdown._fast.node_markers import CYCLES_HELP as CYCLES_MARKER_HELP
from pytest_shutdown._fast.node_markers import marker_names, scanned_module_names
from pytest_shutdown.plugin.quiet import quiet_enabled
from pytest_shutdown.plugin.settings import (
    ALLOW_LEAKS_KINDS,
    SETTINGS_KEY,
    add_options,
    load_settings,
    validate_markers,
)

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
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """``--shutdown-gpu-per-worker``: an xdist worker's GPU is set before any conftest runs."""
    if getattr(early_config.known_args_namespace, "shutdown_gpu_per_worker", False):
        from pytest_shutdown.plugin.workers import assign_worker_gpu_early

        assign_worker_gpu_early(early_config.known_args_namespace)


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    """Register the markers, validate the options, and turn the guard on when asked."""
    from pytest_shutdown.plugin import fixtures

    for line in (*MARKERS, *fixtures.MARKERS):
        config.addinivalue_line("markers", line)
    settings = load_settings(config)  # raises pytest.UsageError (exit code 4) on bad input
    quiet_enabled(config)  # a bad shutdown_quiet is refused, guard on or off
    config.stash[SETTINGS_KEY] = settings
    if not config.pluginmanager.is_registered(fixtures):
        config.pluginmanager.register(fixtures, "pytest-shutdown-fixtures")
    # Every ShutdownContractError of a test: codes on the status line, findings in the reports
    # (with the guard on, its report wrapper notes them; the status-line hook comes with the
    # first code, or now on an xdist controller).
    if not settings.enabled:
        from pytest_shutdown.plugin import contract_errors

        config.pluginmanager.register(
            contract_errors.ContractErrorsReported(), contract_errors.PLUGIN_NAME
        )
    elif not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no":
        from pytest_shutdown.plugin.contract_errors import show_codes_on_status_line

        show_codes_on_status_line(config)

    if settings.graphs_dir is not None:
        from pytest_shutdown.plugin.report import GraphsRecorder

        config.pluginmanager.register(
            GraphsRecorder(config, settings.graphs_dir), "pytest-shutdown-graphs"
        )

    if settings.enabled or settings.report_path is not None:
        from pytest_shutdown.plugin.report import ShutdownReport

        report = ShutdownReport(config, settings)
        config.pluginmanager.register(report, "pytest-shutdown-report")
        if settings.enabled:
            from pytest_shutdown.plugin.guard import ShutdownGuard

            if quiet_enabled(config):  # before the guard: its teardown wrapper is outside
                from pytest_shutdown.plugin.quiet import QuietTeardowns, quiet_allow

                quiet = QuietTeardowns(config, quiet_allow(config))
                config.pluginmanager.register(quiet, "pytest-shutdown-quiet")

            guard = ShutdownGuard(config, settings, report)
            config.pluginmanager.register(guard, "pytest-shutdown-guard")
        else:
            from pytest_shutdown.plugin.report import RecordsTravelWithReports

            carrier = RecordsTravelWithReports(report)
            config.pluginmanager.register(carrier, "pytest-shutdown-report-records")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.shutdown_cycles(n)``: its per-test hook (:mod:`pytest_shutdown.plugin.cycles`)
    is registered only when a collected test has the marker."""
    if any(CYCLES_MARKER in marker_names(item) for item in items):
        from pytest_shutdown.plugin import cycles

        if not config.pluginmanager.is_registered(cycles):
            config.pluginmanager.register(cycles, "pytest-shutdown-cycles")


@pytest.hookimpl
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One rule for bad marker arguments: a collection error naming the test and the marker."""
    try:
        validate_markers(metafunc.definition)
    except pytest.UsageError as exc:
        error = str(exc)
    else:
        return
    pytest.fail(error, pytrace=False)


@pytest.hookimpl
def pytest_report_header(config: pytest.Config) -> str:
    """One header line: version and guard mode."""
    line = f"shutdown: pytest-shutdown {pytest_shutdown.__version__}"
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None or not settings.enabled:
        return line + ", guard off"
    budget = f"{settings.budget_s:g} s" if settings.budget_s else "none"
    return f"{line}, guard {settings.mode} (grace {settings.grace_s:g} s, budget {budget})"


#: pytest scans a plugin module's names for hooks and fixtures: it is shown these alone.
__dir__ = scanned_module_names(globals())
