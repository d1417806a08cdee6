"""One GPU per pytest-xdist worker (``--shutdown-gpu-per-worker``).

Worker ``gwN`` gets the ``N % count``-th device visible to the run, in
``pytest_load_initial_conftests``: xdist imports the conftests (which may touch the GPU) before
``pytest_configure``, and CUDA reads its visibility variables once. CUDA: ``CUDA_VISIBLE_DEVICES``
(indices, UUIDs or MIG instances, kept as given). ROCm: within ``ROCR_VISIBLE_DEVICES`` (left
untouched), the device is written to both ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES``;
if the two disagree on entry, that is an error naming both. Devices are counted through NVML /
amdsmi; only where neither works, torch counts them in a child interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from pytest_shutdown.gpu import visibility
from pytest_shutdown.gpu.detect import hardware_platform

#: The variables a worker's device is written to.
ASSIGNED_VARIABLES = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    "rocm": ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
}


def worker_index(worker_id: str | None) -> int | None:
    """``gw3`` → 3; the controller or a run without xdist → None."""
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(match.group(1)) if match else None


def gpu_for_worker(worker_id: str | None, visible: Sequence[str]) -> str | None:
    """The device this worker should see, from the devices visible to the whole run."""
    index = worker_index(worker_id)
    if index is None or not visible:
        return None
    return visible[index % len(visible)]


def visible_devices(
    platform: str, environ: Mapping[str, str], count: Callable[[], int] | None = None
) -> list[str]:
    """The devices visible to the run: the visibility variable's entries, else ``range(count)``."""
    if platform == "rocm":
        given = visibility.hip_visible(environ)
        entries = given[1] if given is not None else None
    else:
        entries = visibility.parse_visible(environ.get("CUDA_VISIBLE_DEVICES"))
    if entries is not None:
        return entries
    return [str(i) for i in range((count or device_count)())]


def assign_gpu(
    platform: str,
    worker_id: str | None,
    environ: MutableMapping[str, str] | None = None,
    count: Callable[[], int] | None = None,
) -> str | None:
    """Restrict this worker to one GPU; returns the device chosen (None: nothing to do)."""
    if platform not in ASSIGNED_VARIABLES or worker_index(worker_id) is None:
        return None
    env = os.environ if environ is None else environ
    device = gpu_for_worker(worker_id, visible_devices(platform, env, count))
    if device is not None:
        for name in ASSIGNED_VARIABLES[platform]:
            env[name] = device
    return device


def configured_by_xdist() -> bool:
    """Whether this process is an xdist worker being configured by xdist itself: every
    subprocess a worker starts inherits ``PYTEST_XDIST_WORKER``, but only a worker runs xdist's
    ``__channelexec__`` module, whose ``config`` exists once xdist's configuration is done."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    frame = sys._getframe(1)
    while frame is not None:
        scope = frame.f_globals
        if scope.get("__name__") == "__channelexec__":
            return "config" not in scope
        frame = frame.f_back  # type: ignore[assignment]
    return False


def run_platform_and_count(forced: str | None) -> tuple[str, Callable[[], int]]:
    """The run's platform (forced, else from the hardware) and a lazy device count."""
    if forced in ("cuda", "rocm", "cpu"):
        return forced, device_count
    found, count = hardware_platform()
    platform: str = found
    if platform == "cpu":
        platform, count = probe_devices()
    return platform, lambda: count


def assign_worker_gpu_early(options: Any) -> str | None:
    """``--shutdown-gpu-per-worker`` in ``pytest_load_initial_conftests``; the device chosen."""
    if not getattr(options, "shutdown_gpu_per_worker", False) or not configured_by_xdist():
        return None
    platform, count = run_platform_and_count(getattr(options, "shutdown_platform", None))
    return assign_gpu(platform, os.environ["PYTEST_XDIST_WORKER"], count=count)


def sharing_header(options: Any, workers: object) -> str | None:
    """The controller's header line: how the workers spread over the GPUs."""
    if not getattr(options, "shutdown_gpu_per_worker", False):
        return None
    if not isinstance(workers, int) or workers < 1:
        return "shutdown: --shutdown-gpu-per-worker does nothing without xdist workers (-n)"
    platform, count = run_platform_and_count(getattr(options, "shutdown_platform", None))
    devices = visible_devices(platform, os.environ, count) if platform != "cpu" else []
    if not devices:
        return f"shutdown: --shutdown-gpu-per-worker: no GPU visible ({platform}); nothing assigned"
    listed = ",".join(devices)
    if len(devices) < workers:
        return (
            f"shutdown: --shutdown-gpu-per-worker: {workers} workers share {len(devices)} "
            f"{platform} GPU(s) [{listed}]: worker gwN uses device N mod {len(devices)}"
        )
    return (
        f"shutdown: --shutdown-gpu-per-worker: each of {workers} workers has its own {platform} "
        f"GPU of [{listed}]"
    )


def probe_devices() -> tuple[str, int]:
    """(platform, device count) as torch sees them, asked in a child process (the worker must
    not initialise the device before its visible devices are set)."""
    code = (
        "import torch\n"
        "from pytest_shutdown.devices import detect_platform\n"
        "print(detect_platform(torch), torch.cuda.device_count())"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
        )
        platform, count = out.stdout.split()[-2:]
        return platform, int(count)
    except (subprocess.SubprocessError, ValueError, OSError):
        return "cpu", 0


def device_count() -> int:
    """Visible devices of the run: NVML / amdsmi, else torch in a child process."""
    platform, count = hardware_platform()
    return count if platform != "cpu" else probe_devices()[1]
