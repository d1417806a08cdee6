"""The names of a node's markers, as the guard and the fixtures read them."""

from __future__ import annotations

import pytest

from pytest_shutdown._fast.node_markers import marker_names, scanned_module_names

MARKED = """
import pytest

pytestmark = pytest.mark.allow_leaks(threads=True, reason="a pool the module keeps")

@pytest.mark.shutdown_budget(5)
class TestEngine:
    @pytest.mark.parametrize("n", [1, 2])
    def test_cycle(self, n):
        pass

    def test_plain(self):
        pass

def test_alone():
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_parametrized(n):
    pass
"""


def test_a_nodes_marker_names_are_its_own_and_its_parents(pytester: pytest.Pytester) -> None:
    items = pytester.getitems(MARKED)
    assert len(items) == 6
    for item in items:
        assert marker_names(item) == {mark.name for mark in item.iter_markers()}
    by_name = {item.name: marker_names(item) for item in items}
    assert by_name["test_cycle[1]"] == {"allow_leaks", "shutdown_budget", "parametrize"}
    assert by_name["test_plain"] == {"allow_leaks", "shutdown_budget"}
    assert by_name["test_alone"] == {"allow_leaks"}


def test_tests_with_the_same_markers_share_one_set(pytester: pytest.Pytester) -> None:
    """One object per distinct set of names, not one per test (each is kept to the end)."""
    items = {item.name: item for item in pytester.getitems(MARKED)}
    assert marker_names(items["test_cycle[1]"]) is marker_names(items["test_cycle[2]"])
    assert marker_names(items["test_parametrized[1]"]) is marker_names(
        items["test_parametrized[2]"]
    )
    assert marker_names(items["test_alone"]) is not marker_names(items["test_parametrized[1]"])


def test_a_marker_added_after_the_first_question_is_seen(pytester: pytest.Pytester) -> None:
    """A conftest's ``add_marker`` in its own ``pytest_collection_modifyitems`` (after the
    guard's first question), on a test or on its class, shows in the names asked next."""
    items = {item.name: item for item in pytester.getitems(MARKED)}
    plain, sibling = items["test_plain"], items["test_cycle[1]"]
    assert "shutdown_cycles" not in marker_names(plain)
    plain.add_marker(pytest.mark.shutdown_cycles(3))
    assert marker_names(plain) == {"allow_leaks", "shutdown_budget", "shutdown_cycles"}
    assert "shutdown_cycles" not in marker_names(sibling)
    assert plain.parent is not None
    plain.parent.add_marker(pytest.mark.usefixtures("tmp_path"))  # on the class: all its tests
    for item in (plain, sibling):
        assert "usefixtures" in marker_names(item)
        assert marker_names(item) == {mark.name for mark in item.iter_markers()}
    assert "usefixtures" not in marker_names(items["test_alone"])


def test_a_plugin_modules_dir_lists_its_hooks_and_fixtures_only() -> None:
    @pytest.fixture
    def a_fixture() -> int:
        return 1

    def pytest_configure(config: pytest.Config) -> None:
        pass

    def helper() -> None:
        pass

    namespace = {
        "a_fixture": a_fixture,
        "pytest_configure": pytest_configure,
        "helper": helper,
        "pytest_shutdown": pytest,  # a module whose name starts like a hook's: not a hook
        "CONSTANT": 3,
    }
    assert sorted(scanned_module_names(namespace)()) == ["a_fixture", "pytest_configure"]


SCANNED = """
import json
import pytest_shutdown.plugin.fixtures as fixtures
import pytest_shutdown.plugin as plugin

def pytest_sessionfinish(session):
    manager = session.config.pluginmanager
    registered = sorted(
        impl.function.__name__
        for module in (fixtures, plugin)
        for caller in manager.get_hookcallers(module) or ()
        for impl in caller.get_hookimpls()
        if impl.plugin is module
    )
    hooks = sorted(
        name for module in (fixtures, plugin) for name, value in vars(module).items()
        if name.startswith("pytest_") and callable(value)
    )
    with open("scanned.json", "w") as out:
        json.dump({"dir": dir(fixtures), "registered": registered, "hooks": hooks}, out)
"""


def test_the_plugin_modules_keep_every_hook_and_fixture_and_show_pytest_nothing_else(
    pytester: pytest.Pytester,
) -> None:
    """pytest reads every name ``dir()`` lists of a plugin module (for hooks and fixtures):
    the plugin's modules list those alone, and every hook and fixture is still found."""
    import json

    pytester.makeconftest(SCANNED)
    pytester.makepyfile(
        test_uses="""
        def test_fixtures(request):
            for name in ("engine_config", "shutdown_check", "shutdown_timeouts", "kill_tree"):
                assert request._fixturemanager.getfixturedefs(name, request.node), name
        """
    )
    result = pytester.runpytest_subprocess("-p", "shutdown")
    result.assert_outcomes(passed=1)
    seen = json.loads((pytester.path / "scanned.json").read_text())
    assert seen["registered"] == seen["hooks"] and len(seen["hooks"]) >= 8
    assert "engine_config" in seen["dir"] and "current_cell" not in seen["dir"]
