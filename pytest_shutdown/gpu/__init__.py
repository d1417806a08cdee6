"""GPU paths that are right by construction (DESIGN §7, "GPU rules"): visibility, detection,
readers, placement and forking. Nothing here imports torch, NVML or amdsmi at import time."""
