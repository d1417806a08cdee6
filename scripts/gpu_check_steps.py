"""The steps of scripts/gpu-check, each in a fresh interpreter: ``python gpu_check_steps.py STEP``.

Each step prints what it measured and ends with one line ``RESULT PASS|FAIL <why>``; its exit
status is 0 only on PASS. The decisions (``platform_verdict``, ``ran_on_device``,
``memory_returned``) are plain functions, tested on the CPU with fakes in tests/gpu/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20
KV_BYTES = 1 << 30  # 1 GiB: a leak cannot hide in the noise
TOLERANCE = 128 * MiB  # allocator slack and the neighbours of a whole-device reading
RETURN_WITHIN_S = 30.0


# -- decisions ---------------------------------------------------------------------------------
def platform_verdict(hardware: str, platform: str, torch_info: str) -> tuple[bool, str]:
    """GPU hardware present (``hardware`` = cuda|rocm|none) but torch on the CPU is a failure."""
    if hardware == "none":
        if platform == "cpu":
            return True, "no GPU hardware and torch on the CPU: nothing to check"
        return True, f"torch sees {platform} although no GPU tool answered"
    if platform == "cpu":
        return False, (
            f"GPU hardware is present ({hardware}) but torch runs on the CPU ({torch_info}): "
            "install a CUDA/ROCm build of torch, or use `make venv USE_SYSTEM_TORCH=1`"
        )
    if platform != hardware:
        return False, f"the hardware is {hardware} but torch is a {platform} build ({torch_info})"
    return True, f"torch runs on {platform} ({torch_info})"


def ran_on_device(baseline: int, loaded: int, kv_bytes: int = KV_BYTES) -> bool:
    """The engine's KV cache is on the device: the reading grew by most of it while loaded."""
    return loaded - baseline >= 0.8 * kv_bytes


def memory_returned(baseline: int, after: int, tolerance: int = TOLERANCE) -> bool:
    return after <= baseline + tolerance


def nccl_verdict(
    mode: str, ending: str, baseline: int, loaded: int, after: int, shutdown_s: float,
    *, kv_bytes: int = KV_BYTES, limit_s: float = 30.0,
) -> tuple[bool, str]:
    """One nccl rank's teardown: ended as asked (destroy: "destroyed"; abort: "aborted"), its KV
    cache was on the device, the device memory came back, and the teardown had a deadline."""
    expected = {"destroy": "destroyed", "abort": "aborted"}[mode]
    problems = []
    if ending != expected:
        problems.append(f"ended {ending!r}, expected {expected!r}")
    if not ran_on_device(baseline, loaded, kv_bytes):
        problems.append("the KV cache was not on the device")
    if not memory_returned(baseline, after):
        problems.append(f"{(after - baseline) / MiB:.0f} MiB not returned")
    if shutdown_s > limit_s:
        problems.append(f"teardown took {shutdown_s:.1f} s > {limit_s:g} s")
    return not problems, "; ".join(problems) or f"{mode}: {ending}, memory back"


def result(ok: bool, why: str) -> int:
    print(f"RESULT {'PASS' if ok else 'FAIL'} {why}", flush=True)
    return 0 if ok else 1


# -- steps -------------------------------------------------------------------------------------
def step_detect() -> int:
    import torch

    from pytest_shutdown.devices import detect_platform

    platform = detect_platform()
    info = {"platform": platform, "torch": torch.__version__, "cuda": torch.version.cuda,
            "hip": torch.version.hip, "initialized": torch.cuda.is_initialized()}
    print(json.dumps(info))
    hardware = os.environ.get("GPU_CHECK_HARDWARE", "none")
    ok, why = platform_verdict(
        hardware, platform, f"torch {torch.__version__}, cuda={torch.version.cuda}, "
        f"hip={torch.version.hip}")
    if ok and info["initialized"]:
        ok, why = False, "detection initialised CUDA in the calling process"
    return result(ok, why)


def _platform() -> str:
    from pytest_shutdown.devices import detect_platform

    return detect_platform()


