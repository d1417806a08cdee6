"""Device-memory readers: ``used_bytes()`` = device memory in use now, in bytes.

Whole-device readers (NVML, amdsmi, ``torch.cuda.mem_get_info``) see every process on the GPU:
flaky on a shared one (an xdist worker beside yours allocates mid-measurement). Per-process
readers count only the processes a test owns (default: this one and every descendant it has had,
orphaned ones included). On the CPU, a process's resident set size stands in.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pytest_shutdown._os.killer import tree_of
from pytest_shutdown.gpu import visibility


@runtime_checkable
class MemoryReader(Protocol):
    """Reads the device memory in use, in bytes."""

    name: str

    def used_bytes(self) -> int: ...


class ReadingUnavailable(RuntimeError):
    """The library cannot give the reading asked for (e.g. per-process memory under MIG)."""


def _shut_down(call: Callable[[], Any]) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - a library already shut down
        pass


class _LibraryReader:
    """Initialises a library once per reader and shuts it down on close() or collection."""

    _finalizer: weakref.finalize

    def _start(
        self, init: Callable[[], Any], shutdown: Callable[[], Any], handle: Callable[[], Any]
    ) -> None:
        init()
        self._finalizer = weakref.finalize(self, _shut_down, shutdown)
        try:
            self._handle = handle()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Shut the library down (``nvmlShutdown`` / ``amdsmi_shut_down``); idempotent."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OwnProcesses:
    """This process and every descendant seen so far (an orphaned child stays counted)."""

    def __init__(self, root: int | None = None) -> None:
        self.root = root or os.getpid()
        self.seen: set[int] = {self.root}

    def __call__(self) -> set[int]:
        self.seen.update(tree_of(self.root))
        return set(self.seen)


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


@dataclass(eq=False)
class NvmlReader(_LibraryReader):
    """Used memory of the NVIDIA GPU torch calls ``cuda:<device_index>``, all processes."""

    device_index: int = 0
    nvml: Any = None
    environ: Mapping[str, str] | None = None
    name: str = "nvml"

    def __post_init__(self) -> None:
        if self.nvml is None:
            import pynvml  # noqa: PLC0415

            self.nvml = pynvml
        nvml = self.nvml
        self._start(
            nvml.nvmlInit,
            nvml.nvmlShutdown,
            lambda: visibility.nvml_handle(nvml, self.device_index, _environ(self.environ)),
        )

    def used_bytes(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self._handle).used)


@dataclass(eq=False)
class NvmlProcessReader(NvmlReader):
    """Used memory of the given processes only (NVML's compute-process list).

    ``pids`` returns the pids to count (default: :class:`OwnProcesses`). NVML reports
    ``usedGpuMemory=None`` where it cannot attribute memory (some containers, MIG, vGPU): such a
    device is refused at construction, and a reading of an owned process without a figure raises
    :class:`ReadingUnavailable`.
    """

    pids: Callable[[], Iterable[int]] = field(default_factory=OwnProcesses)
    name: str = "nvml-per-process"

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            listed = self._processes()
        except Exception as exc:
            self.close()
            raise ReadingUnavailable(f"NVML lists no processes on this device: {exc}") from exc
        if any(getattr(p, "usedGpuMemory", None) is None for p in listed):
            self.close()
            raise ReadingUnavailable(
                "NVML does not report per-process memory on this device (usedGpuMemory=None)"
            )

    def _processes(self) -> list[Any]:
        return list(self.nvml.nvmlDeviceGetComputeProcesses(self._handle))

    def used_bytes(self) -> int:
        wanted = set(self.pids())
        total = 0
        for process in self._processes():
            if process.pid not in wanted:
                continue
            used = getattr(process, "usedGpuMemory", None)
            if used is None:
                raise ReadingUnavailable(
                    f"NVML gives no memory figure for pid {process.pid} (usedGpuMemory=None); "
                    "read the whole device instead: memory_reader(..., per_process=False)"
                )
            total += int(used)
        return total


@dataclass(eq=False)
class AmdSmiReader(_LibraryReader):
    """Used VRAM of the AMD GPU torch calls ``cuda:<device_index>``, all processes."""

    device_index: int = 0
    amdsmi: Any = None
    environ: Mapping[str, str] | None = None
    name: str = "amdsmi"

    def __post_init__(self) -> None:
        if self.amdsmi is None:
            import amdsmi  # noqa: PLC0415

            self.amdsmi = amdsmi
        amd = self.amdsmi
        self._start(
            amd.amdsmi_init,
            amd.amdsmi_shut_down,
            lambda: visibility.amdsmi_handle(amd, self.device_index, _environ(self.environ)),
        )

    def used_bytes(self) -> int:
        usage = self.amdsmi.amdsmi_get_gpu_memory_usage(
            self._handle, self.amdsmi.AmdSmiMemoryType.VRAM
        )
        return int(usage)


@dataclass(eq=False)
class AmdSmiProcessReader(AmdSmiReader):
    """Used VRAM of the given processes only (amdsmi's process list)."""

    pids: Callable[[], Iterable[int]] = field(default_factory=OwnProcesses)
    name: str = "amdsmi-per-process"

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            self._usage()
        except Exception as exc:
            self.close()
            raise ReadingUnavailable(f"amdsmi lists no processes on this device: {exc}") from exc

    def _usage(self) -> dict[int, int | None]:
        usage: dict[int, int | None] = {}
        for item in self.amdsmi.amdsmi_get_gpu_process_list(self._handle):
            info = item if isinstance(item, dict) else self.amdsmi.amdsmi_get_gpu_process_info(
                self._handle, item
            )
            memory = info.get("memory_usage") or {}
            vram = memory.get("vram_mem") if isinstance(memory, dict) else None
            usage[int(info["pid"])] = None if vram is None else int(vram)
        return usage

    def used_bytes(self) -> int:
        wanted = set(self.pids())
        total = 0
        for pid, used in self._usage().items():
            if pid not in wanted:
                continue
            if used is None:
                raise ReadingUnavailable(
                    f"amdsmi gives no VRAM figure for pid {pid}; read the whole device instead: "
                    "memory_reader(..., per_process=False)"
                )
            total += used
        return total


@dataclass
class TorchMemGetInfoReader:
    """Used memory from ``torch.cuda.mem_get_info`` (total - free); CUDA and ROCm builds.

    Initialises CUDA in the calling process: the last resort, after NVML and amdsmi.
    """

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


ReaderFactory = Callable[[int], MemoryReader]


def default_factories(per_process: bool | None = None) -> dict[str, list[ReaderFactory]]:
    """The reader chains: per-process first (``None``), only (``True``) or never (``False``)."""
    nvml: list[ReaderFactory] = []
    amd: list[ReaderFactory] = []
    if per_process is not False:
        nvml.append(NvmlProcessReader)
        amd.append(AmdSmiProcessReader)
    if per_process is not True:
        nvml += [NvmlReader, TorchMemGetInfoReader]
        amd += [AmdSmiReader, TorchMemGetInfoReader]
    return {"cuda": nvml, "rocm": amd, "cpu": [_own_rss]}


def _own_rss(device_index: int) -> MemoryReader:
    return ProcessRssReader()
