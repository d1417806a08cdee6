"""Backref pictures: ``assert_finalizes_on_gc(graphs_dir=...)`` and ``--shutdown-graphs=DIR``.

Both sides are tested: with graphviz's ``dot`` (a PNG; skipped where graphviz is not installed)
and without it (PATH hidden: the ``.dot`` source and a note).
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inner_runs import LEAKY_FINALIZER

from pytest_shutdown import ShutdownContractError, assert_finalizes_on_gc
from pytest_shutdown.ownership.backrefs import GRAPHS, configure_graphs

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None,
    reason="graphviz's 'dot' is not installed (apt-get install graphviz): PNG side untested",
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: Module-level list that keeps ``Held`` objects alive: a not-collected finding.
KEEP: list[object] = []


class BoundFinalizer:
    """Review bug 1: the finalizer is a bound method of its own object."""

    def __init__(self) -> None:
        self._finalizer: weakref.finalize[Any, Any] = weakref.finalize(self, self.shutdown)

    def shutdown(self) -> None:
        pass


class Held:
    """Kept alive by a module global."""

    def __init__(self) -> None:
        KEEP.append(self)

    def shutdown(self) -> None:
        KEEP.remove(self)


@pytest.fixture
def no_dot_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert shutil.which("dot") is None


@pytest.fixture(autouse=True)
def graphs_reset() -> Iterator[None]:
    before = (GRAPHS.directory, GRAPHS.prefix, list(GRAPHS.listeners))
    yield
    GRAPHS.directory, GRAPHS.prefix = before[0], before[1]
    GRAPHS.listeners[:] = before[2]


def finding_of(factory: Any, **kwargs: Any) -> Any:
    with pytest.raises(ShutdownContractError) as caught:
        assert_finalizes_on_gc(factory, timeout=0.2, **kwargs)
    (finding,) = caught.value.findings
    return finding


# -- the helper, without pytest's plugin ----------------------------------------------------------


@needs_dot
def test_a_finalizer_finding_gets_a_png_drawn_while_the_object_lived(tmp_path: Path) -> None:
    finding = finding_of(BoundFinalizer, graphs_dir=tmp_path)

    assert finding.code == "finalizer-bound-method"
    graph = finding.details["graph"]
    assert graph["note"] is None
    png = Path(graph["png"])
    assert png.parent == tmp_path and png.read_bytes().startswith(PNG_MAGIC)
    source = Path(graph["dot"]).read_text()
    # the picture shows the object itself and the bound method that holds it
    assert "BoundFinalizer" in source and "shutdown (bound)" in source


@needs_dot
def test_a_not_collected_finding_gets_a_png_naming_the_holder(tmp_path: Path) -> None:
    finding = finding_of(Held, graphs_dir=tmp_path)

    assert finding.code == "not-collected"
    assert Path(finding.details["graph"]["png"]).read_bytes().startswith(PNG_MAGIC)
    assert "KEEP" in Path(finding.details["graph"]["dot"]).read_text()
    assert KEEP == []  # the helper shut the leaked object down after drawing it


@pytest.mark.usefixtures("no_dot_on_path")
def test_without_dot_the_source_is_written_with_a_note(tmp_path: Path) -> None:
    finding = finding_of(BoundFinalizer, graphs_dir=tmp_path / "new" / "folder")

    graph = finding.details["graph"]
    assert graph["png"] is None
    assert "'dot' is not on PATH" in graph["note"] and "graphviz" in graph["note"]
    source = Path(graph["dot"])
    assert source.parent == tmp_path / "new" / "folder"
    assert source.read_text().startswith("digraph")
    assert list(source.parent.glob("*.png")) == []


def test_an_unwritable_folder_is_a_note_not_a_lost_finding(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")

    finding = finding_of(BoundFinalizer, graphs_dir=afile / "graphs")

    assert finding.code == "finalizer-bound-method"
    assert finding.details["graph"]["png"] is None
    assert "no picture written to" in finding.details["graph"]["note"]


def test_no_picture_unless_asked(tmp_path: Path) -> None:
    configure_graphs(None)
    finding = finding_of(BoundFinalizer)
    assert "graph" not in finding.details


@pytest.mark.usefixtures("no_dot_on_path")
def test_the_module_level_setting_is_used_when_no_argument_is_given(tmp_path: Path) -> None:
    drawn: list[Any] = []
    configure_graphs(tmp_path, prefix="my-test")
    GRAPHS.listeners.append(drawn.append)

    finding = finding_of(Held)

    assert Path(finding.details["graph"]["dot"]).name.startswith("my-test-not-collected-Held-")
    assert [g.dot for g in drawn] == [finding.details["graph"]["dot"]]


# -- the plugin: --shutdown-graphs=DIR ------------------------------------------------------------

LEAKY_TEST = (
    LEAKY_FINALIZER
    + """
