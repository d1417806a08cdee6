"""The warning of warn mode, in a module of its own: importing it loads no guard."""

from __future__ import annotations

import pytest

__all__ = ["ShutdownLeakWarning"]


class ShutdownLeakWarning(pytest.PytestWarning):
    """Emitted by ``pytest -p shutdown --shutdown-guard=warn`` for each test that leaked."""
