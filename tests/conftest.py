from __future__ import annotations

import importlib.util

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
    options = "-p no:randomly"
    if importlib.util.find_spec("pytest_asyncio") is not None:
        # pytest-asyncio (the dev extra) warns at configure time when this is unset, and an inner
        # run under `filterwarnings = error` would stop on that warning
        options += " -o asyncio_default_fixture_loop_scope=function"
    monkeypatch.setenv("PYTEST_ADDOPTS", options)


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