def _engine_check(label: str, config, *, multiprocess: bool, shutdown_timeout, per_process):
    """Start, load, shut down; (ok, line) with the readings of the reader kind asked for."""
    from pytest_shutdown.devices import memory_reader
    from pytest_shutdown.engine.llm import ReferenceLLM

    reader = memory_reader(config.resolved_platform, per_process=per_process)
    baseline = reader.used_bytes()
    llm = ReferenceLLM(config, multiprocess=multiprocess)
    llm.generate(["gpu-check"], max_tokens=4)
    loaded = reader.used_bytes()
    started = time.monotonic()
    llm.shutdown(shutdown_timeout)
    shutdown_s = time.monotonic() - started
    used = reader.used_bytes()
    while not memory_returned(baseline, used) and time.monotonic() - started < RETURN_WITHIN_S:
        time.sleep(0.25)
        used = reader.used_bytes()
    outcome = llm.manager.last_outcome if llm.manager is not None else None
    on_device = ran_on_device(baseline, loaded)
    back = memory_returned(baseline, used)
    forced = sorted(outcome.force_killed) if outcome is not None else []
    ok = on_device and back  # 0/0 force-kills at once off ROCm (R6): reported, not a failure
    line = (f"{label:<36} reader={reader.name:<22} baseline={baseline / MiB:9.1f} MiB "
            f"loaded={loaded / MiB:9.1f} MiB after={used / MiB:9.1f} MiB "
            f"shutdown={shutdown_s:5.2f} s on_device={on_device} returned={back} "
            f"force_killed={forced} {'OK' if ok else 'FAILED'}")
    print(line, flush=True)
    return ok


def step_engines(per_process_modes=(None,)) -> int:
    from pytest_shutdown.engine.config import EngineConfig
    from pytest_shutdown.gpu.placement import establish_device_context

    platform = _platform()
    if platform == "cpu":
        return result(False, "torch runs on the CPU: no engine can run on the device")
    base = EngineConfig(platform=platform, kv_cache_bytes=KV_BYTES, shutdown_timeout=0.0)
    oks = []
    for per_process in per_process_modes:
        kind = {None: "default", True: "per-process", False: "whole-device"}[per_process]
        oks.append(_engine_check(f"[{kind}] processes, abort (0/0)", base,
                                 multiprocess=True, shutdown_timeout=0.0, per_process=per_process))
        drain = base.replace(shutdown_timeout=5.0)
        oks.append(_engine_check(f"[{kind}] processes, drain 5 s", drain,
                                 multiprocess=True, shutdown_timeout=None, per_process=per_process))
        dp2 = base.replace(data_parallel_size=2)
        oks.append(_engine_check(f"[{kind}] processes dp=2, abort", dp2,
                                 multiprocess=True, shutdown_timeout=0.0, per_process=per_process))
    # In-process last: its CUDA context outlives the engine, so it is made before the baseline.
    establish_device_context(base.device)
    for per_process in per_process_modes:
        kind = {None: "default", True: "per-process", False: "whole-device"}[per_process]
        oks.append(_engine_check(f"[{kind}] in-process", base, multiprocess=False,
                                 shutdown_timeout=None, per_process=per_process))
    return result(all(oks), f"{sum(oks)}/{len(oks)} engine checks on {platform}")


def step_memory() -> int:
    from pytest_shutdown.devices import memory_reader

    platform = _platform()
    modes: list[bool | None] = [False]
    try:
        memory_reader(platform, per_process=True)
        modes.append(True)
    except RuntimeError as exc:
        print(f"per-process reader unavailable here: {exc}")
    return step_engines(tuple(modes))


def step_start_method(method: str) -> int:
    from pytest_shutdown.engine.config import EngineConfig
    from pytest_shutdown.engine.llm import ReferenceLLM
    from pytest_shutdown.gpu.forking import ForkRefusedError

    platform = _platform()
    config = EngineConfig(platform=platform, start_method=method, shutdown_timeout=0.0)
    try:
        with ReferenceLLM(config) as llm:
            tokens = llm.generate("start", max_tokens=3)[0].token_ids
    except ForkRefusedError as exc:
        return result(method == "fork" and platform == "rocm", f"fork refused: {exc}")
    outcome = llm.manager.last_outcome if llm.manager is not None else None
    exitcodes = outcome.exitcodes if outcome is not None else {}
    ok = len(tokens) == 3 and set(exitcodes.values()) == {0}
    return result(ok, f"{method} on {platform}: tokens={tokens} exitcodes={exitcodes}")


PER_WORKER_TEST = '''
import os, torch
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.core import EngineCore

def test_worker_device(worker_id, tmp_path_factory):
    core = EngineCore(EngineConfig(platform="auto", kv_cache_bytes=64 << 20))
    seen = {"worker": worker_id, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "hip": os.environ.get("HIP_VISIBLE_DEVICES"), "count": torch.cuda.device_count(),
            "device": str(core.kv_cache.device),
            "uuid": str(torch.cuda.get_device_properties(0).uuid)}
    core.shutdown()
    out = os.environ["GPU_CHECK_PER_WORKER_OUT"]
    with open(os.path.join(out, worker_id + ".json"), "w") as f:
        f.write(__import__("json").dumps(seen))
'''


