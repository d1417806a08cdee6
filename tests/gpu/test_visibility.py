"""torch's device index → the NVML / amdsmi device, through the visibility variables."""

from __future__ import annotations

import warnings

import pytest
from gpu_fakes import AmdGpu, FakeAmdSmi, FakeNvml, Gpu

from pytest_shutdown.gpu import visibility
from pytest_shutdown.gpu.visibility import (
    DeviceOrderWarning,
    VisibilityError,
    amdsmi_handle,
    nvml_handle,
    nvml_visible_count,
    parse_visible,
)

UUIDS = ["GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-1d2e3f40-0000-4000-8000-aaaaaaaaaaaa",
         "GPU-77777777-1111-4222-8333-bbbbbbbbbbbb", "GPU-abcdef01-2222-4333-8444-cccccccccccc"]
PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def four_gpus() -> FakeNvml:
    return FakeNvml([Gpu(uuid) for uuid in UUIDS])


@pytest.mark.parametrize(
    ("value", "entries"),
    [(None, None), ("", []), ("2,0", ["2", "0"]), (" 3 , 1 ", ["3", "1"]), ("-1", []),
     ("1,-1,2", ["1"]), ("1,,2", ["1"]), ("GPU-89,MIG-ab", ["GPU-89", "MIG-ab"])],
)
def test_visibility_lists_end_at_the_first_empty_or_negative_entry(value, entries) -> None:
    assert parse_visible(value) == entries


@pytest.mark.parametrize(
    ("env", "torch_index", "physical"),
    [({}, 2, 2), ({"CUDA_VISIBLE_DEVICES": "2,0"}, 0, 2), ({"CUDA_VISIBLE_DEVICES": "2,0"}, 1, 0),
     ({"CUDA_VISIBLE_DEVICES": "3"}, 0, 3),
     ({"CUDA_VISIBLE_DEVICES": "GPU-77777777"}, 0, 2),  # a unique UUID prefix is enough
     ({"CUDA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[1]}"}, 1, 1)],
    ids=["unset", "list-first", "list-second", "single", "uuid-prefix", "uuids"],
)
def test_nvml_handle_follows_cuda_visible_devices(env, torch_index, physical) -> None:
    nvml = four_gpus()
    assert nvml_handle(nvml, torch_index, {**PCI, **env}) is nvml.gpus[physical]


def test_a_mig_entry_reads_its_mig_instance() -> None:
    mig_a, mig_b = Gpu("MIG-aaaa1111-2222"), Gpu("MIG-bbbb3333-4444")
    nvml = FakeNvml([Gpu(UUIDS[0]), Gpu(UUIDS[1], migs=[mig_a, mig_b])])
    env = {"CUDA_VISIBLE_DEVICES": "MIG-bbbb3333-4444"}
    assert nvml_handle(nvml, 0, env) is mig_b


@pytest.mark.parametrize(
    ("env", "message"),
    [({"CUDA_VISIBLE_DEVICES": "1"}, "device 1 is not visible"),
     ({"CUDA_VISIBLE_DEVICES": "GPU-ffff"}, "matches no device"),
     ({"CUDA_VISIBLE_DEVICES": "GPU-"}, "matches 4 devices"),
     ({"CUDA_VISIBLE_DEVICES": "9"}, "names device 9, but only 4")],
)
def test_an_index_that_names_no_device_is_a_clear_error(env, message) -> None:
    with pytest.raises(VisibilityError, match=message):
        nvml_handle(four_gpus(), 1 if env["CUDA_VISIBLE_DEVICES"] == "1" else 0, {**PCI, **env})


def test_the_visible_count_stops_at_the_first_entry_naming_no_device() -> None:
    nvml = four_gpus()
    assert nvml_visible_count(nvml, {}) == 4
    assert nvml_visible_count(nvml, {"CUDA_VISIBLE_DEVICES": "3,1"}) == 2
    assert nvml_visible_count(nvml, {"CUDA_VISIBLE_DEVICES": "3,7,1"}) == 1
    assert nvml_visible_count(nvml, {"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_index_mapping_warns_once_unless_the_order_is_pci_bus_id(monkeypatch) -> None:
    monkeypatch.setattr(visibility, "_warned_order", False)
    nvml = four_gpus()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nvml_handle(nvml, 1, PCI)  # PCI_BUS_ID: NVML and CUDA agree, no warning
        nvml_handle(nvml, 0, {"CUDA_VISIBLE_DEVICES": UUIDS[2]})  # a UUID is unambiguous
        nvml_handle(FakeNvml([Gpu(UUIDS[0])]), 0, {})  # one GPU: every order agrees
    with pytest.warns(DeviceOrderWarning, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        nvml_handle(nvml, 1, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nvml_handle(nvml, 1, {})  # once per process


# -- ROCm -------------------------------------------------------------------------------------
def amd_gpus(kfd_info: bool = True) -> FakeAmdSmi:
    # amdsmi lists them in another order than ROCr/HIP (KFD node id order: b, d, a, c).
    return FakeAmdSmi(
        [AmdGpu("a-uuid-0001", node_id=3), AmdGpu("b-uuid-0002", node_id=1),
         AmdGpu("c-uuid-0003", node_id=4), AmdGpu("d-uuid-0004", node_id=2)],
        kfd_info=kfd_info,
    )


@pytest.mark.parametrize(
    ("env", "torch_index", "uuid"),
    [({}, 0, "b-uuid-0002"), ({}, 2, "a-uuid-0001"),
     ({"HIP_VISIBLE_DEVICES": "3,1"}, 0, "c-uuid-0003"),
     ({"CUDA_VISIBLE_DEVICES": "3,1"}, 1, "d-uuid-0004"),
     ({"ROCR_VISIBLE_DEVICES": "2,3"}, 1, "c-uuid-0003"),
     ({"ROCR_VISIBLE_DEVICES": "0,2,3", "HIP_VISIBLE_DEVICES": "2"}, 0, "c-uuid-0003"),
     ({"ROCR_VISIBLE_DEVICES": "GPU-a-uuid-0001"}, 0, "a-uuid-0001"),
     ({"ROCR_VISIBLE_DEVICES": "GPU-0003"}, 0, "c-uuid-0003"),  # ROCr's id: the UUID's tail
     ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "1"}, 0, "d-uuid-0004")],
    ids=["unset-0", "unset-2", "hip", "cuda-var", "rocr", "rocr-then-hip", "rocr-uuid",
         "rocr-id-tail", "agree"],
)
def test_amdsmi_handle_follows_hip_order_and_the_visibility_chain(env, torch_index, uuid) -> None:
    assert amdsmi_handle(amd_gpus(), torch_index, env).uuid == uuid


def test_without_kfd_info_amdsmi_order_is_all_there_is() -> None:
    assert amdsmi_handle(amd_gpus(kfd_info=False), 0, {}).uuid == "a-uuid-0001"


def test_hip_and_cuda_visible_devices_that_disagree_are_an_error() -> None:
    env = {"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}
    with pytest.raises(VisibilityError, match="HIP_VISIBLE_DEVICES='0' and CUDA_VISIBLE_DEV"):
        amdsmi_handle(amd_gpus(), 0, env)


def test_an_amd_index_beyond_the_visible_devices_names_the_variables() -> None:
    with pytest.raises(VisibilityError, match="1 AMD GPU.*HIP_VISIBLE_DEVICES"):
        amdsmi_handle(amd_gpus(), 1, {"HIP_VISIBLE_DEVICES": "2"})
