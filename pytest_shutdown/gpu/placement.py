"""Which device an engine process uses: data-parallel rank r on device ``r mod count``.

A reference engine whose ranks all allocate on ``cuda:0`` leaves the other GPUs idle and
measures the wrong device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_shutdown.engine.config import EngineConfig


def device_for_rank(device: str, dp_rank: int, device_count: int) -> str:
    """``"cuda"`` + rank 1 of 2 visible devices → ``"cuda:1"``; the CPU stays the CPU."""
    if dp_rank < 0:
        raise ValueError(f"dp_rank: expected an integer >= 0, got {dp_rank!r}")
    kind = device.split(":", 1)[0]
    if kind != "cuda" or device_count < 1:
        return device
    return f"cuda:{dp_rank % device_count}"


def place_rank(config: EngineConfig, dp_rank: int, torch: Any = None) -> EngineConfig:
    """In engine process ``dp_rank``, before it allocates: make its device current and return
    the config using it (its CUDA/HIP context is created on its own device only)."""
    if config.device.split(":", 1)[0] != "cuda":
        return config
    if torch is None:
        import torch  # noqa: PLC0415
    device = device_for_rank(config.device, dp_rank, int(torch.cuda.device_count()))
    torch.cuda.set_device(torch.device(device))
    return config.replace(device=device)


def establish_device_context(device: str, torch: Any = None) -> bool:
    """Create this process's CUDA/HIP context on ``device`` now; True if there was one to make.

    The context itself takes device memory (about 0.5 GiB on Hopper) and lives as long as the
    process: a baseline read before it exists makes every later reading look like a leak.
    Initialises CUDA in this process, so call it only where that is intended (after it, ``fork``
    is refused).
    """
    if device.split(":", 1)[0] != "cuda":
        return False
    if torch is None:
        import torch  # noqa: PLC0415
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    return True
