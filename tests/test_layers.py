"""Folders are layers (DESIGN §9, issue 47): the package's imports point down only.

Every module of the package is parsed with :mod:`ast`; every ``import`` and ``from ... import``
statement counts, at module level and inside functions and classes alike (a function-level,
lazy import is a dependency all the same: it runs, only later). Imports under
``if TYPE_CHECKING:`` do **not** count: they never run, so they make no circle at run time, and
they name types for annotations only (``gpu.placement`` annotates with ``engine.config``'s
``EngineConfig``, ``plugin.pending`` with ``plugin.report``'s records). Imports by name in data
(``importlib.import_module`` of a registry's strings: the kinds of ``resources``, the lazy
re-exports of the public modules) are not statements and are not seen here.

A module's layer is its folder's (:data:`FOLDERS`: ``_base/``, ``findings/``, ``_os/``,
``ownership/``, ``resources/``, ``helpers/``, ``gpu/``, ``engine/``, ``plugin/``), or, for a
module at the package root, its entry in :data:`TOP_LEVEL`: a new root module must be placed
there, or this test fails. The layers, lowest first::

    base        utilities of no concern (``_base``: the hidden contextmanager, the moved-modules
                finder, the gc freeze count at import) and the speed machinery (``_fast``:
                moments, held-open files, cheap readings, the marks pass, lazy dataclasses and
                re-exports, node markers)
    findings    Finding, ShutdownContractError, the text of findings, the warning
    _os         /proc, the tree killer, prctl, forks, held-open files, one moment's readings
    ownership   whose is it: creation sites, the owner search, atexit records, gc back-references
    resources   the resource kinds and the primitives they share (snapshot, walk, leak findings)
    gpu         platform detection and device readers                  (beside, over _os)
    engine      the reference engine                                   (beside, over gpu)
    helpers     the assertion helpers and their harness (the public orphans and harness modules)
    plugin      the pytest plugin: guard, settings, report, fixtures, markers, the public face

A layer imports its own layer and the layers :data:`ALLOWED` lists for it; nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_shutdown

PACKAGE = Path(pytest_shutdown.__file__).resolve().parent
NAME = "pytest_shutdown"

#: The layer of each sub-package (a folder is a layer).
FOLDERS: dict[str, str] = {
    "_base": "base",
    "_fast": "base",
    "findings": "findings",
    "_os": "_os",
    "ownership": "ownership",
    "resources": "resources",
    "helpers": "helpers",
    "checks": "helpers",  # 0.2.0's path of helpers/, deprecated: an import alias only
    "gpu": "gpu",
    "engine": "engine",
    "plugin": "plugin",
}

#: The layer of each module at the package root ("__init__" is the package itself): the public
#: modules (devices, harness, aio, orphans) and the package, whose lazy names reach every layer.
TOP_LEVEL: dict[str, str] = {
    "__init__": "plugin",
    "devices": "gpu",
    "harness": "helpers",
    "aio": "helpers",
    "orphans": "helpers",
}

#: What each layer may import besides itself.
ALLOWED: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "findings": frozenset({"base"}),
    "_os": frozenset({"base", "findings"}),
    "ownership": frozenset({"base", "findings", "_os"}),
    "resources": frozenset({"base", "findings", "_os", "ownership"}),
    "gpu": frozenset({"base", "findings", "_os"}),
    "engine": frozenset({"base", "findings", "_os", "gpu"}),
    "helpers": frozenset({"base", "findings", "_os", "ownership", "resources", "gpu"}),
    "plugin": frozenset(
        {"base", "findings", "_os", "ownership", "resources", "gpu", "engine", "helpers"}
    ),
}

#: Imports that break the rules, tolerated until they move; each is named here, never silently:
#: (importing module, imported module). None today: the last, ownership's read of the package's
#: gc freeze count at import, now reads it from ``_base.frozen_at_import`` (issue 47).
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return TOP_LEVEL["__init__"]
    if parts[1] in FOLDERS:
        return FOLDERS[parts[1]]
    return TOP_LEVEL[parts[1]]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str) -> str:
    """The package's module an import names: the longest known prefix."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str) -> list[tuple[int, str]]:
    """(line, imported module of the package) for every import that runs, lazy ones included."""
    path = MODULES[module]
    is_package = path.name == "__init__.py"
    found: set[tuple[int, str]] = set()

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        # ``from pkg import sub`` names the module ``pkg.sub`` when there is one.
        return [
            f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
            for alias in node.names
        ]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit_one(stmt)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in targets(node):
                if target == NAME or target.startswith(NAME + "."):
                    found.add((node.lineno, _resolve(target)))
        else:
            visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return sorted(found)


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}"


