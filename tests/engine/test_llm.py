"""EngineProcManager and ReferenceLLM with real engine processes."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import weakref
from pathlib import Path

import pytest
from engine_proc_testing import (
    GRACE_S,
    assert_gone,
    descendants,
    events,
    fast_config,
    wait_for,
)

from pytest_shutdown.engine.core import FinishReason
from pytest_shutdown.engine.core_proc import ChildFaults
from pytest_shutdown.engine.llm import ReferenceLLM
from pytest_shutdown.engine.processes import EngineProcManager, EngineStartupError

PROMPTS = ["Hello, world", "shutdown is where the bugs live", "é"]


def pids_of(manager: EngineProcManager) -> list[int]:
    return [p.pid for p in manager.processes if p.pid is not None]


# -- ReferenceLLM ----------------------------------------------------------------------------------
def test_generate_gives_one_output_per_prompt_the_same_in_and_out_of_process() -> None:
    config = fast_config(data_parallel_size=2)
    with ReferenceLLM(config) as multi, ReferenceLLM(config, multiprocess=False) as single:
        outs = multi.generate(PROMPTS, max_tokens=8)
        reference = single.generate(PROMPTS, max_tokens=8)

    assert [o.prompt for o in outs] == PROMPTS
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    for out in outs:
        assert len(out.token_ids) == 8 and out.finish_reason is FinishReason.LENGTH
        assert out.prompt_token_ids == list(out.prompt.encode())
        assert out.text == bytes(out.token_ids).decode("utf-8", errors="replace")
    assert len({o.request_id for o in outs}) == len(PROMPTS)


def test_llm_shutdown_is_idempotent_and_passes_its_timeout_through() -> None:
    llm = ReferenceLLM(fast_config(platform="rocm", shutdown_timeout=0.0))
    assert llm.manager is not None
    pids = pids_of(llm.manager)

    llm.shutdown(timeout=0)
    first = llm.manager.last_outcome
    llm.shutdown(timeout=0)

    assert first is not None and llm.manager.last_outcome is first
    assert first.timeout == GRACE_S  # 0/0 on ROCm: the cleanup grace reached the manager
    assert first.force_killed == [] and first.exitcodes == {"EngineCore_DP0": 0}
    assert llm.is_shut_down and llm.renderer.is_shut_down
    assert_gone(pids)
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate("too late")


def _dropped_llm() -> tuple[weakref.ref[ReferenceLLM], list[int]]:
    llm = ReferenceLLM(fast_config())
    assert llm.generate("hi", max_tokens=2)[0].token_ids
    assert llm.manager is not None
    return weakref.ref(llm), pids_of(llm.manager)


def test_a_dropped_llm_is_collected_and_its_engine_processes_reaped() -> None:
    ref, pids = _dropped_llm()
    gc.collect()
    assert ref() is None, "something still holds the ReferenceLLM"
    assert_gone(pids, what="engine processes of the dropped ReferenceLLM")


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "0"])
def test_llm_rejects_a_bad_timeout_and_bad_max_tokens(bad: object) -> None:
    with ReferenceLLM(fast_config(), multiprocess=False) as llm:
        with pytest.raises(ValueError, match="timeout"):
            llm.shutdown(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_tokens"):
            llm.generate("x", max_tokens=0)


# -- EngineProcManager -----------------------------------------------------------------------------
def test_manager_shutdown_is_idempotent() -> None:
    manager = EngineProcManager(fast_config(data_parallel_size=2))
    pids = pids_of(manager)
    assert [p.name for p in manager.processes] == ["EngineCore_DP0", "EngineCore_DP1"]

    first = manager.shutdown()
    second = manager.shutdown()

    assert first is not None and second is first and manager.last_outcome is first
    assert first.exitcodes == {"EngineCore_DP0": 0, "EngineCore_DP1": 0}
    assert manager.manager_stopped.is_set() and manager.is_shut_down
    assert_gone(pids)
    with pytest.raises(RuntimeError, match="shut down"):
        manager.add_request("late", [1])


def _dropped_manager() -> tuple[weakref.ref[EngineProcManager], list[int]]:
    manager = EngineProcManager(fast_config(data_parallel_size=2))
    assert manager.call_utility("ping", rank=1) == "pong"
    return weakref.ref(manager), pids_of(manager)


def test_a_dropped_manager_is_collected_and_its_finalizer_reaps_the_processes() -> None:
    ref, pids = _dropped_manager()
    gc.collect()
    assert ref() is None, "something (the monitor thread?) still holds the manager"
    assert_gone(pids, what="engine processes of the dropped manager")


def test_a_process_that_dies_while_running_is_reported_and_the_others_shut_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="pytest_shutdown.engine")
    manager = EngineProcManager(fast_config(data_parallel_size=2))
    try:
        victim, other = manager.processes
        assert victim.pid is not None and other.pid is not None
        os.kill(victim.pid, signal.SIGKILL)

        wait_for(lambda: manager.failures, 5, "the failure to be reported")
        assert_gone([other.pid], what="the surviving engine process")
        wait_for(lambda: manager.is_shut_down, 5, "the manager to shut itself down")
    finally:
        manager.shutdown(0)

    failure = manager.failures[0]
    assert (failure.name, failure.exitcode) == ("EngineCore_DP0", -signal.SIGKILL)
    assert any("EngineCore_DP0" in r.getMessage() for r in caplog.records)


def test_a_failed_start_reaps_the_started_processes_and_raises_the_original_error(
    tmp_path: Path,
) -> None:
    log = str(tmp_path / "life.jsonl")
    faults = ChildFaults(fail_startup_ranks=(1,))
    earlier = {p.pid for p in descendants()}  # a session's launcher, say: not this start's
    with pytest.raises(EngineStartupError, match="(?s)EngineCore_DP1 failed to start.*injected"):
        EngineProcManager(fast_config(data_parallel_size=2), lifecycle_log=log, faults=faults)

    started = events(log, "started")
    assert 1 in [e["dp_rank"] for e in started]  # DP0 may be reaped before it logs its start
    assert_gone([e["pid"] for e in started], what="engine processes of the failed start")
    wait_for(
        lambda: not [p for p in descendants() if p.pid not in earlier],
        GRACE_S,
        "every engine process of the failed start to go",
    )


def test_a_start_slower_than_startup_timeout_raises_a_timeout_naming_the_setting(
    tmp_path: Path,
) -> None:
    log = str(tmp_path / "life.jsonl")
    config = fast_config(startup_timeout_s=0.3, default_process_timeout_s=0.5)
    with pytest.raises(TimeoutError, match="startup_timeout_s=0.3"):
        EngineProcManager(config, lifecycle_log=log, faults=ChildFaults(startup_delay_s=5.0))

    assert_gone([e["pid"] for e in events(log, "started")], what="the slow engine process")


def test_the_manager_is_shut_down_only_once_its_shutdown_has_finished() -> None:
    # The monitor shuts the manager down in its own thread after an engine dies: a caller that
    # sees is_shut_down must find the processes gone and the rings unlinked, not half of it.
    manager = EngineProcManager(fast_config(teardown_delay_s=1.0))
    done = threading.Event()
    stopper = threading.Thread(target=lambda: (manager.shutdown(), done.set()))
    stopper.start()
    try:
        wait_for(manager.manager_stopped.is_set, 5, "the shutdown to begin")
        assert not manager.is_shut_down  # the engine is still in its 1 s teardown
        assert done.wait(30)
        assert manager.is_shut_down
    finally:
        stopper.join(30)


def test_manager_rejects_a_bad_shutdown_timeout() -> None:
    manager = EngineProcManager(fast_config())
    try:
        with pytest.raises(ValueError, match="timeout"):
            manager.shutdown(-1)
        assert not manager.is_shut_down
    finally:
        manager.shutdown()


EXITING_SCRIPT = """
import sys
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.llm import ReferenceLLM

