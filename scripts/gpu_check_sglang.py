"""One real SGLang Engine on the GPU: start, shut down, device memory back to its baseline.

    python scripts/gpu_check_sglang.py        (scripts/gpu-check runs it as the sglang-engine step)

Runs with a Python where ``sglang`` and ``sgl_kernel`` (sglang-kernel) import; otherwise prints
``SKIP <why>`` and exits 0, as on this project's CPU-only machines. The model is
``examples/sglang/tiny_model/config.json`` with dummy weights (``load_format="dummy"``): no
download. Device memory is read from outside the engine's processes (NVML/amdsmi whole-device
reader), so this process never initialises CUDA. Prints ``RESULT {...}`` as the other steps do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TINY_MODEL = Path(__file__).resolve().parent.parent / "examples" / "sglang" / "tiny_model"
#: Device memory the engine may leave in use after shutdown (allocator and driver noise).
TOLERANCE_BYTES = 64 * 1024 * 1024
SETTLE_TIMEOUT_S = 60.0


def why_not_here() -> str | None:
    """Why this machine cannot run a real Engine, or None when it can."""
    try:
        import sglang  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure is a reason to skip
        return f"sglang does not import with {sys.executable}: {exc}"
    try:
        import sgl_kernel  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"sglang-kernel (sgl_kernel) does not load: {exc}"
    from pytest_shutdown.devices import detect_platform

    platform = detect_platform()
    if platform == "cpu":
        return "no GPU: the platform detected is cpu"
    return None


def main() -> int:
    reason = why_not_here()
    if reason is not None:
        print(f"SKIP {reason}")
        print("RESULT " + json.dumps({"skipped": reason}))
        return 0
    from sglang.srt.entrypoints.engine import Engine

    from pytest_shutdown.devices import detect_platform, memory_reader

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    reader = memory_reader(detect_platform(), per_process=False)
    baseline = reader.used_bytes()
    started = time.monotonic()
    engine = Engine(model_path=str(TINY_MODEL), load_format="dummy", skip_tokenizer_init=True,
                    mem_fraction_static=0.05, disable_cuda_graph=True)
    loaded = reader.used_bytes()
    engine.shutdown()
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    after = reader.used_bytes()
    while after > baseline + TOLERANCE_BYTES and time.monotonic() < deadline:
        time.sleep(0.5)
        after = reader.used_bytes()
    result = {
        "baseline_bytes": baseline, "loaded_bytes": loaded, "after_shutdown_bytes": after,
        "tolerance_bytes": TOLERANCE_BYTES, "seconds": round(time.monotonic() - started, 1),
    }
    print("RESULT " + json.dumps(result))
    if loaded <= baseline:
        print("FAIL the engine did not use the device (loaded <= baseline)")
        return 1
    if after > baseline + TOLERANCE_BYTES:
        print("FAIL device memory did not return to its baseline after Engine.shutdown()")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
