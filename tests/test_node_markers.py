"""The names of a node's markers, as the guard and the fixtures read them."""

from __future__ import annotations

import pytest

from pytest_shutdown.node_markers import marker_names

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
