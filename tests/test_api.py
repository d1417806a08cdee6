"""Every name docs/api.md documents imports from the module it names, without torch when the page
says so; the examples a reader copies import only those names."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api.md"

#: Imported inside a child process in which any import of torch fails.
BLOCK_TORCH = """
import importlib, json, sys

class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked here (imported as {name!r})")
        return None

sys.meta_path.insert(0, BlockTorch())
failed = {}
for module, name in json.loads(sys.argv[1]):
    try:
        getattr(importlib.import_module(module), name)
    except Exception as exc:  # report every failure, not only the first
        failed[f"{module}.{name}"] = repr(exc)
print(json.dumps({"failed": failed, "torch": "torch" in sys.modules}))
"""


def documented() -> dict[str, dict[str, bool]]:
    """``{module: {name: needs_torch}}`` from the tables of docs/api.md."""
    modules: dict[str, dict[str, bool]] = {}
    current: dict[str, bool] | None = None
    for line in API.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"^## `([\w.]+)`$", line)
        if heading:
            current = modules.setdefault(heading.group(1), {})
            continue
        if line.startswith("## "):
            current = None
        row = re.match(r"^\| `(\w+)` \| (yes|no) \|", line)
        if row and current is not None:
            current[row.group(1)] = row.group(2) == "yes"
    return modules


DOCUMENTED = documented()
PUBLIC_MODULES = ("pytest_shutdown", "pytest_shutdown.engine", "pytest_shutdown.devices")


def test_the_api_page_documents_the_public_modules() -> None:
    assert tuple(DOCUMENTED) == PUBLIC_MODULES
    assert all(len(names) >= 5 for names in DOCUMENTED.values())


def test_names_without_torch_import_with_torch_blocked() -> None:
    wanted = [(m, n) for m, names in DOCUMENTED.items() for n, torch in names.items() if not torch]

    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, json.dumps(wanted)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )

    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out == {"failed": {}, "torch": False}


def test_the_torch_blocker_does_block_torch() -> None:
    """The check above would prove nothing if torch slipped past the blocker."""
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, json.dumps([["pytest_shutdown.engine", "EngineCore"]])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    failed = json.loads(result.stdout)["failed"]
    assert "torch is blocked here" in failed["pytest_shutdown.engine.EngineCore"]


def test_names_that_need_torch_import_with_torch() -> None:
    pytest.importorskip("torch", reason="these names need torch (extra 'engine')")
    for module, names in DOCUMENTED.items():
        imported = importlib.import_module(module)
        for name, needs_torch in names.items():
            if needs_torch:
                assert getattr(imported, name) is not None, f"{module}.{name}"


@pytest.mark.parametrize("module", ["pytest_shutdown", "pytest_shutdown.engine"])
def test_the_page_lists_exactly_what_the_module_exports(module: str) -> None:
    exported = set(importlib.import_module(module).__all__)
    assert set(DOCUMENTED[module]) == exported


def _imports_from_the_package(path: Path) -> list[tuple[str, str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_shutdown"):
            found += [(str(node.module), alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (alias.name, "", node.lineno)
                for alias in node.names
                if alias.name.startswith("pytest_shutdown")
            ]
    return found


EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_examples_import_only_documented_names(path: Path) -> None:
    for module, name, line in _imports_from_the_package(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        assert module in DOCUMENTED, f"{where}: {module} is not a public module (docs/api.md)"
        assert name in DOCUMENTED[module], f"{where}: {module}.{name} is not in docs/api.md"


def _resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted``, then look the rest up as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(dotted)


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_dotted_name_a_page_mentions_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for dotted in set(re.findall(r"`(pytest_shutdown(?:\.\w+)+)[`(]", text)):
        if dotted.startswith("pytest_shutdown.engine"):
            pytest.importorskip("torch", reason="the engine's modules may need torch")
        assert _resolve(dotted) is not None, f"{page.name}: {dotted}"
