"""Platform detection (cuda / rocm / cpu) and device-memory readers: the public face of
:mod:`pytest_shutdown.gpu`, where they live.

Detection never initialises CUDA in the calling process; readers map torch's device index
through the visibility variables and read either the whole device or only the test's own
processes. Names are resolved lazily; torch, NVML and amdsmi are imported only when a function
here is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_shutdown._fast.lazy_exports import lazy_exports

_DETECT = "pytest_shutdown.gpu.detect"
_READERS = "pytest_shutdown.gpu.readers"

_LAZY: dict[str, str] = {
    "PLATFORMS": _DETECT,
    "AmdSmiProcessReader": _READERS,
    "AmdSmiReader": _READERS,
    "MemoryReader": _READERS,
    "NvmlProcessReader": _READERS,
    "NvmlReader": _READERS,
    "OwnProcesses": _READERS,
    "Platform": _DETECT,
    "ProcessRssReader": _READERS,
    "ReadingUnavailable": _READERS,
    "TorchMemGetInfoReader": _READERS,
    "detect_platform": _DETECT,
    "establish_device_context": "pytest_shutdown.gpu.placement",
    "memory_reader": "pytest_shutdown.gpu.memory",
    "validate_platform": _DETECT,
}

__all__ = [
    "PLATFORMS",
    "AmdSmiProcessReader",
    "AmdSmiReader",
    "MemoryReader",
    "NvmlProcessReader",
    "NvmlReader",
    "OwnProcesses",
    "Platform",
    "ProcessRssReader",
    "ReadingUnavailable",
    "TorchMemGetInfoReader",
    "detect_platform",
    "establish_device_context",
    "memory_reader",
    "validate_platform",
]


__getattr__, __dir__ = lazy_exports("pytest_shutdown.devices", _LAZY, globals())


if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.gpu.detect import PLATFORMS, Platform, detect_platform, validate_platform
    from pytest_shutdown.gpu.memory import memory_reader
    from pytest_shutdown.gpu.placement import establish_device_context
    from pytest_shutdown.gpu.readers import (
        AmdSmiProcessReader,
        AmdSmiReader,
        MemoryReader,
        NvmlProcessReader,
        NvmlReader,
        OwnProcesses,
        ProcessRssReader,
        ReadingUnavailable,
        TorchMemGetInfoReader,
    )
