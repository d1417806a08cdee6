from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _inner_runs_keep_their_order(request: pytest.FixtureRequest) -> None:
    """Inner pytester runs (in-process and subprocess) run without pytest-randomly: many match
    their output in order, and an outer ``-p randomly`` must not shuffle their tests. Set after
    pytester's own set-up, which clears PYTEST_ADDOPTS."""
    if "pytester" not in request.fixturenames:
        return
    request.getfixturevalue("pytester")
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly" + _ASYNCIO_SCOPE)


#: pytest-asyncio (the dev extra) warns at configure when this option is unset, and an inner run
#: whose ini turns warnings into errors would then fail before collecting anything.
_ASYNCIO_SCOPE = (
    " -o asyncio_default_fixture_loop_scope=function"
    if importlib.util.find_spec("pytest_asyncio") is not None
    else ""
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long_running(seconds): a test of about 8 s or more, and how long it takes here; the "
        "longest run first, so that xdist starts them early instead of finishing the run with "
        "one alone on a worker",
    )


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle, which it keeps otherwise
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def expected_seconds(item: pytest.Item) -> float:
        marker = item.get_closest_marker("long_running")
        return float(marker.args[0]) if marker is not None else 0.0

    items.sort(key=expected_seconds, reverse=True)  # stable: the rest keeps its order


#: mkdocs-material 9.7+ prints a banner about its end of life at every build; as ``make docs``.
DOCS_BUILD_ENV = {"NO_MKDOCS_2_WARNING": "1"}


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documentation site, built once as ``make docs`` builds it (``mkdocs build --strict``)
    into a temporary folder; the build must also print no warning."""
    reason = "comes with the 'docs' extra (make test has it)"
    pytest.importorskip("mkdocs", reason=f"mkdocs {reason}")
    pytest.importorskip("material", reason=f"mkdocs-material, the site's theme, {reason}")
    pytest.importorskip("mkdocstrings_handlers.python", reason=f"mkdocstrings-python {reason}")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, **DOCS_BUILD_ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not re.search(r"^WARNING\b", result.stderr, re.M), result.stderr[-3000:]
    return out
