"""GPU paths that are right by construction (DESIGN §7, "GPU rules").

* :mod:`~pytest_shutdown.gpu.visibility`: torch's device index → the NVML / amdsmi device, through
  ``CUDA_VISIBLE_DEVICES`` (indices, UUIDs, MIG) and ``ROCR``/``HIP_VISIBLE_DEVICES``.
* :mod:`~pytest_shutdown.gpu.detect`: which platform, counted through NVML / amdsmi: never
  initialises CUDA (nor poisons ``fork``) in the calling process.
* :mod:`~pytest_shutdown.gpu.readers`: device-memory readers, whole-device and per-process.
* :mod:`~pytest_shutdown.gpu.placement`: which device a data-parallel rank uses.
* :mod:`~pytest_shutdown.gpu.forking`: when ``fork`` is refused, and what a forked child resets.

Nothing here imports torch, NVML or amdsmi at import time.
"""
