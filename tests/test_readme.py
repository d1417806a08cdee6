"""The samples, tables and links of README.md and docs/*.md stay true.

* Every ``python`` sample but the quick start's (which tests/test_quickstart.py runs as it is) is
  quoted from a file under ``examples/`` (which ``make demo`` runs): the
  ``<!-- quote: PATH::NAME[,NAME...] -->`` line above it names the top-level definitions it
  shows, and the sample must equal their source exactly (decorators included, one blank line
  between them). ``scripts/sync-doc-quotes`` rewrites them after an example changes.
* The ini sample configures the guard as the docs say.
* The tables list every option, ini key, marker and fixture the plugin registers, and nothing
  else; every ``--shutdown-*`` option mentioned exists; every finding code is in both tables.
* The README stays short and its links reach existing files; the docs site builds in strict mode.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from doc_pages import DOCS, PAGES, README, ROOT, Block, blocks
from inner_runs import LEAKY_FINALIZER
from site_nav import nav_pages

from pytest_shutdown import FINDING_CODES

QUOTE = re.compile(r"<!-- quote: (\S+?)::(\S+) -->\n\Z")
CHECK = re.compile(r"<!-- check: (\w+) -->\n\Z")
#: Its python blocks are the files of a project, run as they are by tests/test_quickstart.py.
QUICK_START = "docs/quickstart.md"


def definition_source(path: Path, name: str) -> str:
    """The source of a top-level def/class/assignment ``name`` in ``path``, decorators included."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        if name in names:
            decorators = getattr(node, "decorator_list", [])
            start = min([node.lineno, *(d.lineno for d in decorators)])
            assert node.end_lineno is not None
            return "\n".join(lines[start - 1 : node.end_lineno])
    raise AssertionError(f"{path.relative_to(ROOT)} has no top-level definition {name!r}")


PYTHON_BLOCKS = [b for b in blocks() if b.lang == "python" and b.page != QUICK_START]


def test_the_readme_and_docs_have_python_samples() -> None:
    assert len(PYTHON_BLOCKS) >= 10  # one per helper at least; guards the parsing below
    assert any(b.page == "README.md" for b in PYTHON_BLOCKS)
    assert any(b.page == "docs/helpers.md" for b in PYTHON_BLOCKS)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.where for b in PYTHON_BLOCKS])
def test_each_python_sample_is_quoted_exactly_from_an_example(block: Block) -> None:
    quote = QUOTE.search(block.before)
    assert quote, f"{block.where}: a python sample needs a '<!-- quote: PATH::NAME -->' line above"
    path = ROOT / quote.group(1)
    assert path.is_file(), f"{block.where}: {quote.group(1)} does not exist"
    assert path.relative_to(ROOT).parts[0] == "examples", f"{block.where}: quote from examples/"
    expected = "\n\n".join(definition_source(path, n) for n in quote.group(2).split(","))
    assert block.code.rstrip("\n") == expected, (
        f"{block.where} differs from {quote.group(1)}: run scripts/sync-doc-quotes"
    )


def test_the_ini_sample_configures_the_guard(pytester: pytest.Pytester) -> None:
    (ini,) = [b for b in blocks() if (m := CHECK.search(b.before)) and m.group(1) == "ini"]
    pytester.makefile(".toml", pyproject=ini.code)
    pytester.makepyfile("def test_ok():\n    pass\n")

    result = pytester.runpytest()

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["shutdown: pytest-shutdown *, guard warn (grace 5 s, budget 60 s)"]
    )


# -- tables ---------------------------------------------------------------------------------------


def section(title: str, page: Path = README) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start : end if end != -1 else len(text)]


def first_cells(table_text: str, cells: int = 1) -> set[str]:
    """The backticked names at the start of each table row's first ``cells`` cells."""
    names: set[str] = set()
    for row in table_text.splitlines():
        if not row.startswith("|") or row.startswith("|---"):
            continue
        for cell in row.strip("|").split(" | ")[:cells]:
            match = re.match(r"\s*`([^`=(\s]+)", cell)
            if match:
                names.add(match.group(1))
    return names


