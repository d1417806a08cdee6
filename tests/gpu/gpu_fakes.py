"""Fake NVML (pynvml) and amdsmi modules: devices with UUIDs, memory, process lists, MIG.

``FakeNvml`` / ``FakeAmdSmi`` are used in-process; ``write_fake_pynvml(folder, gpus)`` writes a
``pynvml.py`` that a child interpreter (a pytester run, a subprocess) imports instead of the real
library, with the same devices.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

GiB = 1 << 30


class NVMLError(Exception):
    pass


@dataclass
class Gpu:
    uuid: str
    used: int = 0
    #: (pid, usedGpuMemory or None)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    migs: list[Gpu] = field(default_factory=list)


class FakeNvml:
    NVMLError = NVMLError

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's own names
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Gpu:  # noqa: N802
        if not 0 <= index < len(self.gpus):
            raise NVMLError(f"invalid index {index}")
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: Gpu) -> bytes:  # noqa: N802 - old pynvml: bytes
        return handle.uuid.encode()

    def nvmlDeviceGetMemoryInfo(self, handle: Gpu) -> Any:  # noqa: N802
        return SimpleNamespace(used=handle.used, total=80 * GiB, free=80 * GiB - handle.used)

    def nvmlDeviceGetComputeProcesses(self, handle: Gpu) -> list[Any]:  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in handle.processes]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Gpu) -> int:  # noqa: N802
        if not handle.migs:
            raise NVMLError("not supported")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Gpu, index: int) -> Gpu:  # noqa: N802
        if index >= len(handle.migs):
            raise NVMLError("not found")
        return handle.migs[index]


@dataclass
class AmdGpu:
    uuid: str
    node_id: int
    vram: int = 0
    #: (pid, vram bytes or None)
    processes: list[tuple[int, int | None]] = field(default_factory=list)


class FakeAmdSmi:
    AmdSmiMemoryType = SimpleNamespace(VRAM="vram", VIS_VRAM="vis_vram", GTT="gtt")

    def __init__(self, gpus: list[AmdGpu], kfd_info: bool = True) -> None:
        self.gpus = gpus  # amdsmi's own order
        self.kfd_info = kfd_info
        self.inits = 0
        self.shutdowns = 0

    def amdsmi_init(self) -> None:
        self.inits += 1

    def amdsmi_shut_down(self) -> None:
        self.shutdowns += 1

    def amdsmi_get_processor_handles(self) -> list[AmdGpu]:
        return list(self.gpus)

    def amdsmi_get_gpu_kfd_info(self, handle: AmdGpu) -> dict[str, int]:
        if not self.kfd_info:
            raise AttributeError("amdsmi_get_gpu_kfd_info")
        return {"kfd_id": 1000 + handle.node_id, "node_id": handle.node_id}

    def amdsmi_get_gpu_device_uuid(self, handle: AmdGpu) -> str:
        return handle.uuid

    def amdsmi_get_gpu_memory_usage(self, handle: AmdGpu, kind: str) -> int:
        assert kind == "vram"
        return handle.vram

    def amdsmi_get_gpu_process_list(self, handle: AmdGpu) -> list[dict[str, Any]]:
        return [
            {"pid": pid, "name": "python", "mem": vram or 0,
             "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": vram}}
            for pid, vram in handle.processes
        ]


PYNVML_TEMPLATE = '''\
"""A fake pynvml written by tests/gpu/gpu_fakes.py."""
import sys
sys.path.insert(0, {root!r})
from gpu_fakes import FakeNvml, Gpu, NVMLError  # noqa: E402

_fake = FakeNvml([Gpu(**g) for g in {gpus}])
for _name in dir(_fake):
    if _name.startswith("nvml"):
        globals()[_name] = getattr(_fake, _name)
'''


def write_fake_pynvml(folder: Path, gpus: list[Gpu]) -> Path:
    """A ``pynvml.py`` in ``folder`` whose NVML shows ``gpus`` (put ``folder`` on sys.path)."""
    root = str(Path(__file__).resolve().parent)
    plain = json.loads(json.dumps([asdict(g) for g in gpus]))
    for g in plain:
        g.pop("migs", None)
        g["processes"] = [tuple(p) for p in g["processes"]]
    path = folder / "pynvml.py"
    path.write_text(PYNVML_TEMPLATE.format(root=root, gpus=plain))
    return path