def step_per_worker() -> int:
    import torch

    count = torch.cuda.device_count()  # this step's own interpreter: initialising is fine
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "test_per_worker.py").write_text(PER_WORKER_TEST)
        out = Path(folder, "out")
        out.mkdir()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "xdist", "-n", "2", "-p", "shutdown",
             "--shutdown-gpu-per-worker", "-p", "no:cacheprovider", folder],
            capture_output=True, text=True, timeout=240,
            env={**os.environ, "GPU_CHECK_PER_WORKER_OUT": str(out)},
        )
        print(done.stdout[-4000:], done.stderr[-2000:])
        seen = [json.loads(p.read_text()) for p in sorted(out.glob("gw*.json"))]
    print(json.dumps(seen, indent=1))
    if done.returncode != 0 or len(seen) != 2:
        return result(False, f"pytest -n 2 exited {done.returncode}; {len(seen)} worker reports")
    one_each = all(s["count"] == 1 and s["device"].startswith("cuda") for s in seen)
    distinct = len({s["uuid"] for s in seen}) == min(2, count)
    shared_said = count >= 2 or "share" in done.stdout
    ok = one_each and distinct and shared_said
    return result(ok, f"{count} GPU(s): workers saw {[s['uuid'][-8:] for s in seen]}")


def _nccl_rank(mode: str, conn) -> None:
    """One nccl rank in its own process: join, allocate, a collective, tear down as ``mode``."""
    import torch

    from pytest_shutdown.engine.distributed import GroupDeadlines, RankGroup, free_port, host_store

    deadlines = GroupDeadlines(store_timeout_s=30.0, collective_timeout_s=30.0,
                               barrier_timeout_s=10.0)
    port = free_port()
    store = host_store(port, 1, deadlines)
    group = RankGroup(0, 1, port, backend="nccl", device="cuda:0", deadlines=deadlines)
    group.join()
    kv = torch.zeros(KV_BYTES // 4, dtype=torch.float32, device="cuda:0")
    group.step()
    torch.cuda.synchronize()
    conn.send("loaded")
    conn.recv()  # the parent has read the device memory
    started = time.monotonic()
    ending = group.shutdown(peer_gone=(mode == "abort"))
    shutdown_s = time.monotonic() - started
    del kv, store
    torch.cuda.empty_cache()
    conn.send((ending, shutdown_s))


def step_nccl() -> int:
    """nccl, one rank: destroy versus abort; device memory back to its baseline after each."""
    import multiprocessing

    from pytest_shutdown.devices import memory_reader
    from pytest_shutdown.engine.distributed import select_backend

    platform = _platform()
    if platform == "cpu":
        return result(False, "torch runs on the CPU: no nccl group can run on the device")
    backend = select_backend("auto", "cuda")
    if backend != "nccl":
        return result(False, f"torch on {platform} has no nccl (auto chose {backend})")
    reader = memory_reader(platform)
    ctx = multiprocessing.get_context("spawn")
    oks = []
    for mode in ("destroy", "abort"):
        baseline = reader.used_bytes()
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_nccl_rank, args=(mode, child), name=f"nccl-{mode}")
        proc.start()
        if not parent.poll(120):
            proc.kill()
            return result(False, f"{mode}: the rank was not loaded within 120 s")
        parent.recv()
        loaded = reader.used_bytes()
        parent.send("go")
        ending, shutdown_s = parent.recv() if parent.poll(60) else ("no answer", 60.0)
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        started = time.monotonic()
        after = reader.used_bytes()
        while not memory_returned(baseline, after) and time.monotonic() - started < RETURN_WITHIN_S:
            time.sleep(0.25)
            after = reader.used_bytes()
        ok, why = nccl_verdict(mode, ending, baseline, loaded, after, shutdown_s)
        print(f"nccl {mode:<8} baseline={baseline / MiB:9.1f} MiB loaded={loaded / MiB:9.1f} MiB "
              f"after={after / MiB:9.1f} MiB teardown={shutdown_s:5.2f} s exit={proc.exitcode} "
              f"{'OK' if ok else 'FAILED: ' + why}", flush=True)
        oks.append(ok and proc.exitcode == 0)
    return result(all(oks), f"{sum(oks)}/2 nccl teardowns (destroy, abort) on {platform}")


STEPS = {
    "detect": step_detect,
    "engines": step_engines,
    "memory": step_memory,
    "per-worker": step_per_worker,
    "nccl": step_nccl,
}

if __name__ == "__main__":  # engine processes re-import this file: guard the main
    name = sys.argv[1]
    if name.startswith("start-method="):
        sys.exit(step_start_method(name.split("=", 1)[1]))
    sys.exit(STEPS[name]())
