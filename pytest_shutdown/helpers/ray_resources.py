"""``ray-resource-left``: what an engine on Ray leaves on the cluster after its shutdown.

Its actors alive, its placement groups not removed, the cluster's available resources below
their baseline, its ``ray::`` workers running: each waited for (Ray releases asynchronously)
against one deadline. Objects are recognised by name prefix, workers by pid. Ray is imported
only by these functions (they need a connected driver).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

import psutil

from pytest_shutdown.findings.finding import Finding, raise_if_any

#: How long Ray gets to release what a shutdown let go.
RELEASE_DEADLINE_S = 30.0
POLL_S = 0.25
#: Resources that are bookkeeping, not capacity (per-node markers, memory estimates).
_NOT_CAPACITY = ("node:", "memory", "object_store_memory")


def _alive_actors(prefix: str) -> list[dict[str, Any]]:
    from ray._private import state  # noqa: PLC0415

    return [
        {
            "actor_id": actor_id,
            "name": info.get("Name", ""),
            "class": info.get("ActorClassName", ""),
            "state": info.get("State"),
            "pid": info.get("Pid"),
        }
        for actor_id, info in state.actors().items()
        if str(info.get("Name", "")).startswith(prefix) and info.get("State") != "DEAD"
    ]


def _live_groups(prefix: str) -> list[dict[str, Any]]:
    import ray  # noqa: PLC0415

    return [
        {"placement_group_id": pg_id, "name": info.get("name", ""), "state": info.get("state")}
        for pg_id, info in ray.util.placement_group_table().items()
        if str(info.get("name", "")).startswith(prefix) and info.get("state") != "REMOVED"
    ]


def _capacity(resources: Mapping[str, float]) -> dict[str, float]:
    skip = (*_NOT_CAPACITY, "bundle_group_")
    return {k: round(float(v), 3) for k, v in resources.items() if not k.startswith(skip)}


def _resource_gap(baseline: Mapping[str, float]) -> dict[str, dict[str, float]]:
    import ray  # noqa: PLC0415

    now = _capacity(ray.available_resources())
    before = _capacity(baseline)
    return {
        k: {"baseline": v, "now": now.get(k, 0.0)} for k, v in before.items() if now.get(k, 0.0) < v
    }


def _live_workers(pids: Iterable[int]) -> list[dict[str, Any]]:
    found = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            found.append({"pid": pid, "name": proc.name(), "cmdline": proc.cmdline()[:3]})
        except psutil.Error:
            continue
    return found


def ray_leftovers(
    prefix: str,
    baseline: Mapping[str, float] | None = None,
    *,
    pids: Iterable[int] = (),
    subject: str = "the engine",
    deadline_s: float = RELEASE_DEADLINE_S,
) -> list[Finding]:
    """What ``subject`` left on the cluster ``deadline_s`` after its shutdown, as findings.

    ``prefix``: the name prefix of its actors and placement groups; ``baseline``: the cluster's
    available resources before it started (None: not compared); ``pids``: its actors' worker
    processes (``ray::...``).
    """
    pids = list(pids)
    deadline = time.monotonic() + deadline_s
    while True:
        actors = _alive_actors(prefix)
        groups = _live_groups(prefix)
        gap = _resource_gap(baseline) if baseline is not None else {}
        workers = _live_workers(pids)
        if not (actors or groups or gap or workers) or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    after = f"{deadline_s:g} s after its shutdown"

    def left(kind: str, text: str, item: dict[str, Any]) -> Finding:
        return Finding("ray-resource-left", text, {"kind": kind, "subject": subject, **item})

    findings = []
    for a in actors:
        text = f"actor {a['name']} ({a['class']}) of {subject} is still {a['state']} {after}"
        findings.append(left("actor", text, a))
    for g in groups:
        text = f"placement group {g['name']} of {subject} is still {g['state']} (not removed)"
        findings.append(left("placement_group", f"{text} {after}", g))
    if gap:
        short = ", ".join(f"{k} {v['now']:g} of {v['baseline']:g}" for k, v in gap.items())
        text = f"the cluster's available resources are not back to their baseline after {subject}'s"
        findings.append(left("resources", f"{text} shutdown: {short}", {"resources": gap}))
    for w in workers:
        text = f"worker process {w['name']} (pid {w['pid']}) of {subject} is still running {after}"
        findings.append(left("worker_process", text, w))
    return findings


def assert_ray_released(
    prefix: str,
    baseline: Mapping[str, float] | None = None,
    *,
    pids: Iterable[int] = (),
    subject: str = "the engine",
    deadline_s: float = RELEASE_DEADLINE_S,
) -> None:
    """Raise ``ray-resource-left`` findings for what ``subject`` left on the Ray cluster."""
    __tracebackhide__ = True
    found = ray_leftovers(prefix, baseline, pids=pids, subject=subject, deadline_s=deadline_s)
    raise_if_any(found)


def release_ray_leftovers(prefix: str) -> None:
    """Kill the live actors and remove the placement groups whose names start with ``prefix``.

    For a test that demonstrated a leak: what it left must not reach the next test.
    """
    import ray  # noqa: PLC0415
    from ray.util.placement_group import PlacementGroup, remove_placement_group  # noqa: PLC0415

    for actor in _alive_actors(prefix):
        with contextlib.suppress(Exception):  # already gone
            ray.kill(ray.get_actor(actor["name"]), no_restart=True)  # this driver's namespace
    for group in _live_groups(prefix):
        with contextlib.suppress(Exception):  # already removed
            group_id = ray.PlacementGroupID(bytes.fromhex(group["placement_group_id"]))
            remove_placement_group(PlacementGroup(group_id))