def test_every_root_module_is_placed_in_a_layer() -> None:
    root = {m.split(".")[1] if "." in m else "__init__" for m in MODULES}
    unplaced = sorted(root - set(FOLDERS) - set(TOP_LEVEL))
    assert not unplaced, f"root modules without a layer in TOP_LEVEL: {unplaced}"
    gone = sorted(set(TOP_LEVEL) - root)
    assert not gone, f"TOP_LEVEL names modules that are gone: {gone}"
    assert set(FOLDERS.values()) | set(TOP_LEVEL.values()) <= set(ALLOWED)


def test_the_allowed_directions_form_no_circle() -> None:
    order: list[str] = []
    pending = dict(ALLOWED)
    while pending:
        ready = [layer for layer, below in pending.items() if below <= set(order)]
        assert ready, f"the allowed directions form a circle among {sorted(pending)}"
        order.extend(sorted(ready))
        for layer in ready:
            del pending[layer]


def test_imports_point_down_only() -> None:
    wrong: list[str] = []
    tolerated: set[tuple[str, str]] = set()
    for module in MODULES:
        source = layer_of(module)
        for line, target in imports_of(module):
            to = layer_of(target)
            if to == source or to in ALLOWED[source]:
                continue
            if (module, target) in KNOWN_VIOLATIONS:
                tolerated.add((module, target))
                continue
            wrong.append(f"{_where(module, line)}: {source} -> {to} ({module} imports {target})")
    assert not wrong, "imports that do not point down:\n" + "\n".join(wrong)
    stale = sorted(KNOWN_VIOLATIONS - tolerated)
    assert not stale, f"KNOWN_VIOLATIONS lists imports that are gone: {stale}"


def test_no_circle_between_layers() -> None:
    edges: dict[str, set[str]] = {layer: set() for layer in ALLOWED}
    for module in MODULES:
        for _line, target in imports_of(module):
            if (module, target) in KNOWN_VIOLATIONS:
                continue
            if layer_of(target) != layer_of(module):
                edges[layer_of(module)].add(layer_of(target))
    seen: set[str] = set()

    def walk(layer: str, path: list[str]) -> None:
        if layer in path:
            pytest.fail("import circle between layers: " + " -> ".join([*path, layer]))
        if layer in seen:
            return
        for below in sorted(edges[layer]):
            walk(below, [*path, layer])
        seen.add(layer)

    for layer in sorted(edges):
        walk(layer, [])


def test_no_circle_between_modules() -> None:
    """No module reaches itself through imports that run (lazy ones included)."""
    graph = {m: {t for _line, t in imports_of(m) if t != m} for m in MODULES}
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            circle = path[path.index(module) :] + [module]
            pytest.fail("import circle: " + " -> ".join(circle))
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            walk(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        walk(module, [])


def test_lazy_and_type_checking_imports_are_told_apart() -> None:
    """The parser itself: a function-level import counts, a TYPE_CHECKING one does not."""
    # pending imports report and resources.base under TYPE_CHECKING only; placement, engine.config.
    pending = {t for _line, t in imports_of("pytest_shutdown.plugin.pending")}
    assert "pytest_shutdown.plugin.report" not in pending
    placement = {t for _line, t in imports_of("pytest_shutdown.gpu.placement")}
    assert "pytest_shutdown.engine.config" not in placement
    lazy = [
        (m, line)
        for m in MODULES
        for line, _t in imports_of(m)
        if MODULES[m].read_text(encoding="utf-8").splitlines()[line - 1].startswith(" ")
    ]
    assert lazy, "no function-level import found: the parser misses lazy imports"
