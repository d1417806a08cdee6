"""Pointing pytest-shutdown's fixtures at a project's own engine.

``engine_config`` is the plugin's fixture; overriding it here (and asking for the original by the
same name) changes it for every fixture that uses it: the plugin's ``reference_renderer`` and
``engine_core``, the ``shutdown_matrix`` cells, and this project's ``mini_engine``, which is built
from the same config so that the reference and our engine are tested with the same knobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from mini_engine import MiniEngine

from pytest_shutdown import assert_idempotent_shutdown, assert_not_force_killed

if TYPE_CHECKING:
    from pytest_shutdown import ForceKillExpectation
    from pytest_shutdown.engine import EngineConfig


@pytest.fixture
def engine_config(engine_config: EngineConfig) -> EngineConfig:
    """The plugin's config (platform, matrix cell, ``@pytest.mark.engine``), with our sizes."""
    return engine_config.replace(renderer_num_workers=3, default_process_timeout_s=5.0)


@pytest.fixture
def mini_engine(
    engine_config: EngineConfig, expect_force_kill: ForceKillExpectation
) -> Iterator[MiniEngine]:
    """Our engine; teardown checks what every test would otherwise repeat.

    ``expect_force_kill`` is the plugin's: ``@pytest.mark.expect_force_kill(reason=...)`` on a
    test, or ``expect_force_kill(condition)`` called inside it, flips the last check.
    """
    engine = MiniEngine.from_config(engine_config)
    yield engine
    outcome = engine.shutdown()  # no-op returning the outcome if the test already shut it down
    assert outcome is not None
    assert_idempotent_shutdown(engine)  # later calls and the GC path run no cleanup again
    assert_not_force_killed(outcome, expected=bool(expect_force_kill))
