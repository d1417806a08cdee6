"""What the installed distribution promises: entry point, typed marker, no torch on import, and
a wheel that builds offline and loads as the plugin."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys
import zipfile

import pytest
from inner_runs import fresh_python

import pytest_shutdown


def test_pytest11_entry_point_named_shutdown() -> None:
    eps = importlib.metadata.entry_points(group="pytest11")
    assert [ep.value for ep in eps if ep.name == "shutdown"] == ["pytest_shutdown.plugin"]


def test_py_typed_marker_ships() -> None:
    assert (pathlib.Path(pytest_shutdown.__file__).parent / "py.typed").is_file()


def test_importing_the_package_and_plugin_does_not_import_torch() -> None:
    code = (
        "import sys, pytest_shutdown, pytest_shutdown.plugin, pytest_shutdown.findings.finding;"
        "import pytest_shutdown.devices;"
        "print('torch' in sys.modules)"
    )
    assert fresh_python(code).strip() == "False"


def test_unknown_public_names_raise_attribute_error() -> None:
    try:
        pytest_shutdown.no_such_helper  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_helper" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


LOAD_FROM_TARGET = """
import importlib.metadata, pathlib, sys
target = pathlib.Path(sys.argv[1])
sys.path.insert(0, str(target))
(dist,) = importlib.metadata.distributions(path=[str(target)])
(ep,) = [ep for ep in dist.entry_points if ep.group == "pytest11"]
plugin = ep.load()
print(dist.version, ep.name, ep.value, pathlib.Path(plugin.__file__).is_relative_to(target))
"""


def test_the_wheel_builds_and_its_pytest_entry_point_loads(tmp_path: pathlib.Path) -> None:
    """What a user gets from ``pip install ./pytest-shutdown`` or a git URL: the built wheel."""
    pytest.importorskip("hatchling", reason="the offline wheel build needs hatchling (extra 'dev')")
    root = pathlib.Path(__file__).resolve().parent.parent
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]

    subprocess.run(
        [*pip, "wheel", str(root), "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("pytest_shutdown-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "pytest_shutdown/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "examples/"))]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    out = subprocess.run(
        [sys.executable, "-c", LOAD_FROM_TARGET, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    assert out.stdout.split() == [
        pytest_shutdown.__version__,
        "shutdown",
        "pytest_shutdown.plugin",
        "True",
    ]
