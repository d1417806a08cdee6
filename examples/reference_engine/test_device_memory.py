"""Device memory back to its baseline after shutdown: ``assert_device_memory_released``.

``memory_reader`` picks the reader for the platform: NVML (CUDA) or amdsmi (ROCm), falling back
to ``torch.cuda.mem_get_info``; on a machine without a GPU, this process's RSS stands in, so the
same test runs everywhere (scripts/gpu-check runs the engine tests on the real device).

The baseline is read after this process's CUDA/HIP context exists (the autouse fixture below):
the context holds about 0.5 GiB on Hopper for the life of the process, and is no leak.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the reference engine needs torch (extra 'engine')")

from pytest_shutdown import assert_device_memory_released  # noqa: E402
from pytest_shutdown.devices import (
    establish_device_context,  # noqa: E402
    memory_reader,  # noqa: E402
)
from pytest_shutdown.engine import (  # noqa: E402
    EngineConfig,
    EngineCore,
)

MiB = 2**20


@pytest.fixture(autouse=True)
def device_context_first(engine_config: EngineConfig) -> None:
    establish_device_context(engine_config.device)


@pytest.mark.engine(kv_cache_bytes=256 * MiB)
def test_kv_cache_memory_returns_after_shutdown(engine_config: EngineConfig) -> None:
    reader = memory_reader(engine_config.resolved_platform)
    baseline = reader.used_bytes()

    core = EngineCore(engine_config)
    assert reader.used_bytes() > baseline + 128 * MiB, "the KV cache was not allocated"
    core.shutdown()

    assert_device_memory_released(reader, baseline, tolerance_bytes=64 * MiB, timeout=30.0)