def test_leaky():
    with pytest.raises(ShutdownContractError) as caught:
        assert_finalizes_on_gc(Leaky, timeout=0.2)
    print("GRAPH", caught.value.findings[0].details["graph"])

class Clean:
    pass

def test_clean():
    assert_finalizes_on_gc(Clean)
"""
)


@needs_dot
def test_plugin_option_draws_pngs_and_the_summary_names_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY_TEST)
    result = pytester.runpytest("-p", "shutdown", "--shutdown-graphs=pictures", "-s")

    result.assert_outcomes(passed=2)
    pngs = sorted((pytester.path / "pictures").glob("*.png"))
    assert len(pngs) == 1 and "test_leaky" in pngs[0].name
    result.stdout.fnmatch_lines(["*= shutdown graphs =*", f"test_leaky.py::test_leaky: {pngs[0]}"])
    assert GRAPHS.directory is None or GRAPHS.directory != pytester.path / "pictures"


@pytest.mark.usefixtures("no_dot_on_path")
def test_plugin_option_without_dot_names_the_source_and_says_why(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_leaky=LEAKY_TEST)
    result = pytester.runpytest("-p", "shutdown", "--shutdown-graphs", "pictures")

    result.assert_outcomes(passed=2)
    (source,) = (pytester.path / "pictures").glob("*.dot")
    result.stdout.fnmatch_lines(
        [
            "*= shutdown graphs =*",
            f"test_leaky.py::test_leaky: {source}",
            "  note: graphviz's 'dot' is not on PATH*",
        ]
    )


def test_plugin_option_without_findings_says_nothing_was_drawn(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("--shutdown-graphs=pictures")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= shutdown graphs =*", "no backref pictures drawn*"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "*--shutdown-graphs: expected a folder path, got ''*"),
        ("afile.txt", "*--shutdown-graphs: 'afile.txt' exists and is not a folder*"),
    ],
    ids=["empty", "a-file"],
)
def test_plugin_option_bad_value_is_a_usage_error(
    pytester: pytest.Pytester, value: str, message: str
) -> None:
    pytester.makefile(".txt", afile="x")
    result = pytester.runpytest(f"--shutdown-graphs={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.usefixtures("no_dot_on_path")
def test_plugin_option_under_xdist_merges_the_workers_pictures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_leaky=LEAKY_TEST, test_leaky_too=LEAKY_TEST)
    result = pytester.runpytest_subprocess(
        "-p", "shutdown", "-n", "2", "--shutdown-graphs=pictures", "-p", "no:cacheprovider"
    )

    result.assert_outcomes(passed=4)
    sources = sorted((pytester.path / "pictures").glob("*.dot"))
    assert [s.name.split("-")[0] for s in sources] == ["test_leaky.py", "test_leaky_too.py"]
    result.stdout.fnmatch_lines_random(
        [f"test_leaky.py::test_leaky: {sources[0]}", f"test_leaky_too.py::test_leaky: {sources[1]}"]
    )
