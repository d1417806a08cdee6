"""The generated parts of the docs site match the code: the API reference and the codes page.

The site is built once (``mkdocs build --strict``, as ``make docs`` does) into a temporary
folder; every public name of the public modules must have its entry on the reference page, with
every parameter of its signature, and every finding code must be on the codes page. The quick
start and the top of the README are checked for what a new user reads first.
"""

from __future__ import annotations

import enum
import html
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest
from site_nav import nav_pages

from pytest_shutdown.findings.finding import FINDING_CODES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()


def _entries(page: str) -> dict[str, str]:
    """``{anchor id: the text of its entry}`` for each top-level object of the reference page."""
    heads = list(re.finditer(r'<h2 id="([\w.]+)" class="doc doc-heading">', page))
    entries = {}
    for head, following in zip(heads, [*heads[1:], None], strict=True):
        end = following.start() if following is not None else len(page)
        text = html.unescape(re.sub(r"<[^>]+>", "", page[head.start() : end]))
        entries[head.group(1)] = text
    return entries


def _parameters(value: object) -> list[str]:
    """The parameter names of a public callable's signature (a class: its constructor)."""
    if not (inspect.isroutine(value) or inspect.isclass(value)):
        return []  # a constant or a type alias (Literal[...]): no signature
    if inspect.isclass(value):
        if issubclass(value, enum.Enum) or getattr(value, "_is_protocol", False):
            return []  # the members / the methods are the interface, not a constructor
        owner = next(c for c in value.__mro__ if "__init__" in vars(c) or "__new__" in vars(c))
        if not owner.__module__.startswith("pytest_shutdown"):
            return []  # a constructor inherited from the language (tuple, Exception, Warning)
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


PUBLIC = [
    (module, name, path)
    for module in hooks.PUBLIC_MODULES
    for name, path in hooks.defining_paths(module)
]


def test_the_docs_site_builds_in_strict_mode(docs_site: Path) -> None:
    """``make docs`` without make: broken links or pages missing from the nav fail the build
    (``--strict``, no warning: the ``docs_site`` fixture asserts both)."""
    assert (docs_site / "api" / "index.html").is_file()


def test_the_reference_covers_every_public_module_and_name() -> None:
    top = importlib.import_module("pytest_shutdown")
    listed = {name for module, name, _ in PUBLIC if module == "pytest_shutdown"}
    assert listed == set(top.__all__) - hooks.NOT_RENDERED
    assert "NotCalledError" in listed and "NothingCountedError" in listed
    assert {m for m, _, _ in PUBLIC} == set(hooks.PUBLIC_MODULES)


@pytest.mark.parametrize(("module", "name", "path"), PUBLIC, ids=[f"{m}.{n}" for m, n, _ in PUBLIC])
def test_every_public_name_and_parameter_is_on_the_site(
    docs_site: Path, module: str, name: str, path: str
) -> None:
    page = (docs_site / "reference" / "index.html").read_text(encoding="utf-8")
    entries = _entries(page)
    assert path in entries, f"{module}.{name} ({path}) has no entry on the API reference page"
    text = entries[path]
    # the heading names the public import path (the first module that exports the object)
    assert re.search(rf"pytest_shutdown[\w.]*\.{name}\b", text)
    try:
        value = getattr(importlib.import_module(module), name)
    except ImportError as exc:  # a name that needs torch, without torch
        pytest.skip(f"{module}.{name} does not import here: {exc}")
    missing = [p for p in _parameters(value) if not re.search(rf"\b{re.escape(p)}\b", text)]
    assert not missing, f"{module}.{name}: parameters {missing} are not on the site"


def test_every_finding_code_is_on_the_codes_page(docs_site: Path) -> None:
    text = html.unescape((docs_site / "codes" / "index.html").read_text(encoding="utf-8"))
    rows = dict(re.findall(r"<td><code>([a-z-]+)</code></td>\s*<td>(.*?)</td>", text, re.S))
    for code, meaning in FINDING_CODES.items():
        assert code in rows, f"{code} is missing from the codes page"
        assert rows[code].strip() == meaning


