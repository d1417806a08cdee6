"""When ``fork`` is refused, and what a forked engine process resets first.

* **CUDA.** Once torch asked the CUDA runtime anything (``torch.cuda.is_available()`` without
  NVML), its fork hook marks every child "bad": "Cannot re-initialize CUDA in forked
  subprocess". ROCm is stricter: vLLM never forks there. So ``fork`` is refused, with the reason.
* **OpenMP.** After parallel CPU torch work the parent holds an OpenMP pool; a child inherits its
  bookkeeping without its threads and its first parallel region waits forever. A forked engine
  process runs torch with one intra-op thread, the one setting that never touches the pool.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class ForkRefusedError(RuntimeError):
    """``start_method="fork"`` would start an engine process that cannot work."""


def _torch() -> Any:
    return sys.modules.get("torch")  # only a torch that is already imported can be initialised


def cuda_initialized(torch: Any = None) -> bool:
    """Whether CUDA/HIP is initialised in this process (never initialises it)."""
    torch = torch if torch is not None else _torch()
    if torch is None:
        return False
    is_initialized = getattr(getattr(torch, "cuda", None), "is_initialized", None)
    return bool(is_initialized()) if is_initialized is not None else False


def fork_poisoned(torch: Any = None) -> bool:
    """Whether a child forked now would be in torch's "bad fork" state: the hook is invisible
    from Python, so a real fork tells (a few ms). CPU builds have no hook."""
    torch = torch if torch is not None else _torch()
    if torch is None:
        return False
    version = getattr(torch, "version", None)
    if not (getattr(version, "cuda", None) or getattr(version, "hip", None)):
        return False
    in_bad_fork = getattr(getattr(torch, "cuda", None), "_is_in_bad_fork", None)
    if in_bad_fork is None:
        return False
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only answers and leaves
        try:
            os.write(write, b"1" if in_bad_fork() else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        answer = os.read(read, 1)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return answer == b"1"


def fork_refusal(platform: str, device: str, torch: Any = None) -> str | None:
    """Why an engine for ``platform`` on ``device`` must not be forked from here; None if it may."""
    if platform == "rocm" and device != "cpu":
        return (
            "the engine runs on a ROCm GPU, where a forked process cannot use the device "
            "(vLLM forces spawn on ROCm)"
        )
    if cuda_initialized(torch):
        return (
            f"CUDA is initialised in this process (pid {os.getpid()}): a forked child fails with "
            "'Cannot re-initialize CUDA in forked subprocess'"
        )
    if device != "cpu" and fork_poisoned(torch):
        return (
            f"torch has registered its CUDA fork hook in this process (pid {os.getpid()}), e.g. "
            "through torch.cuda.is_available() without PYTORCH_NVML_BASED_CUDA_CHECK=1: a forked "
            "child could not use the GPU"
        )
    return None


def check_fork_allowed(start_method: str, platform: str, device: str) -> None:
    """Raise :class:`ForkRefusedError` naming the reason when ``fork`` cannot work here."""
    if start_method != "fork":
        return
    reason = fork_refusal(platform, device)
    if reason is not None:
        raise ForkRefusedError(
            f"EngineConfig.start_method='fork' refused: {reason}. "
            "Use start_method='forkserver' (the default) or 'spawn'."
        )


def reset_after_fork(start_method: str) -> bool:
    """In a freshly forked engine process: one torch intra-op thread; True if it reset it."""
    if start_method != "fork":
        return False
    torch = _torch()
    if torch is None:
        return False
    torch.set_num_threads(1)
    return True
