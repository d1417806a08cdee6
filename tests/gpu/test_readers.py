"""Device-memory readers against fake NVML / amdsmi: the right device, the right processes."""

from __future__ import annotations

import gc
import os

import pytest
from gpu_fakes import AmdGpu, FakeAmdSmi, FakeNvml, GiB, Gpu

from pytest_shutdown.devices import (
    AmdSmiProcessReader,
    AmdSmiReader,
    NvmlProcessReader,
    NvmlReader,
    OwnProcesses,
    ReadingUnavailable,
    memory_reader,
)

PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
ME = os.getpid()
OTHER_WORKER = 999_999


def nvml_with_two() -> FakeNvml:
    return FakeNvml([Gpu("GPU-aaaa", used=1 * GiB), Gpu("GPU-bbbb", used=7 * GiB)])


def test_the_nvml_reader_reads_the_device_torch_uses_not_physical_gpu_0() -> None:
    nvml = nvml_with_two()
    reader = NvmlReader(0, nvml=nvml, environ={**PCI, "CUDA_VISIBLE_DEVICES": "1"})
    assert reader.used_bytes() == 7 * GiB
    nvml.gpus[1].used = 8 * GiB
    assert reader.used_bytes() == 8 * GiB
    by_uuid = NvmlReader(0, nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "GPU-aaaa"})
    assert by_uuid.used_bytes() == GiB


def test_readers_shut_their_library_down_on_close_and_when_collected() -> None:
    nvml = nvml_with_two()
    with NvmlReader(1, nvml=nvml, environ=PCI) as reader:
        assert nvml.inits == 1 and nvml.shutdowns == 0
    assert nvml.shutdowns == 1
    reader.close()
    assert nvml.shutdowns == 1, "close() is idempotent"
    NvmlReader(1, nvml=nvml, environ=PCI)
    gc.collect()
    assert nvml.shutdowns == 2
    amd = FakeAmdSmi([AmdGpu("u0", 0, vram=GiB)])
    AmdSmiReader(0, amdsmi=amd, environ={}).close()
    assert (amd.inits, amd.shutdowns) == (1, 1)


def test_a_reader_for_a_device_that_is_not_visible_fails_and_shuts_down() -> None:
    nvml = nvml_with_two()
    with pytest.raises(RuntimeError, match="device 1 is not visible"):
        NvmlReader(1, nvml=nvml, environ={"CUDA_VISIBLE_DEVICES": "0"})
    assert nvml.shutdowns == nvml.inits == 1


def test_the_per_process_reader_counts_only_the_given_processes() -> None:
    nvml = FakeNvml([Gpu("GPU-aaaa", used=9 * GiB,
                         processes=[(ME, 2 * GiB), (OTHER_WORKER, 5 * GiB), (4242, GiB)])])
    reader = NvmlProcessReader(0, nvml=nvml, environ=PCI, pids=lambda: {ME, 4242})
    assert reader.used_bytes() == 3 * GiB
    nvml.gpus[0].processes = [(OTHER_WORKER, 6 * GiB)]  # our processes ended; a neighbour grew
    assert reader.used_bytes() == 0


def test_per_process_readings_without_a_figure_are_refused_not_guessed() -> None:
    nvml = FakeNvml([Gpu("GPU-aaaa", processes=[(OTHER_WORKER, None)])])
    with pytest.raises(ReadingUnavailable, match="usedGpuMemory=None"):
        NvmlProcessReader(0, nvml=nvml, environ=PCI, pids=lambda: {ME})
    assert nvml.shutdowns == nvml.inits == 1
    nvml.gpus[0].processes = []
    reader = NvmlProcessReader(0, nvml=nvml, environ=PCI, pids=lambda: {ME})
    nvml.gpus[0].processes = [(ME, None)]
    with pytest.raises(ReadingUnavailable, match=f"pid {ME}.*per_process=False"):
        reader.used_bytes()


def test_the_amd_per_process_reader_counts_vram_of_the_given_processes() -> None:
    amd = FakeAmdSmi([AmdGpu("u0", 1, vram=9 * GiB, processes=[(ME, GiB), (OTHER_WORKER, GiB)]),
                      AmdGpu("u1", 0, vram=3 * GiB, processes=[(ME, 2 * GiB)])])
    # HIP order is KFD node order: torch's device 0 is "u1", amdsmi's second handle.
    reader = AmdSmiProcessReader(0, amdsmi=amd, environ={}, pids=lambda: {ME})
    assert reader.used_bytes() == 2 * GiB
    assert AmdSmiReader(0, amdsmi=amd, environ={}).used_bytes() == 3 * GiB
    amd.gpus[1].processes = [(ME, None)]
    with pytest.raises(ReadingUnavailable, match="no VRAM figure"):
        reader.used_bytes()


def test_own_processes_remember_a_child_after_it_is_orphaned() -> None:
    import subprocess
    import sys

    pids = OwnProcesses()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pids() >= {os.getpid(), child.pid}
    finally:
        child.kill()
        child.wait(10)
    assert child.pid in pids(), "a pid once seen stays counted"


def test_memory_reader_prefers_per_process_and_falls_back_to_the_whole_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    per_gpu = FakeNvml([Gpu("GPU-aaaa", used=4 * GiB, processes=[(ME, GiB)])])
    monkeypatch.setitem(sys.modules, "pynvml", per_gpu)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert memory_reader("cuda").name == "nvml-per-process"
    assert memory_reader("cuda", per_process=False).name == "nvml"
    per_gpu.gpus[0].processes = [(OTHER_WORKER, None)]  # NVML cannot attribute memory here
    assert memory_reader("cuda").name == "nvml"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML at all: torch's figure is last
    with pytest.raises(RuntimeError, match="NvmlProcessReader: .*pynvml"):
        memory_reader("cuda", per_process=True)
    with pytest.raises(ValueError, match="per_process: expected None, True or False"):
        memory_reader("cuda", per_process="yes")  # type: ignore[arg-type]
