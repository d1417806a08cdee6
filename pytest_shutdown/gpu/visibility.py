"""torch's device index → the device NVML or amdsmi means, through the visibility variables.

torch numbers the devices a process *sees*; NVML and amdsmi number every device of the machine.
CUDA: ``CUDA_VISIBLE_DEVICES`` lists indices, GPU UUIDs (a unique prefix is enough) or MIG
instances; CUDA orders devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML by
PCI bus id. ROCm: ``ROCR_VISIBLE_DEVICES`` selects among the GPUs in KFD node order, then
``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``) among those. As in CUDA, a list ends at its
first empty or negative entry.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class VisibilityError(RuntimeError):
    """A device index or visibility variable that names no device."""


class DeviceOrderWarning(UserWarning):
    """CUDA and NVML may number the GPUs differently (``CUDA_DEVICE_ORDER`` is not PCI_BUS_ID)."""


def parse_visible(value: str | None) -> list[str] | None:
    """The entries of a visibility variable; None when it is not set."""
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries


def hip_visible(environ: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """(variable, entries) that HIP applies after ROCR; a clear error when the two disagree."""
    hip = environ.get("HIP_VISIBLE_DEVICES")
    cuda = environ.get("CUDA_VISIBLE_DEVICES")
    if hip is not None and cuda is not None and parse_visible(hip) != parse_visible(cuda):
        raise VisibilityError(
            f"HIP_VISIBLE_DEVICES={hip!r} and CUDA_VISIBLE_DEVICES={cuda!r} disagree; on ROCm "
            "HIP honours both: set one of them, or both to the same list"
        )
    if hip is not None:
        return "HIP_VISIBLE_DEVICES", parse_visible(hip) or []
    if cuda is not None:
        return "CUDA_VISIBLE_DEVICES", parse_visible(cuda) or []
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _normal_uuid(value: str) -> str:
    text = value.lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text.replace("-", "")


def _pick(
    devices: Sequence[Any],
    entry: str,
    uuid_of: Callable[[Any], str],
    variable: str,
    *,
    anywhere: bool = False,
) -> Any:
    """The device ``entry`` names among ``devices``: an index, or a (prefix of a) UUID;
    ``anywhere``: inside the UUID (ROCr's ``GPU-<unique id>`` is the tail of amdsmi's)."""
    if entry.isdigit():
        index = int(entry)
        if index >= len(devices):
            raise VisibilityError(
                f"{variable} names device {index}, but only {len(devices)} are there"
            )
        return devices[index]
    wanted = _normal_uuid(entry)
    matches = [
        d for d in devices
        if (wanted in _normal_uuid(uuid_of(d)) if anywhere
            else _normal_uuid(uuid_of(d)).startswith(wanted))
    ]
    if len(matches) != 1:
        found = "no device" if not matches else f"{len(matches)} devices"
        raise VisibilityError(f"{variable} entry {entry!r} matches {found} by UUID")
    return matches[0]


def _entry_at(entries: list[str], torch_index: int, variable: str, value: str) -> str:
    if not 0 <= torch_index < len(entries):
        raise VisibilityError(
            f"device {torch_index} is not visible: {variable}={value!r} makes "
            f"{len(entries)} device(s) visible"
        )
    return entries[torch_index]


def nvml_handle(
    nvml: Any, torch_index: int, environ: Mapping[str, str], *, warn_order: bool = True
) -> Any:
    """The NVML handle of torch's ``cuda:<torch_index>`` (a MIG handle for a MIG entry); a
    physical index warns once unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    entries = parse_visible(value)
    if entries is None:
        if warn_order:
            warn_if_order_differs(nvml, environ)
        return nvml.nvmlDeviceGetHandleByIndex(torch_index)
    entry = _entry_at(entries, torch_index, "CUDA_VISIBLE_DEVICES", value or "")
    if entry.isdigit():
        count = int(nvml.nvmlDeviceGetCount())
        if int(entry) >= count:
            raise VisibilityError(
                f"CUDA_VISIBLE_DEVICES names device {entry}, but only {count} are there"
            )
        if warn_order:
            warn_if_order_differs(nvml, environ)
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    handles = _mig_handles(nvml) if entry.upper().startswith("MIG-") else _gpu_handles(nvml)
    return _pick(handles, entry, lambda h: _text(nvml.nvmlDeviceGetUUID(h)), "CUDA_VISIBLE_DEVICES")


