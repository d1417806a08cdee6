"""What a release uploads: ``python -m build`` makes an sdist and a wheel offline, ``twine check``
passes on both, the wheel is the plugin (typed, with its pytest entry point) and the sdist
carries no junk from a working tree.

The build runs on a copy of the checkout's files (tracked, and untracked but not ignored) with
junk planted beside them, as a developer's tree has it: a venv, a built site, bytecode, a report.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What a working tree holds that no distribution may carry (all of it git-ignored).
JUNK = (
    ".venv/lib/python3.11/site-packages/junk.py",
    "site/index.html",
    "pytest_shutdown/__pycache__/plugin.cpython-311.pyc",
    "shutdown-report.json",
)
JUNK_PART = re.compile(r"(^|/)(\.venv[^/]*|site|__pycache__|\.pytest_cache|\.mypy_cache)/|\.pyc$")


def _version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^version = "([^"]+)"$', text, re.M)
    assert found is not None
    return found.group(1)


def _checkout_copy(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip(f"the release build copies a git checkout; {ROOT} is not one")
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is still listed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    for name in JUNK:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text("junk\n")
    return target


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"sdist": path, "wheel": path}``, built offline from a copy of the checkout."""
    for module in ("build", "twine", "hatchling"):
        pytest.importorskip(module, reason=f"the release build needs {module} (extra 'dev')")
    source = _checkout_copy(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    name = f"pytest_shutdown-{_version()}"
    assert sorted(p.name for p in out.iterdir()) == [f"{name}-py3-none-any.whl", f"{name}.tar.gz"]
    return {"sdist": out / f"{name}.tar.gz", "wheel": out / f"{name}-py3-none-any.whl"}


def test_twine_check_passes_on_the_sdist_and_the_wheel(dist: dict[str, Path]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.values())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout


def test_the_wheel_is_the_typed_plugin(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = wheel.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_text = wheel.read(entry_points).decode()
    assert "pytest_shutdown/py.typed" in names
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], "no LICENSE"
    assert "pytest_shutdown/plugin/__init__.py" in names
    assert re.search(r"^\[pytest11\]\nshutdown = pytest_shutdown\.plugin$", entry_text, re.M)
    assert not [n for n in names if not n.startswith("pytest_shutdown")]  # no tests/, examples/


def test_the_sdist_has_the_sources_and_no_junk(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as sdist:
        names = [n.split("/", 1)[1] for n in sdist.getnames() if "/" in n]
    for needed in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "pytest_shutdown/py.typed",
        "tests/conftest.py",
    ):
        assert needed in names
    assert not [n for n in names if JUNK_PART.search(n) or n in JUNK], "junk in the sdist"
