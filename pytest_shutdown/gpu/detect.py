"""Which platform this process runs on, found without initialising CUDA here.

``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``, which registers torch's fork hook:
every later ``fork`` child then fails with "Cannot re-initialize CUDA in forked subprocess". So,
as vLLM does, devices are counted through NVML or amdsmi, then torch's own NVML/amdsmi-based
count, and only if neither works in a child interpreter. A CPU build of torch means ``"cpu"``.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pytest_shutdown.gpu import visibility
from pytest_shutdown.gpu.readers import _shut_down as _quietly

Platform = Literal["cuda", "rocm", "cpu"]
PLATFORMS: tuple[Platform, ...] = ("cuda", "rocm", "cpu")

PROBE_TIMEOUT_S = 120.0

_cache: dict[tuple[str, ...], int] = {}


def validate_platform(value: str, *, option: str = "platform", allow_auto: bool = True) -> str:
    """Return ``value`` if it names a platform, else raise ``ValueError`` naming ``option``."""
    accepted = (("auto",) if allow_auto else ()) + PLATFORMS
    if value not in accepted:
        raise ValueError(f"{option}: unknown platform {value!r}; accepted: {', '.join(accepted)}")
    return value


def torch_build(torch: Any) -> Platform:
    """The platform a torch build targets: ROCm builds expose HIP devices through torch.cuda."""
    version = getattr(torch, "version", None)
    if getattr(version, "hip", None):
        return "rocm"
    if getattr(version, "cuda", None):
        return "cuda"
    return "cpu"


def nvidia_device_count(
    environ: Mapping[str, str] | None = None, nvml: Any = None
) -> int | None:
    """GPUs CUDA will show this process, counted by NVML; None when NVML does not work."""
    env = os.environ if environ is None else environ
    return _library_count(
        nvml, "pynvml", "nvmlInit", "nvmlShutdown", lambda n: visibility.nvml_visible_count(n, env)
    )


def amd_device_count(environ: Mapping[str, str] | None = None, amdsmi: Any = None) -> int | None:
    """GPUs HIP will show this process, counted by amdsmi; None when amdsmi does not work."""
    env = os.environ if environ is None else environ
    visibility.hip_visible(env)  # the conflict is an error, not "no device"
    return _library_count(
        amdsmi,
        "amdsmi",
        "amdsmi_init",
        "amdsmi_shut_down",
        lambda a: len(visibility.amdsmi_visible_handles(a, env)),
    )


def _library_count(
    library: Any, module: str, init: str, shutdown: str, count: Callable[[Any], int]
) -> int | None:
    """``count(library)`` between the library's init and shutdown; None when either fails."""
    try:
        if library is None:
            library = importlib.import_module(module)
        getattr(library, init)()
    except Exception:  # noqa: BLE001 - no library or no driver: it cannot say
        return None
    try:
        return count(library)
    except Exception:  # noqa: BLE001
        return None
    finally:
        _quietly(getattr(library, shutdown))


def hardware_platform(
    environ: Mapping[str, str] | None = None, nvml: Any = None, amdsmi: Any = None
) -> tuple[Platform, int]:
    """(platform, visible device count) from NVML, then amdsmi; no torch."""
    count = nvidia_device_count(environ, nvml)
    if count:
        return "cuda", count
    count = amd_device_count(environ, amdsmi)
    if count:
        return "rocm", count
    return "cpu", 0


def visible_device_count(torch: Any, build: Platform | None = None) -> int:
    """Devices torch will show this process, never initialising CUDA/HIP here."""
    build = build or torch_build(torch)
    if build == "cpu":
        return 0
    cuda = getattr(torch, "cuda", None)
    is_initialized = getattr(cuda, "is_initialized", None)
    if cuda is not None and is_initialized is not None and is_initialized():
        return int(cuda.device_count())  # already initialised: counting costs nothing more
    key = (build, *(f"{k}={os.environ.get(k)}" for k in visibility.VISIBILITY_VARIABLES[build]))
    if key in _cache:
        return _cache[key]
    count = nvidia_device_count() if build == "cuda" else amd_device_count()
    if count is None:
        count = _torch_library_count(cuda, build)
    if count is None:
        count = probe_device_count()
    _cache[key] = count
    return count


def detect_platform(torch_module: Any = None) -> Platform:
    """``"rocm"``, ``"cuda"`` or ``"cpu"``: where torch's tensors of this process can go.

    Never initialises CUDA/HIP in this process and never registers torch's fork hook.
    """
    torch = torch_module
    if torch is None:
        try:
            import torch  # noqa: PLC0415 - deliberately lazy
        except ImportError:
            return "cpu"
    build = torch_build(torch)
    if build == "cpu":
        return "cpu"
    try:
        count = visible_device_count(torch, build)
    except visibility.VisibilityError:
        raise
    except Exception:  # noqa: BLE001 - a broken driver is a machine without a usable GPU
        count = 0
    return build if count > 0 else "cpu"


def _torch_library_count(cuda: Any, build: Platform) -> int | None:
    """torch's own NVML/amdsmi-based count (private API; negative means it failed)."""
    name = "_device_count_nvml" if build == "cuda" else "_device_count_amdsmi"
    counter = getattr(cuda, name, None)
    if counter is None:
        return None
    try:
        count = int(counter())
    except Exception:  # noqa: BLE001
        return None
    return count if count >= 0 else None


PROBE_CODE = "import torch\nprint(torch.cuda.device_count())"


#: Device nodes a Linux GPU driver creates (NVIDIA, AMD KFD, WSL's GPU paravirtualisation).
DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def device_nodes_present(nodes: tuple[str, ...] | None = None) -> bool:
    """Whether any GPU driver node exists (always True off Linux, where this cannot tell)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(node) for node in (DEVICE_NODES if nodes is None else nodes))


def probe_device_count() -> int:
    """``torch.cuda.device_count()`` asked in a child interpreter; 0 without a driver node."""
    if not device_nodes_present():
        return 0
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE_CODE],
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True,
        )
        return int(out.stdout.split()[-1])
    except (subprocess.SubprocessError, ValueError, OSError, IndexError):
        return 0


def forget_counts() -> None:
    """Drop the cached counts (after a visibility variable changed in this process)."""
    _cache.clear()
