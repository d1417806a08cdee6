"""One GPU per pytest-xdist worker (``--shutdown-gpu-per-worker``).

Worker ``gwN`` gets the ``N % count``-th visible device through ``CUDA_VISIBLE_DEVICES`` (CUDA)
or ``HIP_VISIBLE_DEVICES`` (ROCm), set before anything in the worker initialises the device.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, MutableMapping, Sequence

VISIBLE_DEVICES_VARIABLE = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}


def worker_index(worker_id: str | None) -> int | None:
    """``gw3`` → 3; the controller or a run without xdist → None."""
    if not worker_id:
        return None
    match = re.fullmatch(r"gw(\d+)", worker_id)
    return int(match.group(1)) if match else None


def gpu_for_worker(worker_id: str | None, visible: Sequence[str]) -> str | None:
    """The device this worker should see, from the devices visible to the whole run."""
    index = worker_index(worker_id)
    if index is None or not visible:
        return None
    return visible[index % len(visible)]


def visible_devices(
    platform: str, environ: MutableMapping[str, str], count: Callable[[], int] | None = None
) -> list[str]:
    """The devices visible to the run: the variable if set, else ``range(device_count)``."""
    current = environ.get(VISIBLE_DEVICES_VARIABLE[platform], "").strip()
    if current:
        return [d.strip() for d in current.split(",") if d.strip()]
    return [str(i) for i in range((count or device_count)())]


def assign_gpu(
    platform: str,
    worker_id: str | None,
    environ: MutableMapping[str, str] | None = None,
    count: Callable[[], int] | None = None,
) -> str | None:
    """Restrict this worker to one GPU; returns the device chosen (None: nothing to do)."""
    if platform not in VISIBLE_DEVICES_VARIABLE or worker_index(worker_id) is None:
        return None
    env = os.environ if environ is None else environ
    device = gpu_for_worker(worker_id, visible_devices(platform, env, count))
    if device is not None:
        env[VISIBLE_DEVICES_VARIABLE[platform]] = device
    return device


def probe_devices() -> tuple[str, int]:
    """(platform, device count) as torch sees them, asked in a child process.

    The worker itself must not initialise the device before its visible devices are set, and
    loading the plugin never imports torch.
    """
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
    return probe_devices()[1]
