"""fork and the fork server: refused where a child could not work, safe where it is allowed.

Every engine started with ``fork`` here runs in a fresh interpreter, so what earlier tests did
in this process (CPU torch work, a fork server) cannot decide the outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.start import engine_context, forkserver_preload
from pytest_shutdown.gpu import forking
from pytest_shutdown.gpu.forking import ForkRefusedError, check_fork_allowed, fork_refusal

#: A fork-started engine after in-process CPU torch work (an OpenMP pool exists in the parent).
FORK_AFTER_TORCH = r"""
import json, sys, time
import torch
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCore
from pytest_shutdown.engine.llm import ReferenceLLM

if sys.argv[1] == "torch-work-first":
    torch.randn(256, 256) @ torch.randn(256, 256)  # starts the OpenMP pool
    core = EngineCore(EngineConfig(platform="cpu"))
    core.add_request("warm", [1, 2], 3)
    while core.has_work():
        core.step()
    core.shutdown()
config = EngineConfig(platform="cpu", start_method="fork", startup_timeout_s=60,
                      rocm_process_grace_s=1.5, child_exit_grace_s=0.5)
with ReferenceLLM(config) as llm:
    tokens = llm.generate("start", max_tokens=3)[0].token_ids
print(json.dumps({"tokens": tokens, "exitcodes": llm.manager.last_outcome.exitcodes,
                  "threads_here": torch.get_num_threads()}))
"""


def run_fresh(code: str, *args: str, cwd: Path | None = None, timeout: float = 120) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("before", ["nothing-first", "torch-work-first"])
def test_a_forked_engine_serves_and_shuts_down_in_a_fresh_interpreter(before: str) -> None:
    # Before the fix, "torch-work-first" hung in the child's first parallel op until the
    # startup deadline: the child inherits the OpenMP pool's bookkeeping, not its threads.
    result = run_fresh(FORK_AFTER_TORCH, before)
    assert len(result["tokens"]) == 3
    assert result["exitcodes"] == {"EngineCore_DP0": 0}
    assert result["threads_here"] >= 1, "the parent keeps its own thread count"


def test_a_forked_engine_process_runs_torch_with_one_thread(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(set_num_threads=calls.append))
    assert forking.reset_after_fork("forkserver") is False and calls == []
    assert forking.reset_after_fork("spawn") is False and calls == []
    assert forking.reset_after_fork("fork") is True and calls == [1]


def fake_torch(*, initialized: bool = False, bad_fork: bool = False, cuda: str | None = "12.4"):
    return SimpleNamespace(
        version=SimpleNamespace(cuda=cuda, hip=None),
        cuda=SimpleNamespace(is_initialized=lambda: initialized, _is_in_bad_fork=lambda: bad_fork),
    )


@pytest.mark.parametrize(
    ("platform", "device", "torch", "reason"),
    [("cuda", "cuda", fake_torch(initialized=True), "CUDA is initialised in this process"),
     ("cpu", "cpu", fake_torch(initialized=True), "CUDA is initialised in this process"),
     ("rocm", "cuda", fake_torch(), "ROCm GPU"),
     ("cuda", "cuda", fake_torch(bad_fork=True), "registered its CUDA fork hook"),
     ("cuda", "cuda", fake_torch(), None),
     ("rocm", "cpu", fake_torch(), None),  # a forced ROCm policy on the CPU forks fine
     ("cuda", "cpu", fake_torch(bad_fork=True), None),  # a CPU engine never touches CUDA
     ("cpu", "cpu", None, None)],
    ids=["cuda-initialised", "initialised-cpu-engine", "rocm-gpu", "poisoned", "clean-cuda",
         "rocm-policy-on-cpu", "poisoned-but-cpu-engine", "no-torch"],
)
def test_fork_refusal(monkeypatch, platform, device, torch, reason) -> None:
    monkeypatch.setitem(sys.modules, "torch", torch)
    refusal = fork_refusal(platform, device)
    if reason is None:
        assert refusal is None
    else:
        assert refusal is not None and reason in refusal


def test_the_fork_hook_is_read_in_a_real_forked_child(monkeypatch) -> None:
    # The fake's answer is only visible to a child that really runs it after os.fork().
    parent = os.getpid()
    torch = fake_torch()
    torch.cuda._is_in_bad_fork = lambda: os.getpid() != parent
    assert forking.fork_poisoned(torch) is True
    torch.cuda._is_in_bad_fork = lambda: False
    assert forking.fork_poisoned(torch) is False
    assert forking.fork_poisoned(fake_torch(cuda=None, bad_fork=True)) is False, "CPU build"


def test_a_refused_fork_names_the_option_and_what_to_use(monkeypatch) -> None:
    monkeypatch.setattr(forking, "cuda_initialized", lambda torch=None: True)
    with pytest.raises(ForkRefusedError, match="start_method='fork' refused: CUDA is init.*"
                                               "'forkserver' \\(the default\\) or 'spawn'"):
        check_fork_allowed("fork", "cuda", "cuda")
    check_fork_allowed("forkserver", "cuda", "cuda")
    check_fork_allowed("spawn", "rocm", "cuda")


def test_the_engine_refuses_fork_before_starting_any_process(monkeypatch) -> None:
    from pytest_shutdown.engine.processes import EngineProcManager

    monkeypatch.setattr(forking, "cuda_initialized", lambda torch=None: True)
    config = EngineConfig(platform="cpu", start_method="fork")
    with pytest.raises(ForkRefusedError, match="CUDA is initialised"):
        engine_context(config)
    with pytest.raises(ForkRefusedError):
        EngineProcManager(config)


# -- the fork server and the main script (item 2) ---------------------------------------------
def test_only_pytests_own_main_script_is_preloaded() -> None:
    main = SimpleNamespace(__file__="/venv/bin/pytest")
    assert forkserver_preload(main)[0] == "__main__"
    assert "__main__" not in forkserver_preload(SimpleNamespace(__file__="/work/serve.py"))
    assert forkserver_preload(SimpleNamespace())[0] == "__main__", "no file: nothing to import"
    assert "torch" in forkserver_preload(SimpleNamespace(__file__="/work/serve.py"))


MAIN_SCRIPT = r"""
import json, os, sys
# Module level, as in a user's script: runs wherever this file is imported.
with open(sys.argv[1], "a") as seen:
    seen.write(f"{os.getpid()}\n")

if __name__ == "__main__":
    from multiprocessing import forkserver
    from pytest_shutdown.engine.config import EngineConfig
    from pytest_shutdown.engine.llm import ReferenceLLM

    config = EngineConfig(platform="cpu", start_method="forkserver", startup_timeout_s=60)
    with ReferenceLLM(config) as llm:
        tokens = llm.generate("x", max_tokens=2)[0].token_ids
        engine = llm.manager.processes[0].pid
    server = forkserver._forkserver._forkserver_pid
    print(json.dumps({"tokens": tokens, "server": server, "engine": engine}))
"""


def test_a_main_script_never_runs_in_the_fork_server(tmp_path: Path) -> None:
    # Whatever the script does at module level (torch.cuda.is_available(), a tensor on the
    # GPU) it does in the parent and in each engine process, never in the shared fork server.
    script = tmp_path / "serve.py"
    script.write_text(MAIN_SCRIPT)
    seen = tmp_path / "seen.txt"
    done = subprocess.run([sys.executable, str(script), str(seen)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ran_in = {int(line) for line in seen.read_text().split()}
    assert len(result["tokens"]) == 2
    assert result["server"] not in ran_in
    assert done.returncode == 0 and result["engine"] in ran_in, "imported again in the engine"