if __name__ == "__main__":
    llm = ReferenceLLM(EngineConfig(platform="cpu", data_parallel_size=2))
    print(" ".join(str(p.pid) for p in llm.manager.processes), flush=True)
    sys.exit(0)  # no shutdown(): the atexit run of the finalizers must reap the engines
"""


def test_an_interpreter_exiting_without_shutdown_reaps_its_engine_processes(
    tmp_path: Path,
) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    script = tmp_path / "exiting.py"
    script.write_text(EXITING_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=90
    )

    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    assert_gone(pids, what="engine processes of the exited interpreter")


# "fork" runs in a fresh interpreter (tests/gpu/test_forking.py): what earlier tests did in this
# process must not decide whether a forked engine works.
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_every_start_method_serves_and_shuts_down_cleanly(start_method: str) -> None:
    config = fast_config(start_method=start_method)
    with ReferenceLLM(config) as llm:
        assert llm.manager is not None
        pids = pids_of(llm.manager)
        out = llm.generate("start", max_tokens=3)[0]
    assert len(out.token_ids) == 3
    assert llm.manager.last_outcome is not None
    assert llm.manager.last_outcome.exitcodes == {"EngineCore_DP0": 0}
    assert_gone(pids)


def test_a_failed_engine_start_releases_the_renderer_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pytest_shutdown.engine.llm as llm_module  # noqa: PLC0415

    renderers = []
    real = llm_module.ReferenceRenderer

    def recording(config):  # type: ignore[no-untyped-def]
        renderers.append(real(config))
        return renderers[-1]

    monkeypatch.setattr(llm_module, "ReferenceRenderer", recording)
    # An engine that sleeps through its start cannot be ready within 0.2 s.
    monkeypatch.setattr(
        llm_module, "EngineProcManager",
        lambda c: EngineProcManager(c, faults=ChildFaults(startup_delay_s=2.0)),
    )
    with pytest.raises(TimeoutError, match="startup_timeout_s"):
        ReferenceLLM(fast_config(startup_timeout_s=0.2, default_process_timeout_s=0.5))

    assert renderers and renderers[0].is_shut_down
