"""Engine start-to-ready and graceful stop: the default start method against spawn, in one run.

Start-to-ready is the wall time of the ``EngineProcManager`` constructor (one EngineCore on the
CPU): it returns once the engine process reported ready. The first start of a start method is
reported apart from the later ones: under the default (``forkserver``) it also starts the fork
server, which imports torch and freezes its heap once per parent process. Graceful stop is
``shutdown()`` of the idle engine: SIGTERM, the engine aborts (``shutdown_timeout == 0``),
cleans up and exits; the wall time until the process is reaped. Figures are medians: the machine
is shared, so single runs are noisy. Not a test: nothing is asserted.

    .venv/bin/python benchmarks/engine_lifecycle.py [--starts 24] [--spawn-starts 4] [--json PATH]

Under forkserver and spawn every engine process re-runs this script as ``__mp_main__``: it
imports only light standard-library modules at the top; ``figures`` and the engine are imported
where they are used, so that an engine's start-up does not pay for them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from figures import Figure

#: Pause with the engine idle before stopping it, and between engines.
IDLE_S = 0.05

STOP_PATHS = {
    "forkserver": "SIGTERM; loop woken via the signal wake-up fd; abort; cleanup; the fork "
    "server child ends in os._exit (no interpreter finalization)",
    "spawn": "SIGTERM; loop woken via the signal wake-up fd; abort; cleanup; os._exit with the "
    "same exit code from the first atexit callback (interpreter finalization skipped)",
    "fork": "SIGTERM; loop woken via the signal wake-up fd; abort; cleanup; the forked child "
    "ends in os._exit (no interpreter finalization)",
}


@dataclass
class Lifecycles:
    """Start and stop times of ``count`` engines started one after the other."""

    start_method: str
    starts: list[float] = field(default_factory=list)
    stops: list[float] = field(default_factory=list)
    exitcodes: list[int | None] = field(default_factory=list)
    force_killed: int = 0

    @property
    def first_start(self) -> float:
        return self.starts[0]

    @property
    def later_starts(self) -> list[float]:
        return self.starts[1:]


def measure(start_method: str, count: int) -> Lifecycles:
    """Start, idle and stop ``count`` engines one after the other; ``count`` >= 2."""
    from pytest_shutdown.engine.config import EngineConfig  # noqa: PLC0415
    from pytest_shutdown.engine.processes import EngineProcManager  # noqa: PLC0415

    config = EngineConfig(platform="cpu", start_method=start_method)
    result = Lifecycles(start_method)
    for _ in range(count):
        t0 = time.perf_counter()
        manager: Any = EngineProcManager(config)
        result.starts.append(time.perf_counter() - t0)
        time.sleep(IDLE_S)
        t1 = time.perf_counter()
        outcome = manager.shutdown()
        result.stops.append(time.perf_counter() - t1)
        result.exitcodes.extend(outcome.exitcodes.values())
        result.force_killed += len(outcome.force_killed)
        time.sleep(IDLE_S)
    return result


def figures(default: Lifecycles, spawn: Lifecycles) -> list[Figure]:
    from figures import Figure, median_ms, spread_ms  # noqa: PLC0415

    d, s = default.start_method, spawn.start_method
    ratio = median_ms(spawn.later_starts) / median_ms(default.later_starts)
    first_ratio = spawn.first_start / default.first_start
    return [
        Figure(f"engine start, first ({d})", default.first_start * 1000, "ms",
               note="includes starting the fork server (torch import, heap freeze)"),
        Figure(f"engine start, later ({d}, median)", median_ms(default.later_starts), "ms",
               limit=50,
               note=f"{len(default.later_starts)} starts, {spread_ms(default.later_starts)}"),
        Figure(f"engine start, first ({s})", spawn.first_start * 1000, "ms"),
        Figure(f"engine start, later ({s}, median)", median_ms(spawn.later_starts), "ms",
               note=f"{len(spawn.later_starts)} starts, {spread_ms(spawn.later_starts)}"),
        Figure(f"start speed-up {d} vs {s} (later, medians)", ratio, "x", limit=10,
               at_least=True),
        Figure(f"start speed-up {d} vs {s} (first)", first_ratio, "x"),
        Figure(f"graceful stop, idle engine ({d}, median)", median_ms(default.stops), "ms",
               limit=50, note=STOP_PATHS.get(d, d)),
        Figure(f"graceful stop, idle engine ({s}, median)", median_ms(spawn.stops), "ms",
               note=STOP_PATHS.get(s, s)),
    ]


def report(runs: Sequence[Lifecycles]) -> None:
    from figures import median_ms, spread_ms  # noqa: PLC0415

    for run in runs:
        later = run.later_starts
        print(f"{run.start_method}: {len(run.starts)} engines (one EngineCore each, CPU)")
        print(f"  start-to-ready, first        {run.first_start * 1000:8.1f} ms")
        print(f"  start-to-ready, later median {median_ms(later):8.1f} ms   [{spread_ms(later)}]")
        print(f"  graceful stop, median        {median_ms(run.stops):8.1f} ms   "
              f"[{spread_ms(run.stops)}]")
        print(f"  stop path: {STOP_PATHS.get(run.start_method, run.start_method)}")
        codes = sorted({str(c) for c in run.exitcodes})
        print(f"  exit codes: {', '.join(codes)}; force-killed: {run.force_killed}")
        if run.force_killed or any(c != 0 for c in run.exitcodes):
            print("  WARNING: not every stop was graceful; the stop figure is not valid")


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=24, help="engines, default method (24)")
    parser.add_argument("--spawn-starts", type=int, default=4, help="engines under spawn (4)")
    parser.add_argument("--start-method", default="forkserver", help="the default (forkserver)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.starts < 2 or args.spawn_starts < 2:
        parser.error("--starts and --spawn-starts must be >= 2 (the first start is apart)")
    default = measure(args.start_method, args.starts)
    spawn = measure("spawn", args.spawn_starts)
    report([default, spawn])
    result = figures(default, spawn)
    ratio = result[4]
    print(f"start speed-up {args.start_method} vs spawn (later starts, medians): "
          f"{ratio.value:.1f}x (target {ratio.target})")
    if args.json:
        from figures import write_json  # noqa: PLC0415

        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
