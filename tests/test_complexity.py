"""The package's parts stay small enough to hold in one's head (issue 47): no function or method
with a cyclomatic complexity over :data:`MAX_COMPLEXITY` (radon's measure, as ``radon cc``
prints it) and no class over :data:`MAX_CLASS_LINES` lines, in every module of
``pytest_shutdown``. Also run by ``make lint``.

What is over a limit today and being split is listed in :data:`ALLOWED`, each entry with its
figure; an entry that is no longer needed fails too, so the list only ever shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Function

import pytest_shutdown

PACKAGE = Path(pytest_shutdown.__file__).parent
#: Above this radon counts a function as "complex" (rank E and worse).
MAX_COMPLEXITY = 25
#: ``end_lineno - lineno + 1`` of the ``class`` statement (decorators not counted).
MAX_CLASS_LINES = 400

#: (module path relative to the package's parent, function or class name) -> why it may be over
#: its limit for now. ONLY what another change is splitting right now belongs here; remove the
#: entry with that change (this test fails while an entry is no longer needed).
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> list[tuple[str, str]]:
    """(path as ``pytest_shutdown/...``, source) of every module of the package."""
    root = PACKAGE.parent
    return [
        (path.relative_to(root).as_posix(), path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _over_limits() -> dict[tuple[str, str], str]:
    """Every function over :data:`MAX_COMPLEXITY` and class over :data:`MAX_CLASS_LINES`:
    (module, name) -> what is over, with its figure."""
    found: dict[tuple[str, str], str] = {}
    for module, source in _modules():
        for block in cc_visit(source):  # functions, methods (flattened) and classes
            if isinstance(block, Function) and block.complexity > MAX_COMPLEXITY:
                found[(module, block.fullname)] = f"complexity {block.complexity}"
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    found[(module, node.name)] = f"class size {lines} lines"
    return found


def test_no_function_too_complex_and_no_class_too_long() -> None:
    over = _over_limits()
    offenders = [
        f"{module}: {name}: {what} (limit: complexity {MAX_COMPLEXITY}, "
        f"{MAX_CLASS_LINES} lines a class)"
        for (module, name), what in sorted(over.items())
        if (module, name) not in ALLOWED or not what.startswith(ALLOWED[(module, name)])
    ]
    assert not offenders, "split into parts a reader can hold:\n" + "\n".join(offenders)


def test_every_allowance_is_still_needed() -> None:
    over = _over_limits()
    stale = [
        f"{module}: {name} ({what}) is within its limit now: remove it from ALLOWED"
        for (module, name), what in sorted(ALLOWED.items())
        if not over.get((module, name), "").startswith(what)
    ]
    assert not stale, "\n".join(stale)


def test_the_measure_sees_what_it_limits() -> None:
    """The figures are real: a made-up function one branch over the limit measures so, a long
    class is long, and the subpackages' modules are read (a change of radon's API or of the walk
    must not make the check pass by seeing nothing)."""
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(MAX_COMPLEXITY))
    function = f"def busy(x):\n{branches}\n    return -1\n"
    (block,) = cc_visit(function)
    assert block.complexity == MAX_COMPLEXITY + 1
    body = "\n".join(f"    a{i} = {i}" for i in range(MAX_CLASS_LINES))
    (node,) = ast.parse(f"class Long:\n{body}\n").body
    assert isinstance(node, ast.ClassDef)
    assert node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    modules = {module for module, _source in _modules()}
    assert {"pytest_shutdown/ownership/owners.py", "pytest_shutdown/engine/core_proc.py"} <= modules
