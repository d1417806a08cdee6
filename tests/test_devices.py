"""Platform detection and device-memory readers, against fakes; the real GPU readers skip on CPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
from gpu_fakes import AmdGpu, FakeAmdSmi, FakeNvml, Gpu  # noqa: E402

from pytest_shutdown import devices  # noqa: E402
from pytest_shutdown.devices import (  # noqa: E402
    AmdSmiReader,
    MemoryReader,
    NvmlReader,
    ProcessRssReader,
    TorchMemGetInfoReader,
    detect_platform,
    memory_reader,
)
from pytest_shutdown.gpu import detect  # noqa: E402

REAL_PROBE = detect.probe_device_count


def fake_torch(*, build: str | None = "cuda", initialized: bool = False, count: int = 1):
    """A torch whose CUDA runtime must never be asked: detection goes through NVML / amdsmi."""

    def runtime(*args: object) -> int:
        raise AssertionError("detection asked the CUDA runtime (this poisons fork)")

    cuda = SimpleNamespace(
        is_available=runtime,
        device_count=(lambda: count) if initialized else runtime,
        is_initialized=lambda: initialized,
        mem_get_info=lambda index=0: (3 << 30, 8 << 30),
        _device_count_nvml=lambda: -1,
        _device_count_amdsmi=lambda: -1,
    )
    version = SimpleNamespace(
        hip="6.2.0" if build == "rocm" else None, cuda="12.4" if build == "cuda" else None
    )
    return SimpleNamespace(cuda=cuda, version=version)


@pytest.fixture(autouse=True)
def fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    detect.forget_counts()
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(detect, "probe_device_count", lambda: pytest.fail("probed"))


def with_libraries(monkeypatch, nvml_gpus: int | None, amd_gpus: int | None) -> None:
    """Fake pynvml / amdsmi with that many GPUs; None: the library is missing."""
    nvml = None if nvml_gpus is None else FakeNvml([Gpu(f"GPU-{i}") for i in range(nvml_gpus)])
    amd = None if amd_gpus is None else FakeAmdSmi([AmdGpu(f"u{i}", i) for i in range(amd_gpus)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setitem(sys.modules, "amdsmi", amd)


@pytest.mark.parametrize(
    ("build", "nvml_gpus", "amd_gpus", "expected"),
    [("cuda", 2, None, "cuda"), ("rocm", None, 2, "rocm"), ("cuda", 0, None, "cpu"),
     ("rocm", None, 0, "cpu"), ("cpu", 2, 2, "cpu"), (None, 2, None, "cpu")],
    ids=["cuda", "rocm", "cuda-build-no-device", "rocm-build-no-device", "cpu-build-on-gpus",
         "no-build-info"],
)
def test_detect_platform_counts_through_nvml_and_amdsmi(
    monkeypatch, build, nvml_gpus, amd_gpus, expected
) -> None:
    with_libraries(monkeypatch, nvml_gpus, amd_gpus)
    assert detect_platform(fake_torch(build=build)) == expected


def test_detection_respects_the_visible_devices(monkeypatch) -> None:
    with_libraries(monkeypatch, 2, None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert detect_platform(fake_torch()) == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert detect_platform(fake_torch()) == "cuda"
    assert detect.visible_device_count(fake_torch()) == 1


def test_an_initialised_torch_is_asked_directly(monkeypatch) -> None:
    with_libraries(monkeypatch, None, None)
    assert detect_platform(fake_torch(initialized=True, count=3)) == "cuda"


def test_without_nvml_torch_counts_in_a_child_interpreter(monkeypatch) -> None:
    with_libraries(monkeypatch, None, None)
    probes: list[int] = []
    monkeypatch.setattr(detect, "probe_device_count", lambda: probes.append(1) or 2)
    assert detect_platform(fake_torch()) == "cuda"
    assert detect_platform(fake_torch()) == "cuda"
    assert probes == [1], "the child's answer is cached while the visibility is unchanged"
    torch = fake_torch()
    torch.cuda._device_count_nvml = lambda: 4  # torch's own NVML-based count comes first
    detect.forget_counts()
    assert detect.visible_device_count(torch) == 4 and probes == [1]


def test_a_broken_driver_is_a_machine_without_a_usable_gpu(monkeypatch) -> None:
    class BrokenNvml(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:  # noqa: N802
            raise RuntimeError("driver exploded")

    monkeypatch.setitem(sys.modules, "pynvml", BrokenNvml([]))
    monkeypatch.setattr(detect, "probe_device_count", lambda: 0)
    assert detect_platform(fake_torch()) == "cpu"


def test_hardware_platform_needs_no_torch(monkeypatch) -> None:
    with_libraries(monkeypatch, None, 3)
    assert detect.hardware_platform() == ("rocm", 3)
    with_libraries(monkeypatch, 2, None)
    assert detect.hardware_platform() == ("cuda", 2)
    with_libraries(monkeypatch, None, None)
    assert detect.hardware_platform() == ("cpu", 0)


def test_detect_platform_on_this_machine_agrees_with_torch_in_a_child() -> None:
    import subprocess

    code = "import torch; print('rocm' if torch.version.hip else 'cuda' "
    code += "if torch.cuda.is_available() else 'cpu')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert detect_platform() == out.stdout.split()[-1]


def test_nvml_reader_reads_the_selected_device() -> None:
    nvml = FakeNvml([Gpu("GPU-0", used=1 << 30), Gpu("GPU-1", used=5 << 30)])
    reader = NvmlReader(1, nvml=nvml, environ={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert nvml.inits == 1
    assert reader.used_bytes() == 5 << 30
    nvml.gpus[1].used = 1 << 30
    assert reader.used_bytes() == 1 << 30
    assert isinstance(reader, MemoryReader)


def test_amdsmi_reader_reads_vram_of_the_selected_device() -> None:
    amd = FakeAmdSmi([AmdGpu("u0", 0, vram=100), AmdGpu("u1", 1, vram=11_720_000_000)])
    assert AmdSmiReader(1, amdsmi=amd, environ={}).used_bytes() == 11_720_000_000


def test_amdsmi_reader_rejects_a_missing_device() -> None:
    with pytest.raises(RuntimeError, match="device 3 is not visible: 1 AMD GPU"):
        AmdSmiReader(3, amdsmi=FakeAmdSmi([AmdGpu("u0", 0)]), environ={})


def test_torch_mem_get_info_reader_is_total_minus_free() -> None:
    reader = TorchMemGetInfoReader(0, torch_module=fake_torch())
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
        return TorchMemGetInfoReader(index, torch_module=fake_torch())

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


def test_without_a_gpu_driver_node_no_child_interpreter_is_started(monkeypatch) -> None:
    monkeypatch.setattr(detect, "probe_device_count", REAL_PROBE)
    monkeypatch.setattr(detect, "DEVICE_NODES", ("/nonexistent/nvidiactl",))
    monkeypatch.setattr(detect.subprocess, "run", lambda *a, **k: pytest.fail("child started"))
    if sys.platform.startswith("linux"):
        assert detect.probe_device_count() == 0
    assert detect.device_nodes_present(("/",)) is True
