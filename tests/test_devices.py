"""Platform detection and device-memory readers, against fakes; the real GPU readers skip on CPU."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from pytest_shutdown import devices
from pytest_shutdown.devices import (
    AmdSmiReader,
    MemoryReader,
    NvmlReader,
    ProcessRssReader,
    TorchMemGetInfoReader,
    detect_platform,
    memory_reader,
)


def fake_torch(*, available: bool, count: int = 1, hip: str | None = None, raises: bool = False):
    def is_available() -> bool:
        if raises:
            raise RuntimeError("driver exploded")
        return available

    cuda = SimpleNamespace(
        is_available=is_available,
        device_count=lambda: count,
        mem_get_info=lambda index=0: (3 << 30, 8 << 30),
    )
    return SimpleNamespace(cuda=cuda, version=SimpleNamespace(hip=hip, cuda="12.4"))


@pytest.mark.parametrize(
    ("torch_module", "expected"),
    [
        (fake_torch(available=True), "cuda"),
        (fake_torch(available=True, hip="6.2.0"), "rocm"),
        (fake_torch(available=False, hip="6.2.0"), "cpu"),
        (fake_torch(available=False), "cpu"),
        (fake_torch(available=True, count=0), "cpu"),
        (fake_torch(available=True, raises=True), "cpu"),
    ],
    ids=["cuda", "rocm", "rocm-build-no-device", "cuda-build-no-device", "no-devices", "broken"],
)
def test_detect_platform(torch_module, expected) -> None:
    assert detect_platform(torch_module) == expected


def test_detect_platform_on_this_machine_agrees_with_torch() -> None:
    import torch

    expected = "cpu"
    if torch.cuda.is_available():
        expected = "rocm" if torch.version.hip else "cuda"
    assert detect_platform() == expected


class FakeNvml:
    def __init__(self) -> None:
        self.used = 5 << 30
        self.inits = 0

    def nvmlInit(self) -> None:  # noqa: N802 - NVML's own names
        self.inits += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:  # noqa: N802
        return f"gpu{index}"

    def nvmlDeviceGetMemoryInfo(self, handle: str):  # noqa: N802
        assert handle == "gpu1"
        return SimpleNamespace(used=self.used, total=80 << 30, free=(80 << 30) - self.used)


def test_nvml_reader_reads_the_selected_device() -> None:
    nvml = FakeNvml()
    reader = NvmlReader(1, nvml=nvml)
    assert nvml.inits == 1
    assert reader.used_bytes() == 5 << 30
    nvml.used = 1 << 30
    assert reader.used_bytes() == 1 << 30
    assert isinstance(reader, MemoryReader)


class FakeAmdSmi:
    class AmdSmiMemoryType:
        VRAM = "vram"

    def __init__(self, handles: int = 2) -> None:
        self.handles = [f"h{i}" for i in range(handles)]

    def amdsmi_init(self) -> None:
        pass

    def amdsmi_get_processor_handles(self) -> list[str]:
        return self.handles

    def amdsmi_get_gpu_memory_usage(self, handle: str, kind: str) -> int:
        assert kind == "vram"
        return {"h0": 100, "h1": 11_720_000_000}[handle]


def test_amdsmi_reader_reads_vram_of_the_selected_device() -> None:
    assert AmdSmiReader(1, amdsmi=FakeAmdSmi()).used_bytes() == 11_720_000_000


def test_amdsmi_reader_rejects_a_missing_device() -> None:
    with pytest.raises(RuntimeError, match="sees 1 GPU"):
        AmdSmiReader(3, amdsmi=FakeAmdSmi(handles=1))


def test_torch_mem_get_info_reader_is_total_minus_free() -> None:
    reader = TorchMemGetInfoReader(0, torch_module=fake_torch(available=True))
    assert reader.used_bytes() == 5 << 30


def test_rss_reader_sees_this_process_grow() -> None:
    reader = ProcessRssReader()
    before = reader.used_bytes()
    blob = bytearray(64 << 20)
    for i in range(0, len(blob), 4096):
        blob[i] = 1
    assert reader.used_bytes() >= before + (32 << 20)
    del blob
    assert ProcessRssReader(os.getpid()).used_bytes() > 0


def test_memory_reader_falls_back_along_the_chain() -> None:
    calls: list[str] = []

    def broken(index: int) -> MemoryReader:
        calls.append("nvml")
        raise ImportError("No module named 'pynvml'")

    def fallback(index: int) -> MemoryReader:
        calls.append("torch")
        return TorchMemGetInfoReader(index, torch_module=fake_torch(available=True))

    reader = memory_reader("cuda", factories={"cuda": [broken, fallback]})
    assert calls == ["nvml", "torch"] and reader.name == "torch.cuda.mem_get_info"


def test_memory_reader_names_every_failure() -> None:
    def broken(index: int) -> MemoryReader:
        raise ImportError("No module named 'amdsmi'")

    with pytest.raises(RuntimeError, match="no device-memory reader works on rocm: .*amdsmi"):
        memory_reader("rocm", factories={"rocm": [broken]})


def test_memory_reader_rejects_unknown_platforms() -> None:
    with pytest.raises(ValueError, match="unknown platform 'tpu'; accepted: cuda, rocm, cpu"):
        memory_reader("tpu")


def test_cpu_reader_is_rss() -> None:
    assert memory_reader("cpu").name == "process-rss"


@pytest.mark.skipif(devices.detect_platform() != "cuda", reason="needs an NVIDIA GPU (CUDA)")
def test_real_cuda_reader() -> None:  # pragma: no cover - runs on GPU machines only
    assert memory_reader("cuda").used_bytes() > 0


@pytest.mark.skipif(devices.detect_platform() != "rocm", reason="needs an AMD GPU (ROCm)")
def test_real_rocm_reader() -> None:  # pragma: no cover - runs on GPU machines only
    assert memory_reader("rocm").used_bytes() > 0
