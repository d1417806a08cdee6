"""Loading the plugin stays cheap: what a session imports whether or not the guard is on.

Every session with pytest-shutdown installed loads the plugin and registers its fixtures; the
guard's fixed cost per session (issue 26: <= 30 ms, ``benchmarks/run.py --only guard``) is
mostly imports. These tests pin down which heavy modules are imported only when used, so that
an eager import added later shows up here rather than as a slower benchmark.
"""

from __future__ import annotations

import json

import pytest

#: Imported only when a feature needs them: the device readers (a platform is detected), the
#: orphan matrix's checks and tree launcher (a matrix is built or run), multiprocessing (its
#: Process.start is wrapped when something imports it), sysconfig (a hung test's stack is
#: read; a creation site is sorted without it), the ownership search (something was left), the
#: growth marker's hook (a test has the marker), the socket tables (a socket is described).
LAZY = (
    "pytest_shutdown.devices",
    "pytest_shutdown.plugin.cycles",
    "pytest_shutdown.resources.sockets",
    "pytest_shutdown.ownership.owners",
    "multiprocessing",
    "pytest_shutdown.gpu.readers",
    "pytest_shutdown.helpers.orphans",
    "pytest_shutdown.helpers.tree_launcher",
    "multiprocessing.connection",
    "sysconfig",
    "torch",
)
#: ctypes too, while the guard is off (the guard may need it: prctl for containment), and the
#: findings (no ShutdownContractError exists before a test imports them).
LAZY_GUARD_OFF = (
    *LAZY,
    "ctypes",
    "pytest_shutdown.findings.finding",
    "pytest_shutdown.findings.text",
)

RECORD = """
import json, sys

def pytest_sessionfinish(session):
    wanted = json.loads({lazy!r})
    with open("imported.json", "w") as out:
        json.dump(sorted(name for name in wanted if name in sys.modules), out)
"""


MODES = [[], ["-p", "shutdown"], ["-p", "shutdown", "--shutdown-guard=warn"]]
TRIVIAL_TEST = "def test_one():\n    assert True\n"


@pytest.mark.parametrize("mode", MODES, ids=["installed", "fail", "warn"])
def test_a_session_of_trivial_tests_imports_none_of_the_heavy_modules(
    pytester: pytest.Pytester, mode: list[str]
) -> None:
    pytester.makeconftest(RECORD.format(lazy=json.dumps(LAZY if mode else LAZY_GUARD_OFF)))
    pytester.makepyfile(test_trivial=TRIVIAL_TEST)
    result = pytester.runpytest_subprocess(*mode)
    result.assert_outcomes(passed=1)
    imported = json.loads((pytester.path / "imported.json").read_text())
    assert imported == [], f"loaded by the session although nothing used them: {imported}"


def test_the_lazy_imports_still_happen_when_a_feature_needs_them(
    pytester: pytest.Pytester,
) -> None:
    """The same record catches an import: a test that builds an orphan matrix imports its
    checks, one with the growth marker its hook. A test that starts a thread under the guard has
    its creation site recorded, which imports nothing (sysconfig cost the first one 10 ms)."""
    pytester.makeconftest(RECORD.format(lazy=json.dumps(LAZY)))
    pytester.makepyfile(
        test_used="""
        import threading
        import pytest

        def test_thread():
            thread = threading.Thread(target=lambda: None)
            thread.start()
            thread.join()

        @pytest.mark.orphan_matrix(signal=["SIGTERM"])
        def test_cell(orphan_cell):
            assert orphan_cell.signal == "SIGTERM"

        @pytest.mark.shutdown_cycles(2, warmup=0)
        def test_cycled():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown")
    result.assert_outcomes(passed=3)
    imported = json.loads((pytester.path / "imported.json").read_text())
    assert "pytest_shutdown.helpers.orphans" in imported
    assert "pytest_shutdown.plugin.cycles" in imported
    assert "sysconfig" not in imported


def test_the_platform_choices_are_the_device_platforms() -> None:
    from pytest_shutdown.devices import PLATFORMS
    from pytest_shutdown.plugin.settings import PLATFORM_CHOICES

    assert PLATFORM_CHOICES == ("auto", *PLATFORMS)


LOADERS = """
import json, sys

def pytest_sessionfinish(session):
    loaders = {
        name: type(module.__loader__).__name__
        for name, module in list(sys.modules.items())
        if name.startswith("pytest_shutdown") and module is not None
    }
    with open("loaders.json", "w") as out:
        json.dump(loaders, out)
"""


def test_the_package_is_loaded_by_python_not_by_the_assert_rewriter(
    pytester: pytest.Pytester,
) -> None:
    """pytest rewrites an installed plugin's modules on import (its hook is slower than
    Python's); the package's __init__ takes the package off that list before importing any module
    of its own: only that __init__ goes through the rewriter, not even the entry point."""
    pytester.makeconftest(LOADERS)
    pytester.makepyfile(test_trivial=TRIVIAL_TEST)
    result = pytester.runpytest_subprocess("-p", "shutdown")
    result.assert_outcomes(passed=1)
    loaders = json.loads((pytester.path / "loaders.json").read_text())
    assert "pytest_shutdown.plugin.guard" in loaders
    assert "pytest_shutdown.plugin.settings" in loaders
    rewritten = sorted(name for name, kind in loaders.items() if kind == "AssertionRewritingHook")
    assert set(rewritten) <= {"pytest_shutdown"}, rewritten


HOOKS_SEEN = """
import json

def pytest_sessionfinish(session):
    manager = session.config.pluginmanager
    seen = {}
    for name in ("pytest-shutdown-guard", "pytest-shutdown-report"):
        plugin = manager.get_plugin(name)
        methods = sorted(
            n for k in type(plugin).__mro__ for n in vars(k) if n.startswith("pytest_")
        )
        registered = sorted(
            impl.function.__name__
            for caller in manager.get_hookcallers(plugin) or ()
            for impl in caller.get_hookimpls()
            if impl.plugin is plugin
        )
        seen[name] = {"dir": dir(plugin), "methods": methods, "registered": registered}
    with open("hooks.json", "w") as out:
        json.dump(seen, out)
"""


def test_the_guard_and_report_show_pytest_their_hooks_and_nothing_else(
    pytester: pytest.Pytester,
) -> None:
    """pluggy and pytest's fixture manager read every name ``dir()`` lists of a registered
    plugin object: the guard and the report list their hooks only, and pluggy still registers
    every one of them."""
    pytester.makeconftest(HOOKS_SEEN)
    pytester.makepyfile(test_trivial=TRIVIAL_TEST)
    result = pytester.runpytest_subprocess("-p", "shutdown")
    result.assert_outcomes(passed=1)
    seen = json.loads((pytester.path / "hooks.json").read_text())
    for name, plugin in seen.items():
        assert plugin["dir"] == plugin["methods"], name
        assert len(plugin["methods"]) >= 8, name
        assert plugin["registered"] == plugin["methods"], name
