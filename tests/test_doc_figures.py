"""The figures and lists of README.md and docs/*.md come from one place.

A list the code registers (the guard's resource kinds, the ``allow_leaks`` keywords, the finding
codes) is compared with the registry; a count of the examples (the cells of the reference
engine's orphan matrix) is computed from the example; what varies from run to run or machine to
machine (the suite's size, how long a run takes) is stated nowhere: ``make test`` prints its own
elapsed time, and the benchmarks print theirs (docs/benchmarks.md, tests/test_benchmarks.py).
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
from doc_pages import DOCS, FENCE, PAGES, README, ROOT

from pytest_shutdown import FINDING_CODES
from pytest_shutdown.resources import allow_keys, kind_names

#: Its figures are printed by the benchmark each row names (tests/test_benchmarks.py).
PRINTED_BY_SCRIPTS = DOCS / "benchmarks.md"

#: What a page must not state about a run: the suite's counts and how long a run took.
RUN_FIGURES = {
    "a count of tests": r"\b\d[\d,]* (tests|passed|failed|xfailed|skipped|collected)\b",
    "a progress count": r"\[ *\d+/\d+\]",
    "a time in minutes": r"\b(\d[\d.]*|a|half a) ?(min|minutes?)\b",
    "a time on this machine": r"\bon (the shared |a )?(2|two)[- ]cores?\b",
}


def prose(page: Path) -> str:
    """The page without its code blocks and inline code (sample outputs, not statements)."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return re.sub(r"`[^`\n]*`", "", text)


def row(page: Path, starts: str) -> str:
    (line,) = [
        line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith(starts)
    ]
    return line


def table_after(page: Path, heading: str) -> list[str]:
    """The rows of the first table after ``heading``, header and rule left out."""
    text = page.read_text(encoding="utf-8")
    rows = []
    for line in text[text.index(heading) :].splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return rows[2:]


@pytest.mark.parametrize(
    "page", [p for p in PAGES if p != PRINTED_BY_SCRIPTS], ids=lambda p: p.name
)
def test_no_page_states_the_suites_size_or_a_run_time(page: Path) -> None:
    text = prose(page)
    found = [
        f"{what}: {match.group(0)!r}"
        for what, pattern in RUN_FIGURES.items()
        for match in re.finditer(pattern, text)
    ]
    assert not found, f"{page.relative_to(ROOT)} states {found}: compute it in a test or drop it"


def test_the_run_figures_are_recognised() -> None:
    """The patterns above catch the figures they were written against (README of 0.2.0)."""
    for stated in (
        "the demo (134 tests)",
        "make test prints a count ([ 512/1318])",
        "about 5.5 min on 2 cores",
        "in about a minute",
        "127 passed, 13 xfailed",
    ):
        assert any(re.search(p, stated) for p in RUN_FIGURES.values()), stated
    defaults = "after the 2 s grace, 15 s by default, 60 s a cell"
    assert not any(re.search(p, defaults) for p in RUN_FIGURES.values())


def test_the_guards_kinds_table_lists_every_registered_kind() -> None:
    table = table_after(DOCS / "plugin.md", "## What the guard checks")
    listed = [re.findall(r"^\| `([\w-]+)` \|", line) for line in table]
    assert sorted(name for names in listed for name in names) == sorted(kind_names())


def test_the_resources_option_names_every_kind_in_order() -> None:
    meaning = row(DOCS / "plugin.md", "| `--shutdown-resources=").split(" | ")[-1]
    assert re.findall(r"`([\w-]+)`", meaning) == list(kind_names())


def test_the_allow_leaks_row_names_every_keyword_in_order() -> None:
    signature = row(DOCS / "fixtures.md", "| `allow_leaks(").split("`")[1]
    assert re.findall(r"(\w+)=False", signature) == list(allow_keys())


def test_the_readme_names_no_finding_code_the_code_does_not_have() -> None:
    table = table_after(README, "## The bugs it catches")
    named = {code for line in table for code in re.findall(r"`([a-z]+(?:-[a-z]+)+)`", line)}
    assert named and named <= set(FINDING_CODES), named - set(FINDING_CODES)


def matrix_cells(path: Path, test: str) -> int:
    """How many cells the ``orphan_matrix`` marker of ``test`` in ``path`` parametrizes."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == test:
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith(
                    "orphan_matrix"
                ):
                    return math.prod(len(ast.literal_eval(k.value)) for k in decorator.keywords)
    raise AssertionError(f"{path.name} has no {test} marked orphan_matrix")


@pytest.mark.parametrize("page", [README, DOCS / "orphans.md"], ids=lambda p: p.name)
def test_the_reference_engines_cell_count_is_its_matrix(page: Path) -> None:
    cells = matrix_cells(
        ROOT / "examples" / "orphans" / "test_reference_engine.py",
        "test_the_reference_tree_dies_whole",
    )
    stated = [int(n) for n in re.findall(r"\b(\d+) cells\b", prose(page))]
    assert stated and set(stated) == {cells}, f"{page.name} states {stated}, the matrix has {cells}"
