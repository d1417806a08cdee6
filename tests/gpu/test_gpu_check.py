"""scripts/gpu-check fails loudly: its decisions, with fake GPU tools on PATH."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check"
STEPS = ROOT / "scripts" / "gpu_check_steps.py"
spec = importlib.util.spec_from_file_location("gpu_check_steps", STEPS)
assert spec is not None and spec.loader is not None
steps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(steps)


def fake_tool(folder: Path, name: str, output: str, status: int = 0) -> None:
    tool = folder / name
    tool.write_text(f"#!/bin/sh\necho '{output}'\nexit {status}\n")
    tool.chmod(0o755)


def gpu_check(tmp_path: Path, *, tools: dict[str, tuple[str, int]], python: str = sys.executable,
              args: list[str] | None = None) -> tuple[int, str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, (output, status) in tools.items():
        fake_tool(bin_dir, name, output, status)
    logs = tmp_path / "logs"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": python,
           "GPU_CHECK_KFD": str(tmp_path / "no-kfd")}
    done = subprocess.run(["bash", str(SCRIPT), *(args if args is not None else [str(logs)])],
                          capture_output=True, text=True, timeout=300, env=env)
    return done.returncode, done.stdout + done.stderr, logs


NO_GPU_TOOLS = {"nvidia-smi": ("NVIDIA-SMI has failed", 9), "rocm-smi": ("no devices", 2)}


@pytest.mark.parametrize(
    ("tool", "output", "hardware"),
    [("nvidia-smi", "GPU 0: NVIDIA H200 (UUID: GPU-8932f937-d72c)", "cuda"),
     ("rocm-smi", "GPU[0] : Device ID: 0x74a1", "rocm")],
)
def test_gpu_hardware_with_torch_on_the_cpu_fails_loudly(tmp_path, tool, output, hardware) -> None:
    tools = {**NO_GPU_TOOLS, tool: (output, 0)}
    status, out, logs = gpu_check(tmp_path, tools=tools)
    assert status == 3, out
    assert f"GPU hardware is present ({hardware}) but torch runs on the CPU" in out
    assert "torch runs on the CPU" in (logs / "summary.txt").read_text()
    assert (logs / "detect.log").exists()


def test_imports_that_fail_fail_loudly(tmp_path) -> None:
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n")
    broken.chmod(0o755)
    status, out, logs = gpu_check(tmp_path, tools=NO_GPU_TOOLS, python=str(broken))
    assert status == 2, out
    assert "cannot import torch / pytest_shutdown / xdist" in out
    assert "No module named torch" in (logs / "summary.txt").read_text()


def test_without_gpu_hardware_there_is_nothing_to_check(tmp_path) -> None:
    status, out, _ = gpu_check(tmp_path, tools=NO_GPU_TOOLS)
    assert status == 0, out
    assert "no GPU hardware on this machine: nothing to check" in out


def test_the_log_folder_is_required(tmp_path) -> None:
    status, out, _ = gpu_check(tmp_path, tools=NO_GPU_TOOLS, args=[])
    assert status == 64 and "usage: scripts/gpu-check LOGDIR" in out


@pytest.mark.parametrize(
    ("hardware", "platform", "ok", "says"),
    [("cuda", "cpu", False, "torch runs on the CPU"), ("rocm", "cpu", False, "USE_SYSTEM_TORCH"),
     ("cuda", "rocm", False, "is a rocm build"), ("cuda", "cuda", True, "torch runs on cuda"),
     ("none", "cpu", True, "nothing to check")],
)
def test_platform_verdict(hardware, platform, ok, says) -> None:
    verdict, why = steps.platform_verdict(hardware, platform, "torch 2.13.0+cpu")
    assert verdict is ok and says in why


def test_an_engine_that_did_not_grow_the_device_did_not_run_there() -> None:
    gib = 1 << 30
    assert steps.ran_on_device(baseline=2 * gib, loaded=3 * gib + (64 << 20), kv_bytes=gib)
    assert not steps.ran_on_device(baseline=2 * gib, loaded=2 * gib + (10 << 20), kv_bytes=gib)
    assert steps.memory_returned(baseline=gib, after=gib + (100 << 20))
    assert not steps.memory_returned(baseline=gib, after=2 * gib)


def test_the_start_method_step_serves_on_this_machine(capsys) -> None:
    assert steps.step_start_method("spawn") == 0
    assert "RESULT PASS spawn on cpu" in capsys.readouterr().out


GIB = 1 << 30


@pytest.mark.parametrize(
    ("mode", "ending", "after", "shutdown_s", "ok", "says"),
    [
        ("destroy", "destroyed", 2 * GIB, 0.5, True, "destroy: destroyed, memory back"),
        ("abort", "aborted", 2 * GIB + (64 << 20), 0.5, True, "abort: aborted"),
        ("abort", "destroyed", 2 * GIB, 0.5, False, "ended 'destroyed', expected 'aborted'"),
        ("destroy", "destroyed", 3 * GIB, 0.5, False, "1024 MiB not returned"),
        ("destroy", "destroyed", 2 * GIB, 45.0, False, "teardown took 45.0 s"),
    ],
)
def test_the_nccl_verdict_wants_the_asked_ending_memory_back_and_a_bounded_teardown(
    mode, ending, after, shutdown_s, ok, says
) -> None:
    verdict, why = steps.nccl_verdict(mode, ending, 2 * GIB, 3 * GIB, after, shutdown_s,
                                      kv_bytes=GIB)
    assert verdict is ok and says in why


def test_the_nccl_step_refuses_a_cpu_torch_and_says_why(capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the step runs for real in scripts/gpu-check")
    assert steps.step_nccl() == 1
    assert "RESULT FAIL torch runs on the CPU: no nccl group can run" in capsys.readouterr().out
