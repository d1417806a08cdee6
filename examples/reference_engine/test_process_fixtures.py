"""The plugin's process fixtures on the bundled engine: real child processes, real signals.

``engine_manager`` and ``reference_llm`` (and ``dp_supervisor``, a three-level tree, left out
here because it takes seconds to start) start the engine as processes and
check its shutdown in their teardown: shut down twice (the second call changes nothing), the
process timeout used is the matrix cell's expected one, nothing force-killed unless the test
expects it, no engine process left. The test bodies only do their own part.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")

from pytest_shutdown import (  # noqa: E402
    ForceKillExpectation,
    ShutdownCheck,
    ShutdownTimeouts,
)
from pytest_shutdown.engine import (  # noqa: E402
    EngineProcManager,
    ReferenceLLM,
)


def test_generate_with_the_reference_llm(reference_llm: ReferenceLLM) -> None:
    outputs = reference_llm.generate(["hello", "world"], max_tokens=4)
    assert [len(out.token_ids) for out in outputs] == [4, 4]


@pytest.mark.engine(data_parallel_size=2)
def test_two_data_parallel_engine_processes(engine_manager: EngineProcManager) -> None:
    names = sorted(proc.name for proc in engine_manager.processes)
    assert names == ["EngineCore_DP0", "EngineCore_DP1"]
    assert all(proc.is_alive() for proc in engine_manager.processes)


# The engine's teardown takes 0.3 s. A zero process timeout cannot wait for it: the engine is
# force-killed, and the test says it expects that. A ROCm engine told to abort at once still
# gets its cleanup grace (2.0 s here), so it finishes and is not killed.
@pytest.mark.engine(teardown_delay_s=0.3)
@pytest.mark.shutdown_matrix(request=[0], process=[0, 3.0], platform=["cuda", "rocm"], grace=2.0)
def test_engine_shutdown_over_the_timeout_matrix(
    engine_manager: EngineProcManager,
    shutdown_timeouts: ShutdownTimeouts,
    expect_force_kill: ForceKillExpectation,
) -> None:
    expect_force_kill(shutdown_timeouts.expected_process_timeout == 0)
    assert engine_manager.call_utility("ping") == "pong"


def test_helpers_bound_to_the_test(shutdown_check: ShutdownCheck) -> None:
    # the same helpers; a finding would also reach the shutdown summary, JSON and JUnit XML
    llm = ReferenceLLM(multiprocess=False)
    shutdown_check.assert_finalizers_ok(llm)
    shutdown_check.assert_idempotent_shutdown(llm, calls=3, threads=2)
