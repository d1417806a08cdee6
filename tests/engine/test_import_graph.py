"""The engine package imports downward only: no circles, and no import hidden in a function.

Read from the sources with ``ast`` (nothing is imported): every ``import`` of a module of
``pytest_shutdown.engine`` by another one is an edge, wherever it stands (module level, inside a
function, under ``TYPE_CHECKING``). The package's ``__init__`` is a lazy facade for users; the
modules themselves import each other directly, never through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "pytest_shutdown" / "engine"
PACKAGE = "pytest_shutdown.engine"


def engine_modules(root: Path = ENGINE) -> dict[str, Path]:
    """``{module name: path}`` of every module of the package but its ``__init__``."""
    return {f"{PACKAGE}.{p.stem}": p for p in sorted(root.glob("*.py")) if p.stem != "__init__"}


class _Imports(ast.NodeVisitor):
    """Collects ``(imported module, line, inside a function)`` for engine modules."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules
        self.found: list[tuple[str, int, bool]] = []
        self._depth = 0

    def _enter_function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = _enter_function  # noqa: N815
    visit_AsyncFunctionDef = _enter_function  # noqa: N815
    visit_Lambda = _enter_function  # noqa: N815

    def visit_Import(self, node: ast.Import) -> None:  # noqa: N802
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # noqa: N802
        if node.level:  # relative: resolve against the package
            base = PACKAGE if node.level == 1 else PACKAGE.rsplit(".", node.level - 1)[0]
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        if module == PACKAGE:
            for alias in node.names:
                self._add(f"{PACKAGE}.{alias.name}", node.lineno)
        else:
            self._add(module, node.lineno)

    def _add(self, module: str, line: int) -> None:
        if module == PACKAGE or module.startswith(PACKAGE + "."):
            self.found.append((module, line, self._depth > 0))


def import_graph(
    root: Path = ENGINE,
) -> tuple[dict[str, set[str]], list[str]]:
    """The engine's import graph, and the problems found while reading it (as sentences)."""
    modules = engine_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    problems: list[str] = []
    for name, path in modules.items():
        visitor = _Imports(set(modules))
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        for target, line, in_function in visitor.found:
            where = f"{path.name}:{line}"
            if target not in modules:
                problems.append(
                    f"{where} imports {target}: import the module that defines the name, "
                    "not the package facade"
                )
                continue
            if in_function:
                problems.append(f"{where} imports {target} inside a function")
            graph[name].add(target)
    return graph, problems


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_engine_package_has_no_import_circle() -> None:
    graph, _ = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import circle in the engine: " + " -> ".join(cycle or [])


def test_no_engine_module_imports_another_inside_a_function_or_through_the_facade() -> None:
    _, problems = import_graph()
    assert problems == []


def test_the_modules_that_every_level_shares_sit_at_the_bottom() -> None:
    """The shared types import nothing of the engine but the config at most."""
    graph, _ = import_graph()
    for shared in ("faults", "lifecycle", "stopping", "config", "timeouts"):
        assert graph[f"{PACKAGE}.{shared}"] <= {f"{PACKAGE}.config"}, shared


@pytest.mark.parametrize(
    ("sources", "cycle"),
    [
        ({"a": "import pytest_shutdown.engine.b\n", "b": "x = 1\n"}, None),
        (
            {
                "a": "from pytest_shutdown.engine.b import x\n",
                "b": "def f():\n    from pytest_shutdown.engine import a\n",
            },
            ["a", "b", "a"],
        ),
        (
            {
                "a": "from pytest_shutdown.engine import b\n",
                "b": "from .c import y\n",
                "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from pytest_shutdown.engine.a import z\n",
            },
            ["a", "b", "c", "a"],
        ),
    ],
)
def test_the_check_finds_circles_through_any_kind_of_import(
    tmp_path: Path, sources: dict[str, str], cycle: list[str] | None
) -> None:
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_text(text)
    graph, _ = import_graph(tmp_path)
    expected = None if cycle is None else [f"{PACKAGE}.{n}" for n in cycle]
    assert find_cycle(graph) == expected


def test_the_check_names_imports_inside_functions_and_through_the_facade(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "def f():\n    from pytest_shutdown.engine.b import x\n"
        "from pytest_shutdown.engine import EngineCore\n"
    )
    (tmp_path / "b.py").write_text("x = 1\n")
    _, problems = import_graph(tmp_path)
    assert problems == [
        "a.py:2 imports pytest_shutdown.engine.b inside a function",
        "a.py:3 imports pytest_shutdown.engine.EngineCore: import the module that defines the "
        "name, not the package facade",
    ]
