"""Detection in a fresh interpreter: CUDA stays uninitialised and torch's fork hook unregistered.

torch registers its fork hook (``poison_fork``) only inside ``torch._C._cuda_getDeviceCount`` and
CUDA's lazy initialisation; every public way of asking torch about devices
(``torch.cuda.is_available()``, ``device_count()`` without NVML, ``init()``) passes through them.
The child pretends to be a CUDA build with two GPUs behind a fake NVML, replaces those entry
points with recorders, and detects: nothing may be recorded, ``is_initialized()`` stays false.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_fakes import Gpu, write_fake_pynvml

CHILD = r"""
import json, sys
import torch
calls = []
def recorder(name, result=None):
    def record(*args, **kwargs):
        calls.append(name)
        return result
    return record
torch.version.cuda = "12.4"  # a CUDA build, as far as detection can tell
torch._C._cuda_getDeviceCount = recorder("_cuda_getDeviceCount", 2)
torch.cuda._lazy_init = recorder("_lazy_init")
torch.cuda.init = recorder("init")
torch.cuda.is_available = recorder("is_available", True)
from pytest_shutdown.devices import detect_platform
platform = detect_platform()
print(json.dumps({"platform": platform, "calls": calls,
                  "initialized": torch.cuda.is_initialized()}))
"""


def detect_in_child(tmp_path: Path, fake_gpus: list[Gpu] | None, env: dict[str, str]) -> dict:
    if fake_gpus is not None:
        write_fake_pynvml(tmp_path, fake_gpus)
    full_env = {**env, "PYTHONPATH": str(tmp_path)}
    import os

    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=180,
        env={**os.environ, **full_env},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("env", "expected"),
    [({}, "cuda"), ({"CUDA_VISIBLE_DEVICES": "1"}, "cuda"), ({"CUDA_VISIBLE_DEVICES": ""}, "cpu")],
    ids=["two-gpus", "one-visible", "none-visible"],
)
def test_detection_through_nvml_never_asks_the_cuda_runtime(tmp_path, env, expected) -> None:
    result = detect_in_child(tmp_path, [Gpu("GPU-aaaa"), Gpu("GPU-bbbb")], env)
    assert result == {"platform": expected, "calls": [], "initialized": False}


def test_without_nvml_the_count_comes_from_another_interpreter(tmp_path) -> None:
    # No pynvml and no libnvidia-ml here: torch's NVML count fails, and the device count is
    # asked in a grandchild (a CPU build: 0). The child itself never asks its CUDA runtime.
    (tmp_path / "pynvml.py").write_text("raise ImportError('no NVML here')\n")
    (tmp_path / "sitecustomize.py").write_text(
        "from pytest_shutdown.gpu import detect\n"
        "detect.DEVICE_NODES = ('/',)  # as if a driver node existed: the grandchild is asked\n"
    )
    result = detect_in_child(tmp_path, None, {})
    assert result == {"platform": "cpu", "calls": [], "initialized": False}


def test_on_this_cpu_build_detection_registers_no_fork_hook(tmp_path) -> None:
    code = (
        "import torch, json\n"
        "calls = []\n"
        "real = getattr(torch._C, '_cuda_getDeviceCount', None)\n"
        "from pytest_shutdown.devices import detect_platform, memory_reader\n"
        "p = detect_platform(); memory_reader(p)\n"
        "print(json.dumps([p, torch.cuda.is_initialized(), torch.cuda._is_in_bad_fork(),"
        " torch.version.cuda, torch.version.hip]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    platform, initialized, bad_fork, cuda, hip = json.loads(done.stdout.splitlines()[-1])
    # Whatever the build and the machine: detection never initialised CUDA nor poisoned fork.
    assert (initialized, bad_fork) == (False, False)
    if not (cuda or hip):  # a CPU build is the CPU on any machine
        assert platform == "cpu"
