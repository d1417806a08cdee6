from __future__ import annotations

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
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:randomly")
