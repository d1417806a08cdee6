"""Every figure docs/benchmarks.md shows comes from a benchmark ``benchmarks/run.py`` lists.

The benchmarks are not run here (they take an hour); their listing is read from run.py's source,
without importing it: every script of ``benchmarks/`` is a benchmark run.py lists, a part of
one, or a module they share; every row of the page's table of latest figures names the
``run.py --only NAME`` that produced it, and every benchmark has a row.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PAGE = ROOT / "docs" / "benchmarks.md"


def _run_py_value(name: str) -> object:
    """The literal assigned to ``name`` at the top level of benchmarks/run.py."""
    for node in ast.parse((BENCH / "run.py").read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return ast.literal_eval(node.value)
    raise AssertionError(f"benchmarks/run.py assigns no {name}")


BENCHMARKS: dict[str, tuple[tuple[str, ...], str]] = _run_py_value("BENCHMARKS")  # type: ignore[assignment]
PARTS: dict[str, str] = _run_py_value("PARTS")  # type: ignore[assignment]
SHARED: tuple[str, ...] = _run_py_value("SHARED")  # type: ignore[assignment]


def _latest_figures_rows() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("\n## Latest figures\n")
    end = text.find("\n## ", start + 1)
    rows = []
    for line in text[start : end if end != -1 else len(text)].splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows[1:]  # the header's row first


def test_every_benchmark_script_is_listed_a_part_or_shared() -> None:
    known = {script for (script, *_), _ in BENCHMARKS.values()} | set(PARTS) | set(SHARED)
    assert all((BENCH / script).is_file() for script in known)
    assert set(PARTS.values()) <= set(BENCHMARKS)
    scripts = {path.name for path in BENCH.glob("*.py")}
    assert scripts == known, scripts ^ known


def test_every_latest_figure_names_the_benchmark_that_produced_it() -> None:
    rows = _latest_figures_rows()
    assert len(rows) >= len(BENCHMARKS)
    named: set[str] = set()
    for row in rows:
        assert len(row) == 5, f"figure | target | value | date | produced by: {row}"
        found = re.findall(r"`run\.py --only ([\w-]+)`", row[4])
        assert found, f"{row[0]}: name the `run.py --only NAME` that produced it"
        assert set(found) <= set(BENCHMARKS), f"{row[0]}: {found} not in benchmarks/run.py"
        assert re.match(r"20\d\d-\d\d-\d\d", row[3]), f"{row[0]}: a date (YYYY-MM-DD ...)"
        named.update(found)
    assert named == set(BENCHMARKS), set(BENCHMARKS) - named


# -- benchmarks/suite.py labels its run with the -n that make test really passes ---------------


@pytest.fixture
def suite(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # suite.py imports its sibling figures.py
    spec = importlib.util.spec_from_file_location("bench_suite", BENCH / "suite.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suite_benchmark_names_the_makefiles_workers(
    suite: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_WORKERS", raising=False)
    default = re.search(r"^TEST_WORKERS \?= (\d+)$", (ROOT / "Makefile").read_text(), re.M)
    assert default is not None, "the Makefile sets a TEST_WORKERS default"
    assert suite.make_test_workers(ROOT) == default.group(1)
    (tmp_path / "Makefile").write_text("TEST_WORKERS ?= 5\n")
    assert suite.make_test_workers(tmp_path) == "5"
    monkeypatch.setenv("TEST_WORKERS", "2")  # as `TEST_WORKERS=2 make test` would pass it on
    assert suite.make_test_workers(tmp_path) == "2"
