"""The orphan matrix on the reference engine: time per cell and in total, and a tp=2 start.

Every cell of ``@pytest.mark.orphan_matrix(level=[frontend, engine_core, worker],
signal=[SIGKILL, SIGTERM, SIGINT], phase=[starting, ready, busy, shutting_down])`` is run with
``kill_tree_at`` on the reference tree (frontend, dp=2 EngineCores, tp=2 workers each) through
one warm ``TreeLauncher``, one after the other, as one pytest worker runs them. Per cell: the
wall time from the start of the tree to the end of the check (start, phase, signal, death,
scan) and, within it, the time from the signal until the last process of the tree was gone.
Also: start-to-ready and graceful stop of one EngineCore with tp=2 workers (three processes),
per process, beside the tp=1 figures of ``engine_lifecycle.py``. Not a test: nothing asserted.

    .venv/bin/python benchmarks/orphan_matrix.py [--starts 12] [--json PATH]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from figures import Figure

LEVELS = ("frontend", "engine_core", "worker")
SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT")
PHASES = ("starting", "ready", "busy", "shutting_down")
#: Target of issue 15: the whole matrix of the reference engine within a minute.
MATRIX_LIMIT_S = 60.0


def run_matrix() -> tuple[float, float, list[tuple[str, float, float, bool]]]:
    """(launcher start s, total s, [(cell id, cell wall s, signal-to-gone s, died)])."""
    from pytest_shutdown.engine.frontend import (  # noqa: PLC0415
        REFERENCE_LEVELS,
        REFERENCE_PHASES,
        serve_frontend,
    )
    from pytest_shutdown.helpers.orphans import kill_tree_at  # noqa: PLC0415
    from pytest_shutdown.helpers.tree_launcher import TreeLauncher  # noqa: PLC0415

    t0 = time.perf_counter()
    cells: list[tuple[str, float, float, bool]] = []
    with TreeLauncher(["pytest_shutdown.engine.frontend"]) as launcher:
        started = time.perf_counter() - t0
        t1 = time.perf_counter()
        for level in LEVELS:
            for sig in SIGNALS:
                for phase in PHASES:
                    c0 = time.perf_counter()
                    record = kill_tree_at(
                        serve_frontend, level=level, signal=sig, phase=phase,
                        levels=REFERENCE_LEVELS, phases=REFERENCE_PHASES, launcher=launcher,
                    )
                    cells.append((f"{level}-{sig}-{phase}", time.perf_counter() - c0,
                                  record.duration_s, record.died))
        total = time.perf_counter() - t1
    return started, total, cells


def measure_tp2(count: int) -> tuple[list[float], list[float]]:
    """Start and stop ``count`` EngineProcManagers with one EngineCore and two workers."""
    from pytest_shutdown.engine.config import EngineConfig  # noqa: PLC0415
    from pytest_shutdown.engine.processes import EngineProcManager  # noqa: PLC0415

    config = EngineConfig(platform="cpu", tensor_parallel_size=2)
    starts, stops = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        manager: Any = EngineProcManager(config)
        starts.append(time.perf_counter() - t0)
        time.sleep(0.05)
        t1 = time.perf_counter()
        manager.shutdown()
        stops.append(time.perf_counter() - t1)
    return starts, stops


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=12, help="tp=2 engines started (12)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.starts < 2:
        parser.error("--starts must be >= 2 (the first start is apart)")
    from figures import Figure, median_ms, spread_ms  # noqa: PLC0415

    starts, stops = measure_tp2(args.starts)
    later = starts[1:]
    print(f"tp=2: {len(starts)} engines (one EngineCore + 2 workers each, forkserver, CPU)")
    print(f"  start-to-ready, later median {median_ms(later):8.1f} ms   [{spread_ms(later)}]"
          f"  = {median_ms(later) / 3:.1f} ms per process")
    print(f"  graceful stop, median        {median_ms(stops):8.1f} ms   [{spread_ms(stops)}]")

    launcher_s, total, cells = run_matrix()
    print(f"orphan matrix: {len(cells)} cells, launcher start {launcher_s:.2f} s")
    for cell, wall, death, died in cells:
        print(f"  {cell:32s} {wall * 1000:7.0f} ms  (signal to gone {death * 1000:5.0f} ms)"
              + ("" if died else "  LEFT PROCESSES BEHIND"))
    walls = [c[1] for c in cells]
    deaths = [c[2] for c in cells]
    bad = [c[0] for c in cells if not c[3]]
    print(f"  total {total:.1f} s" + (f"; cells that left processes: {', '.join(bad)}" if bad
                                      else "; every cell: the whole tree died"))
    figures = [
        Figure("engine start, later (forkserver, tp=2, median)", median_ms(later), "ms",
               note=f"{len(later)} starts, {spread_ms(later)}; 3 processes: "
                    f"{median_ms(later) / 3:.1f} ms per process"),
        Figure("graceful stop (forkserver, tp=2, median)", median_ms(stops), "ms",
               note=f"{len(stops)} stops, {spread_ms(stops)}"),
        Figure("orphan matrix cell, reference tree (median)", median_ms(walls), "ms",
               note=f"{len(cells)} cells, {spread_ms(walls)}; start, phase, signal, death"),
        Figure("orphan matrix cell, signal to tree gone (median)", median_ms(deaths), "ms",
               note=spread_ms(deaths)),
        Figure("orphan matrix, total (36 cells, one worker)", total, "s", limit=MATRIX_LIMIT_S,
               note=f"plus {launcher_s:.1f} s to start the launcher (imports torch once)"),
    ]
    if args.json:
        from figures import write_json  # noqa: PLC0415

        write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main()
