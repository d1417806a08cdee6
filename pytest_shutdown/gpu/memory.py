"""The best available device-memory reader for a platform (the public face:
:mod:`pytest_shutdown.devices`)."""

from __future__ import annotations

from typing import Any

from pytest_shutdown.gpu.detect import detect_platform, validate_platform
from pytest_shutdown.gpu.readers import MemoryReader, ReaderFactory, default_factories

__all__ = ["memory_reader"]


def memory_reader(
    platform: str | None = None,
    device_index: int = 0,
    *,
    per_process: bool | None = None,
    factories: dict[str, list[ReaderFactory]] | None = None,
) -> MemoryReader:
    """The best available reader for ``platform`` (detected when None) and torch's device index.

    CUDA: NVML per-process, NVML whole-device, ``torch.cuda.mem_get_info``. ROCm: the same with
    amdsmi. CPU: this process's RSS. ``per_process=None`` (the default) prefers the per-process
    reader where the library can attribute memory to processes; ``True`` insists on it;
    ``False`` reads the whole device. A reader whose library is missing or fails is skipped.
    """
    if platform is None:
        platform = detect_platform()
    validate_platform(platform, allow_auto=False)
    if per_process not in (None, True, False):
        raise ValueError(f"per_process: expected None, True or False, got {per_process!r}")
    chains = factories if factories is not None else default_factories(per_process)
    errors: list[str] = []
    for factory in chains[platform]:
        try:
            return factory(device_index)
        except Exception as exc:  # noqa: BLE001 - a missing library means: try the next one
            errors.append(f"{_factory_name(factory)}: {exc}")
    raise RuntimeError(f"no device-memory reader works on {platform}: {'; '.join(errors)}")


def _factory_name(factory: Any) -> str:
    return str(getattr(factory, "__name__", factory))