def test_a_code_added_to_finding_codes_is_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(FINDING_CODES, "made-up-leak", "a | made-up meaning")  # type: ignore[index]
    table = hooks.codes_markdown()
    assert "| `made-up-leak` | a \\| made-up meaning |" in table.splitlines()
    assert all(f"| `{code}` |" in table for code in FINDING_CODES)


def test_the_generated_pages_hold_their_markers() -> None:
    assert hooks.CODES_MARKER in (DOCS / "codes.md").read_text(encoding="utf-8")
    assert hooks.REFERENCE_MARKER in (DOCS / "reference.md").read_text(encoding="utf-8")
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "scripts/docs_hooks.py" in config and "mkdocstrings" in config


# -- what a new user reads first ------------------------------------------------------------------


def test_the_quick_start_is_short_second_and_self_contained() -> None:
    page = DOCS / "quickstart.md"
    text = page.read_text(encoding="utf-8")
    assert page.stat().st_size <= 8 * 1024
    nav = nav_pages(ROOT / "mkdocs.yml")
    assert nav[1] == "quickstart.md"
    visible = re.sub(r"<!-- quote: .*? -->", "", text)
    assert "examples/" not in visible, "the quick start must not send the reader to examples/"
    for needed in (
        "pip install",
        "pytest -p shutdown",
        "conftest.py",
        "assert_idempotent_shutdown",
        "assert_finalizers_ok",
        "assert_nonblocking_shutdown",
        "assert_timeout_decoupling",
        "guard",
        "orphan_matrix",
        "[pytest-shutdown] phase: ready",
    ):
        assert needed in visible, needed


def test_the_readme_starts_with_the_users_path() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    head = "\n".join(lines[:40])
    assert "pip install" in head and "pytest -p shutdown" in head
    first_make = min(i for i, line in enumerate(lines) if re.search(r"make (demo|test)", line))
    first_pip = min(i for i, line in enumerate(lines) if "pip install" in line)
    assert first_pip < first_make, "the user's path comes before the contributors' commands"
    # how long it takes depends on the machine: make test prints it, the README states none
    assert re.search(r"make test .*prints its elapsed time", "\n".join(lines))


# -- the hand-written signatures of helpers.md --------------------------------------------------

SIGNATURE = re.compile(r"\*\*`(\w+)\((.*?)\)`\*\*", re.S)


def _split_top_level(arguments: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in arguments:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p.strip() for p in [*parts, current] if p.strip()]


HELPER_SIGNATURES = SIGNATURE.findall((DOCS / "helpers.md").read_text(encoding="utf-8"))


def test_helpers_md_shows_signatures() -> None:
    assert len(HELPER_SIGNATURES) >= 15


@pytest.mark.parametrize(
    ("name", "arguments"), HELPER_SIGNATURES, ids=[n for n, _ in HELPER_SIGNATURES]
)
def test_each_signature_in_helpers_md_is_the_codes(name: str, arguments: str) -> None:
    shown = [
        part.split("=")[0].strip().lstrip("*")
        for part in _split_top_level(arguments)
        if part.strip() != "*"
    ]
    # from the public module that exports it (harness plumbing is shown beside the helpers)
    (home,) = [m for m in hooks.PUBLIC_MODULES if name in importlib.import_module(m).__all__]
    value = getattr(importlib.import_module(home), name)
    assert shown == _parameters(value), f"docs/helpers.md shows {name}({arguments})"


def test_sphinx_roles_in_docstrings_render_as_code(docs_site: Path) -> None:
    page = (docs_site / "reference" / "index.html").read_text(encoding="utf-8")
    assert not re.search(r":(class|func|data|mod|meth):", page)
    assert "<code>ShutdownContractError</code>" in page
