"""What the installed distribution promises: entry point, typed marker, no torch on import."""

from __future__ import annotations

import importlib.metadata
import pathlib
import subprocess
import sys

import pytest_shutdown


def test_pytest11_entry_point_named_shutdown() -> None:
    eps = importlib.metadata.entry_points(group="pytest11")
    assert [ep.value for ep in eps if ep.name == "shutdown"] == ["pytest_shutdown.plugin"]


def test_py_typed_marker_ships() -> None:
    assert (pathlib.Path(pytest_shutdown.__file__).parent / "py.typed").is_file()


def test_importing_the_package_and_plugin_does_not_import_torch() -> None:
    code = (
        "import sys, pytest_shutdown, pytest_shutdown.plugin, pytest_shutdown.findings;"
        "import pytest_shutdown.devices;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False", out.stderr


def test_unknown_public_names_raise_attribute_error() -> None:
    try:
        pytest_shutdown.no_such_helper  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_helper" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