@pytest.fixture(scope="module")
def registered(pytestconfig: pytest.Config) -> dict[str, set[str]]:
    """What the plugin registers, read from this very session's plugin."""
    from pytest_shutdown import plugin
    from pytest_shutdown.plugin import fixtures

    parser = pytestconfig._parser  # noqa: SLF001 - the only place options are listed
    group = parser.getgroup("shutdown")
    options = {name for opt in group.options for name in opt.names() if name.startswith("--")}
    ini = {name for name in parser._inidict if name.startswith("shutdown_")}  # noqa: SLF001
    markers = {line.split("(")[0].split(":")[0] for line in (*plugin.MARKERS, *fixtures.MARKERS)}
    defined = {
        name
        for name, value in vars(fixtures).items()
        if type(value).__name__ == "FixtureFunctionDefinition"
        or hasattr(value, "_pytestfixturefunction")
    }
    return {"options": options, "ini": ini, "markers": markers, "fixtures": defined}


def test_every_option_and_ini_key_is_in_the_table(registered: dict[str, set[str]]) -> None:
    table = first_cells(section("## Options and ini keys", DOCS / "plugin.md"), cells=2)
    assert registered["options"] and registered["ini"]
    assert {n for n in table if n.startswith("--")} == registered["options"]
    assert {n for n in table if not n.startswith("--")} == registered["ini"]


def test_every_marker_is_in_the_table(registered: dict[str, set[str]]) -> None:
    assert first_cells(section("## Markers", DOCS / "fixtures.md")) == registered["markers"]


def test_every_fixture_is_in_the_table(registered: dict[str, set[str]]) -> None:
    assert len(registered["fixtures"]) >= 6
    assert first_cells(section("## Fixtures", DOCS / "fixtures.md")) == registered["fixtures"]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_option_a_page_mentions_exists(registered: dict[str, set[str]], page: Path) -> None:
    mentioned = set(re.findall(r"--shutdown-[a-z-]+[a-z]", page.read_text(encoding="utf-8")))
    assert mentioned <= registered["options"], mentioned - registered["options"]


def test_every_finding_code_is_explained() -> None:
    bugs = first_cells(section("## The bugs it catches"))
    # docs/codes.md is generated from FINDING_CODES at build time (scripts/docs_hooks.py);
    # tests/test_docs_generated.py checks the built page
    generated = (DOCS / "codes.md").read_text(encoding="utf-8")
    assert "<!-- generated: finding codes -->" in generated
    for code in FINDING_CODES:
        assert code in bugs or f"`{code}`" in section("## The bugs it catches"), code


# -- the README is the short path in; the docs are a site --------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_stays_short() -> None:
    assert README.stat().st_size < 12 * 1024, "move reference material into docs/"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_reaches_a_file(page: Path) -> None:
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_every_docs_page_is_in_the_site_nav() -> None:
    nav = nav_pages(ROOT / "mkdocs.yml")
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md"))


# -- the status-line hooks of examples/conftest.py, which the tour shows --------------------------

XFAIL_SUITE = (
    LEAKY_FINALIZER
    + """
@pytest.mark.xfail(strict=True, raises=ShutdownContractError)
def test_buggy():
    assert_finalizes_on_gc(Leaky, timeout=0.2)

def test_failing():
    assert_finalizes_on_gc(Leaky, timeout=0.2)

def test_plain_failure():
    assert False
"""
)


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
def test_the_examples_conftest_puts_finding_codes_on_the_status_line(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    conftest = (ROOT / "examples" / "conftest.py").read_text(encoding="utf-8")
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_suite=XFAIL_SUITE)
    args = ["-v", "-p", "no:cacheprovider"] + (["-n", "2"] if xdist else [])

    result = pytester.runpytest_subprocess(*args)

    result.assert_outcomes(xfailed=1, failed=2)
    lines = result.stdout.lines

    def status_of(test: str) -> list[str]:  # xdist puts the word before the id, -v after it
        return [
            line for line in lines if f"::{test}" in line and ("XFAIL" in line or "FAIL" in line)
        ]

    assert any("XFAIL [finalizer-bound-method]" in line for line in status_of("test_buggy"))
    assert any("FAILED [finalizer-bound-method]" in line for line in status_of("test_failing"))
    plain = status_of("test_plain_failure")
    assert plain and all("FAILED [" not in line for line in plain)  # no finding, no codes
