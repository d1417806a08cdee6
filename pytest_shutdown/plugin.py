"""The pytest plugin (entry point ``shutdown``): ``pytest -p shutdown``.

For now it only announces itself in the header; the guard, options and fixtures come later.
Loading it must never import torch.
"""

from __future__ import annotations

import pytest

import pytest_shutdown


def pytest_report_header(config: pytest.Config) -> str:
    return f"shutdown: pytest-shutdown {pytest_shutdown.__version__}"