def nvml_visible_count(nvml: Any, environ: Mapping[str, str]) -> int:
    entries = parse_visible(environ.get("CUDA_VISIBLE_DEVICES"))
    if entries is None:
        return int(nvml.nvmlDeviceGetCount())
    count = 0
    for index in range(len(entries)):
        try:
            nvml_handle(nvml, index, environ, warn_order=False)
        except VisibilityError:
            break  # CUDA, too, stops at the first entry that names no device
        count += 1
    return count


def _gpu_handles(nvml: Any) -> list[Any]:
    return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]


def _mig_handles(nvml: Any) -> list[Any]:
    handles: list[Any] = []
    for gpu in _gpu_handles(nvml):
        try:
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu))
        except Exception:  # noqa: BLE001 - not a MIG-capable GPU
            continue
        for slot in range(slots):
            try:
                handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot))
            except Exception:  # noqa: BLE001 - an empty MIG slot
                continue
    return handles


_warned_order = False


def warn_if_order_differs(nvml: Any, environ: Mapping[str, str]) -> bool:
    """Warn (once) when an index may mean another GPU to NVML than to CUDA; True if it warned."""
    global _warned_order
    if environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return False
    try:
        if int(nvml.nvmlDeviceGetCount()) < 2:
            return False  # one GPU: every order agrees
    except Exception:  # noqa: BLE001
        return False
    if not _warned_order:
        _warned_order = True
        warnings.warn(
            "CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers GPUs fastest-first, NVML by PCI "
            "bus id, so a device-memory reading by index may read another GPU than torch uses; "
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID (or list GPU UUIDs in CUDA_VISIBLE_DEVICES)",
            DeviceOrderWarning,
            stacklevel=3,
        )
    return True


def amdsmi_handles_in_hip_order(amdsmi: Any) -> list[Any]:
    """The machine's GPUs in the order ROCr enumerates them (KFD node id), not amdsmi's."""
    handles = list(amdsmi.amdsmi_get_processor_handles())
    try:
        nodes = {id(h): int(amdsmi.amdsmi_get_gpu_kfd_info(h)["node_id"]) for h in handles}
    except Exception:  # noqa: BLE001 - an older amdsmi: its own order is all there is
        return handles
    return sorted(handles, key=lambda h: nodes[id(h)])


def _amd_uuid(amdsmi: Any, handle: Any) -> str:
    return _text(amdsmi.amdsmi_get_gpu_device_uuid(handle))


def amdsmi_visible_handles(amdsmi: Any, environ: Mapping[str, str]) -> list[Any]:
    """The GPUs HIP shows this process, in HIP's order (ROCR first, then HIP/CUDA)."""
    devices = amdsmi_handles_in_hip_order(amdsmi)
    rocr = parse_visible(environ.get("ROCR_VISIBLE_DEVICES"))
    if rocr is not None:
        devices = [
            _pick(devices, e, lambda h: _amd_uuid(amdsmi, h), "ROCR_VISIBLE_DEVICES",
                  anywhere=True)
            for e in rocr
        ]
    hip = hip_visible(environ)
    if hip is not None:
        variable, entries = hip
        visible = []
        for entry in entries:
            try:
                visible.append(
                    _pick(devices, entry, lambda h: _amd_uuid(amdsmi, h), variable, anywhere=True)
                )
            except VisibilityError:
                break
        devices = visible
    return devices


def amdsmi_handle(amdsmi: Any, torch_index: int, environ: Mapping[str, str]) -> Any:
    """The amdsmi handle of torch's ``cuda:<torch_index>`` on a ROCm build."""
    devices = amdsmi_visible_handles(amdsmi, environ)
    if not 0 <= torch_index < len(devices):
        shown = {k: environ[k] for k in VISIBILITY_VARIABLES["rocm"] if k in environ}
        raise VisibilityError(
            f"device {torch_index} is not visible: {len(devices)} AMD GPU(s) visible "
            f"({shown or 'no visibility variable set'})"
        )
    return devices[torch_index]


#: The variables that decide what a process sees, per platform.
VISIBILITY_VARIABLES: dict[str, tuple[str, ...]] = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    "rocm": ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
}
