"""Platform detection (cuda / rocm / cpu) and device-memory readers.

torch, NVML and amdsmi are imported only when a function here is called, never at import time.
Every reader answers one question, ``used_bytes()``: how much device memory is in use now. The
NVML and amdsmi readers see every process on the device (what a leak check after a child process
dies needs); ``torch.cuda.mem_get_info`` is the fallback; on the CPU the reader reports this
process's resident set size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Platform = Literal["cuda", "rocm", "cpu"]
PLATFORMS: tuple[Platform, ...] = ("cuda", "rocm", "cpu")


def detect_platform(torch_module: Any = None) -> Platform:
    """Return ``"rocm"``, ``"cuda"`` or ``"cpu"`` for this process, as torch sees it.

    ROCm builds of torch expose HIP devices through ``torch.cuda``; ``torch.version.hip`` tells
    them apart. Without a visible device the answer is ``"cpu"`` whatever the build.
    """
    torch = torch_module
    if torch is None:
        try:
            import torch  # noqa: PLC0415 - deliberately lazy
        except ImportError:
            return "cpu"
    try:
        has_device = bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # a broken driver is a machine without a usable GPU
        has_device = False
    if not has_device:
        return "cpu"
    if getattr(torch.version, "hip", None):
        return "rocm"
    return "cuda"


def validate_platform(value: str, *, option: str = "platform", allow_auto: bool = True) -> str:
    """Return ``value`` if it names a platform, else raise ``ValueError`` naming ``option``."""
    accepted = (("auto",) if allow_auto else ()) + PLATFORMS
    if value not in accepted:
        raise ValueError(f"{option}: unknown platform {value!r}; accepted: {', '.join(accepted)}")
    return value


@runtime_checkable
class MemoryReader(Protocol):
    """Reads the device memory in use, in bytes."""

    name: str

    def used_bytes(self) -> int: ...


@dataclass
class NvmlReader:
    """Used memory of one NVIDIA GPU, all processes included (nvidia-ml-py)."""

    device_index: int = 0
    nvml: Any = None
    name: str = "nvml"

    def __post_init__(self) -> None:
        if self.nvml is None:
            import pynvml  # noqa: PLC0415

            self.nvml = pynvml
        self.nvml.nvmlInit()
        self._handle = self.nvml.nvmlDeviceGetHandleByIndex(self.device_index)

    def used_bytes(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self._handle).used)


@dataclass
class AmdSmiReader:
    """Used VRAM of one AMD GPU, all processes included (amdsmi)."""

    device_index: int = 0
    amdsmi: Any = None
    name: str = "amdsmi"

    def __post_init__(self) -> None:
        if self.amdsmi is None:
            import amdsmi  # noqa: PLC0415

            self.amdsmi = amdsmi
        self.amdsmi.amdsmi_init()
        handles = self.amdsmi.amdsmi_get_processor_handles()
        if self.device_index >= len(handles):
            raise RuntimeError(
                f"amdsmi sees {len(handles)} GPU(s); device index {self.device_index} is not one"
            )
        self._handle = handles[self.device_index]

    def used_bytes(self) -> int:
        usage = self.amdsmi.amdsmi_get_gpu_memory_usage(
            self._handle, self.amdsmi.AmdSmiMemoryType.VRAM
        )
        return int(usage)


@dataclass
class TorchMemGetInfoReader:
    """Used memory from ``torch.cuda.mem_get_info`` (total - free); CUDA and ROCm builds."""

    device_index: int = 0
    torch_module: Any = None
    name: str = "torch.cuda.mem_get_info"

    def __post_init__(self) -> None:
        if self.torch_module is None:
            import torch  # noqa: PLC0415

            self.torch_module = torch

    def used_bytes(self) -> int:
        free, total = self.torch_module.cuda.mem_get_info(self.device_index)
        return int(total - free)


@dataclass
class ProcessRssReader:
    """Resident set size of a process (this one by default): the CPU stand-in for device memory."""

    pid: int | None = None
    name: str = "process-rss"

    def used_bytes(self) -> int:
        import psutil  # noqa: PLC0415

        return int(psutil.Process(self.pid or os.getpid()).memory_info().rss)


def memory_reader(
    platform: str | None = None,
    device_index: int = 0,
    *,
    factories: dict[str, list[Callable[[int], MemoryReader]]] | None = None,
) -> MemoryReader:
    """The best available reader for ``platform`` (detected when None).

    CUDA: NVML, else ``torch.cuda.mem_get_info``. ROCm: amdsmi, else ``torch.cuda.mem_get_info``.
    CPU: process RSS. A reader whose library is missing or fails to start is skipped.
    """
    if platform is None:
        platform = detect_platform()
    validate_platform(platform, allow_auto=False)
    chains = factories if factories is not None else _default_factories()
    errors: list[str] = []
    for factory in chains[platform]:
        try:
            return factory(device_index)
        except Exception as exc:  # noqa: BLE001 - a missing library means: try the next one
            errors.append(f"{getattr(factory, '__name__', factory)}: {exc}")
    raise RuntimeError(f"no device-memory reader works on {platform}: {'; '.join(errors)}")


def _default_factories() -> dict[str, list[Callable[[int], MemoryReader]]]:
    return {
        "cuda": [lambda i: NvmlReader(i), lambda i: TorchMemGetInfoReader(i)],
        "rocm": [lambda i: AmdSmiReader(i), lambda i: TorchMemGetInfoReader(i)],
        "cpu": [lambda i: ProcessRssReader()],
    }
