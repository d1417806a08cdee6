"""Every name docs/api.md documents imports from the module it names, without torch when the page
says so; the examples a reader copies import only those names. The top level keeps one verb per
contract (40 names at most); the names that left it still import, with a DeprecationWarning that
names their replacement."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import pytest_shutdown

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
PUBLIC_MODULES = (
    "pytest_shutdown",
    "pytest_shutdown.engine",
    "pytest_shutdown.devices",
    "pytest_shutdown.orphans",
    "pytest_shutdown.harness",
    "pytest_shutdown.aio",
)


def test_the_api_page_documents_the_public_modules() -> None:
    assert tuple(DOCUMENTED) == PUBLIC_MODULES
    assert all(len(names) >= 3 for names in DOCUMENTED.values())


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


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_the_page_lists_exactly_what_the_module_exports(module: str) -> None:
    exported = set(importlib.import_module(module).__all__)
    assert set(DOCUMENTED[module]) == exported


# -- one verb per contract: the top level, and the names that left it ----------------------------

MAX_TOP_LEVEL_NAMES = 40
DEPRECATED = pytest_shutdown._DEPRECATED  # noqa: SLF001 - the map under test


def test_the_top_level_keeps_at_most_40_names_and_lists_only_them() -> None:
    names = pytest_shutdown.__all__
    assert len(names) <= MAX_TOP_LEVEL_NAMES, f"{len(names)} names: move plumbing to a submodule"
    assert len(set(names)) == len(names)
    assert dir(pytest_shutdown) == sorted(names)
    assert not set(DEPRECATED) & set(names)


def test_every_name_in_all_imports_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in pytest_shutdown.__all__:
            assert getattr(pytest_shutdown, name) is not None, name
        namespace: dict[str, object] = {}
        exec(f"from pytest_shutdown import {', '.join(pytest_shutdown.__all__)}", namespace)


def test_a_name_in_a_public_module_is_in_no_other() -> None:
    homes: dict[str, str] = {}
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            assert name not in homes, f"{name} is exported by {homes.get(name)} and {module}"
            homes[name] = module


@pytest.mark.parametrize(
    "module", ["pytest_shutdown.orphans", "pytest_shutdown.harness", "pytest_shutdown.aio"]
)
def test_a_harness_module_resolves_what_it_lists(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == sorted(imported._LAZY)  # noqa: SLF001
    assert dir(imported) == sorted(imported.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        imported.no_such_name  # noqa: B018


@pytest.mark.parametrize("name", sorted(DEPRECATED))
def test_a_deprecated_name_warns_with_its_replacement_and_is_the_same_object(name: str) -> None:
    home, replacement = DEPRECATED[name]
    expected = getattr(importlib.import_module(home), name)

    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(pytest_shutdown, name)

    assert value is expected
    (message,) = {str(w.message) for w in caught}
    assert f"pytest_shutdown.{name} is deprecated" in message and replacement in message
    assert caught[0].filename == __file__, "the warning points at the caller's line"
    # the replacement it names exists: a public module's name, or a helper kept at the top level
    new = replacement.split()[0]
    module, _, new_name = new.rpartition(".")
    assert module in PUBLIC_MODULES and new_name in importlib.import_module(module).__all__, new
    if new_name == name:  # moved, not replaced: the new spelling gives the very same object
        assert getattr(importlib.import_module(module), name) is expected


def test_a_deprecated_name_warns_on_a_from_import_and_each_time() -> None:
    for _ in range(2):
        namespace: dict[str, object] = {}
        with pytest.warns(DeprecationWarning, match="pytest_shutdown.orphans.TreeLauncher"):
            exec("from pytest_shutdown import TreeLauncher", namespace)
        assert namespace["TreeLauncher"] is importlib.import_module(
            "pytest_shutdown.orphans"
        ).TreeLauncher
    with pytest.raises(ImportError):
        exec("from pytest_shutdown import no_such_helper", {})


def test_the_api_page_lists_every_deprecated_name() -> None:
    text = API.read_text(encoding="utf-8")
    table = text[text.index("## Moved and deprecated names") :]
    table = table[: table.index("\n## ")]
    listed = dict(re.findall(r"^\| `(\w+)` \| `([\w.]+)`", table, re.M))
    assert set(listed) == set(DEPRECATED)
    for name, new in listed.items():
        assert new in DEPRECATED[name][1], f"docs/api.md: {name} -> {new}"


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
# api.md lists the old paths of moved modules, which resolve with a DeprecationWarning
@pytest.mark.filterwarnings("ignore:pytest_shutdown.* moved to :DeprecationWarning")
def test_every_dotted_name_a_page_mentions_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for dotted in set(re.findall(r"`(pytest_shutdown(?:\.\w+)+)[`(]", text)):
        if dotted.startswith("pytest_shutdown.engine"):
            pytest.importorskip("torch", reason="the engine's modules may need torch")
        assert dotted.split(".")[1] not in DEPRECATED, f"{page.name}: {dotted} is deprecated"
        assert _resolve(dotted) is not None, f"{page.name}: {dotted}"
