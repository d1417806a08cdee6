"""EngineConfig: every knob of the reference engine, validated when it is built."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

PLATFORM_CHOICES = ("auto", "cuda", "rocm", "cpu")
START_METHODS = ("forkserver", "spawn", "fork")
#: ``EngineConfig.process_group``: none, a backend, or "auto" (nccl on a CUDA device, else gloo).
PROCESS_GROUP_CHOICES = ("off", "auto", "gloo", "nccl")

# Fields that must be finite and >= 0 (None allowed where the type says so).
_NON_NEGATIVE = (
    "shutdown_timeout",
    "rocm_process_grace_s",
    "child_exit_grace_s",
    "default_process_timeout_s",
    "startup_timeout_s",
    "teardown_delay_s",
    "step_delay_s",
    "startup_delay_s",
    "collective_straggle_s",
)
# Deadlines that must be finite and > 0.
_POSITIVE = (
    "store_timeout_s",
    "collective_timeout_s",
    "barrier_timeout_s",
    "collective_abort_grace_s",
)
_CHOICES = (
    ("platform", PLATFORM_CHOICES),
    ("start_method", START_METHODS),
    ("process_group", PROCESS_GROUP_CHOICES),
    ("dp_process_group", PROCESS_GROUP_CHOICES),
)
_POSITIVE_INTS = (
    "renderer_num_workers",
    "mm_cache_size",
    "vocab_size",
    "hidden_size",
    "kv_cache_bytes",
    "data_parallel_size",
    "tensor_parallel_size",
)


@dataclass(frozen=True)
class EngineConfig:
    """Configuration of the reference engine.

    ``platform`` decides every platform-dependent policy; a forced ``"rocm"`` on a machine without
    a GPU keeps tensors on the CPU but takes every ROCm decision (grace, ``gc.freeze``). All
    grace constants live here so that tests can scale a 15 s grace down to a fraction of a second
    and still exercise the same decisions.
    """

    platform: str = "auto"
    #: The request-drain budget given to EngineCore on shutdown; 0 aborts requests at once;
    #: None lets the parent's process timeout decide.
    shutdown_timeout: float | None = 0.0
    #: Cleanup grace given to a ROCm EngineCore process after an immediate abort (request and
    #: process timeouts both 0): a SIGKILLed ROCm process can keep its VRAM held for long.
    rocm_process_grace_s: float = 15.0
    #: What the DP supervisor adds to its children's process timeout before it kills them.
    child_exit_grace_s: float = 5.0
    #: Process timeout used by shutdown_processes when the caller passes None.
    default_process_timeout_s: float = 5.0
    renderer_num_workers: int = 2
    mm_cache_size: int = 32
    vocab_size: int = 256
    hidden_size: int = 32
    kv_cache_bytes: int = 1 << 20
    data_parallel_size: int = 1
    #: Worker processes ``Worker_TP{i}`` per EngineCore holding the device state; 1 keeps the
    #: device state in the EngineCore process itself (vLLM's single-process executor).
    tensor_parallel_size: int = 1
    start_method: str = "forkserver"
    startup_timeout_s: float = 60.0
    #: Model loading: every worker (the EngineCore itself when tp=1) takes this long to start;
    #: interruptible by a signal or the death of its parent.
    startup_delay_s: float = 0.0
    #: Fault injection: sleep inside EngineCore.shutdown, like a slow ROCm teardown.
    teardown_delay_s: float = 0.0
    #: Fault injection: sleep inside every EngineCore.step.
    step_delay_s: float = 0.0
    #: The TP workers of each EngineCore form a ``torch.distributed`` group ("off": none; "auto":
    #: nccl on a CUDA device, else gloo) and run one collective per engine step.
    process_group: str = "off"
    #: The EngineCores form a group of their own when dp > 1 (choices as ``process_group``)
    #: and stop together (vLLM's ``DPEngineCoreProc``); the deadlines below apply to it too.
    dp_process_group: str = "off"
    #: Connecting to the group's store (hosted by the EngineCore) and waiting in it.
    store_timeout_s: float = 30.0
    #: ``init_process_group``'s timeout; gloo bounds every collective by it too.
    collective_timeout_s: float = 30.0
    #: The teardown barrier before ``destroy_process_group``.
    barrier_timeout_s: float = 1.0
    #: How long a rank told to stop may stay inside a collective before it is ended (aborted).
    collective_abort_grace_s: float = 1.0
    #: Fault injection: the last TP rank enters every collective this late (a straggler).
    collective_straggle_s: float = 0.0
    #: Derived from ``platform``: the torch device string tensors are placed on.
    device: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name, accepted in _CHOICES:
            if getattr(self, name) not in accepted:
                raise ValueError(
                    f"EngineConfig.{name}: unknown value {getattr(self, name)!r}; "
                    f"accepted: {', '.join(accepted)}"
                )
        for name in _NON_NEGATIVE:
            _check_non_negative(name, getattr(self, name))
        for name in _POSITIVE:
            _check_non_negative(name, getattr(self, name))
            if getattr(self, name) == 0:
                raise ValueError(f"EngineConfig.{name}: expected seconds > 0, got 0")
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name}: expected a positive integer, got {value!r}")
        if not self.device:
            object.__setattr__(self, "device", _device_for(self.resolved_platform))

    @property
    def resolved_platform(self) -> str:
        """The platform whose decisions the engine takes (``auto`` → detected)."""
        if self.platform != "auto":
            return self.platform
        from pytest_shutdown.gpu.detect import detect_platform  # noqa: PLC0415

        return detect_platform()

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes`` applied (and validated); ``device`` is derived again."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            accepted = ", ".join(f.name for f in fields(self))
            raise ValueError(
                f"EngineConfig: unknown field(s) {', '.join(sorted(unknown))}; accepted: {accepted}"
            )
        changes.setdefault("device", "")
        return replace(self, **changes)


def _check_non_negative(name: str, value: object) -> None:
    if value is None and name == "shutdown_timeout":
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"EngineConfig.{name}: expected a number >= 0, got {value!r}")
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise ValueError(f"EngineConfig.{name}: expected a finite number >= 0, got {value!r}")


def _device_for(platform: str) -> str:
    """The torch device for ``platform`` on this machine: the GPU only if one is really there."""
    if platform in ("cuda", "rocm"):
        from pytest_shutdown.gpu.detect import detect_platform  # noqa: PLC0415

        if detect_platform() == platform:
            return "cuda"  # ROCm builds of torch address HIP devices as "cuda" too
    return "cpu"
