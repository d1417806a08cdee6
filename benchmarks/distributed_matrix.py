"""The distributed orphan matrix: the reference tree with a gloo group per EngineCore.

Every cell of level [frontend, engine_core, rank0, rank1] x signal [SIGKILL, SIGTERM, SIGINT]
x phase [starting, ready, busy, in_collective, shutting_down] (60 cells; the level ``worker`` is
rank 0's process) runs with ``kill_tree_at`` on frontend → dp=2 EngineCores → tp=2 gloo ranks
each, through warm ``TreeLauncher``s (``--jobs``, one per core; 2 by default: the target is set
for 2 cores). Prints the total against the 90 s target of issue 22 and ``NOT MET`` when missed,
and every cell that left a process behind. Not a test: nothing asserted.

``--dp-process-group gloo`` runs the same 60 cells with the EngineCores in a DP group of their
own too (``distributed_matrix_config(dp_process_group="gloo")``, docs/distributed.md); the
default tree keeps it off, as the matrix does.

    .venv/bin/python benchmarks/distributed_matrix.py [--jobs 2] [--dp-process-group gloo]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from figures import Figure

LEVELS = ("frontend", "engine_core", "rank0", "rank1")
SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT")
PHASES = ("starting", "ready", "busy", "in_collective", "shutting_down")
#: Target of issue 22: the gloo tp=2, dp=2 matrix within 90 s on 2 cores.
MATRIX_LIMIT_S = 90.0
#: What the launchers import once, so that every tree starts warm.
PRELOAD = ["torch.distributed", "pytest_shutdown.engine.distributed_tree"]

Cell = tuple[str, float, float, bool, list[str]]


def run_matrix(jobs: int, dp_process_group: str | None = None) -> tuple[float, float, list[Cell]]:
    """(launchers' start s, total s, [(cell id, wall s, signal-to-gone s, died, codes)]);
    ``dp_process_group`` puts the EngineCores in a DP group of that backend."""
    from pytest_shutdown.engine.distributed_tree import (  # noqa: PLC0415
        DISTRIBUTED_LEVELS,
        DISTRIBUTED_PHASES,
        distributed_matrix_config,
    )
    from pytest_shutdown.engine.frontend import serve_frontend  # noqa: PLC0415
    from pytest_shutdown.helpers.orphans import kill_tree_at  # noqa: PLC0415
    from pytest_shutdown.helpers.tree_launcher import TreeLauncher  # noqa: PLC0415

    changes = {} if dp_process_group is None else {"dp_process_group": dp_process_group}
    todo = [(lvl, sig, ph) for lvl in LEVELS for sig in SIGNALS for ph in PHASES]
    lock = threading.Lock()
    cells: list[Cell] = []
    t0 = time.perf_counter()
    launchers = [TreeLauncher(PRELOAD) for _ in range(jobs)]
    started = time.perf_counter() - t0

    def work(launcher: TreeLauncher) -> None:
        while True:
            with lock:
                if not todo:
                    return
                level, sig, phase = todo.pop(0)
            c0 = time.perf_counter()
            record = kill_tree_at(
                serve_frontend, args=(distributed_matrix_config(**changes),), level=level,
                signal=sig, phase=phase, levels=DISTRIBUTED_LEVELS, phases=DISTRIBUTED_PHASES,
                launcher=launcher,
            )
            with lock:
                cells.append((f"{level}-{sig}-{phase}", time.perf_counter() - c0,
                              record.duration_s, record.died,
                              [f.code for f in record.findings]))

    t1 = time.perf_counter()
    try:
        threads = [threading.Thread(target=work, args=(lch,)) for lch in launchers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for launcher in launchers:
            launcher.close()
    return started, time.perf_counter() - t1, sorted(cells)


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="cells run at once (2)")
    parser.add_argument(
        "--dp-process-group", choices=("gloo",), help="the EngineCores' DP group (off)"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    from figures import Figure, median_ms, spread_ms  # noqa: PLC0415

    launcher_s, total, cells = run_matrix(args.jobs, args.dp_process_group)
    dp = f", DP group {args.dp_process_group}" if args.dp_process_group else ""
    print(f"distributed orphan matrix{dp}: {len(cells)} cells, {args.jobs} at once, "
          f"launchers started in {launcher_s:.2f} s")
    for cell, wall, death, died, codes in cells:
        print(f"  {cell:36s} {wall * 1000:7.0f} ms  (signal to gone {death * 1000:5.0f} ms)"
              + ("" if died else f"  LEFT PROCESSES BEHIND: {', '.join(codes)}"))
    bad = [c[0] for c in cells if not c[3]]
    met = total <= MATRIX_LIMIT_S
    print(f"  total {total:.1f} s (target <= {MATRIX_LIMIT_S:.0f} s)"
          + ("" if met else "  NOT MET")
          + (f"; cells that left processes: {', '.join(bad)}" if bad
             else "; every cell: the whole tree died"))
    walls = [c[1] for c in cells]
    figures = [
        Figure(f"distributed matrix cell, gloo tp=2 dp=2{dp} (median)", median_ms(walls), "ms",
               note=f"{len(cells)} cells, {spread_ms(walls)}"),
        Figure(f"distributed matrix{dp}, total ({len(cells)} cells, {args.jobs} jobs)", total, "s",
               limit=MATRIX_LIMIT_S,
               note=f"plus {launcher_s:.1f} s to start the launchers (import torch once)"),
    ]
    if args.json:
        from figures import write_json  # noqa: PLC0415

        write_json(args.json, figures)
    return figures


if __name__ == "__main__":
    main()
