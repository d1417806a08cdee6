"""Growth over cycles: what ``assert_no_growth`` costs, and that clean engines give no finding.

Run: ``.venv/bin/python benchmarks/growth.py [--cycles 20] [--repeat 9] [--json PATH]``. Prints
figures (medians; the machine is shared); it is not a test. A missed target is printed as
``NOT MET``. Three targets (issue 21):

* the reference ``ReferenceLLM`` (renderer + one EngineCore process, CPU) through
  ``assert_no_growth(cycle, cycles=10)``: at most 20 s of wall time (CPU time is printed too);
* the object census (``gc.get_objects()`` and a count by type) in a heap of 200,000 live objects:
  at most 100 ms per reading (the ``gc.collect()`` before it is printed apart);
* 20 measured cycles of every clean engine shape of the examples: 0 ``growth`` findings.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from figures import Figure, report

ROOT = Path(__file__).resolve().parent.parent
HEAP_TARGET = 200_000
LLM_CYCLES = 10
TARGET_LLM_S = 20.0
TARGET_CENSUS_MS = 100.0


def _example(relative: str) -> ModuleType:
    """Import an example module by path (the examples are not a package)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def clean_shapes() -> list[tuple[str, Callable[[], None]]]:
    """Every clean engine shape of the examples, as one build → use → shut down cycle each."""
    from pytest_shutdown.engine import EngineCore, EngineProcManager, ReferenceLLM
    from pytest_shutdown.engine.renderer import ReferenceRenderer
    from pytest_shutdown.plugin.fixtures import scaled_down_config

    config = scaled_down_config("cpu")
    shapes: list[tuple[str, Callable[[], None]]] = []

    def renderer() -> None:
        engine = ReferenceRenderer(config)
        engine.tokenize("hello world").result(60)
        engine.shutdown()

    def core() -> None:
        engine = EngineCore(config)
        engine.generate([1, 2, 3], max_tokens=2)
        engine.shutdown()

    def manager() -> None:
        EngineProcManager(config).shutdown()

    def llm_in_process() -> None:
        with ReferenceLLM(config, multiprocess=False) as llm:
            llm.generate("hello world", max_tokens=2)

    def llm() -> None:
        with ReferenceLLM(config) as engine:
            engine.generate("hello world", max_tokens=2)

    shapes += [
        ("ReferenceRenderer", renderer),
        ("EngineCore (in process)", core),
        ("EngineProcManager (1 EngineCore process)", manager),
        ("ReferenceLLM (in process)", llm_in_process),
        ("ReferenceLLM (EngineCore process)", llm),
    ]
    sys.path.insert(0, str(ROOT / "examples" / "downstream"))  # its worker imports it by name
    import mini_engine as mini

    def mini_engine() -> None:
        engine = mini.MiniEngine.from_config(config)
        engine.generate("hello")
        engine.shutdown()

    shapes.append(("downstream MiniEngine", mini_engine))
    regressions = {
        "lru_cache fixed (module-level cache)": (
            "test_regression_lru_cache_engine_method.py",
            lambda m: m.cycle(m.FixedEngine),
        ),
        "registry fixed (WeakSet)": (
            "test_regression_engine_registry.py",
            lambda m: m.cycle(m.FixedEngine),
        ),
        "thread fixed (joined)": (
            "test_regression_thread_per_cycle.py",
            lambda m: m.cycle(m.FixedEngine, []),
        ),
        "fd fixed (closed)": (
            "test_regression_fd_per_cycle.py",
            lambda m: m.cycle(m.FixedEngine, []),
        ),
    }
    for label, (name, run) in regressions.items():
        module = _example(f"examples/regressions/{name}")
        shapes.append((label, lambda module=module, run=run: run(module)))
    return shapes


def llm_check(out: list[Figure]) -> None:
    from pytest_shutdown.engine import ReferenceLLM
    from pytest_shutdown.helpers.growth import measure_growth
    from pytest_shutdown.plugin.fixtures import scaled_down_config

    config = scaled_down_config("cpu")

    def cycle() -> None:
        with ReferenceLLM(config) as llm:
            llm.generate("hello world", max_tokens=2)

    wall0, cpu0 = time.perf_counter(), time.process_time()
    record = measure_growth(cycle, cycles=LLM_CYCLES)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    readings = statistics.median(record.measure_s) * 1000
    print(
        f"ReferenceLLM, {LLM_CYCLES} cycles after 2 warm-up: {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"(this process), {len(record.findings)} finding(s); median reading {readings:.0f} ms"
    )
    for finding in record.findings:
        print(f"  [{finding.code}] {finding.message}")
    out.append(Figure(f"ReferenceLLM {LLM_CYCLES}-cycle check", wall, "s", limit=TARGET_LLM_S))
    out.append(Figure(f"ReferenceLLM {LLM_CYCLES}-cycle check, CPU time", cpu, "s"))


def census_cost(repeat: int, out: list[Figure]) -> None:
    from pytest_shutdown.helpers.census import Census

    padding = [[] for _ in range(max(0, HEAP_TARGET - len(gc.get_objects())))]  # tracked
    heap = len(gc.get_objects())
    census = Census()
    counts, cpu, collects = [], [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gc.collect()
        t1, c1 = time.perf_counter(), time.process_time()
        census.read_scalars()
        census.read_objects()
        t2, c2 = time.perf_counter(), time.process_time()
        collects.append(t1 - t0)
        counts.append(t2 - t1)
        cpu.append(c2 - c1)
    count_ms = statistics.median(counts) * 1000
    cpu_ms = statistics.median(cpu) * 1000
    collect_ms = statistics.median(collects) * 1000
    print(
        f"census at {heap} live objects: {count_ms:.1f} ms per reading (median of {repeat}, "
        f"best {min(counts) * 1000:.1f}; CPU {cpu_ms:.1f} ms); gc.collect() before it "
        f"{collect_ms:.1f} ms"
    )
    out.append(
        Figure(
            f"census per reading at {heap // 1000}k objects",
            count_ms,
            "ms",
            limit=TARGET_CENSUS_MS,
        )
    )
    out.append(Figure(f"census per reading at {heap // 1000}k objects, CPU time", cpu_ms, "ms"))
    out.append(Figure(f"gc.collect() at {heap // 1000}k objects", collect_ms, "ms"))
    del padding


def clean_engines(cycles: int, out: list[Figure]) -> None:
    from pytest_shutdown.helpers.growth import measure_growth

    total = 0
    shapes = clean_shapes()
    for label, cycle in shapes:
        t0 = time.perf_counter()
        record = measure_growth(cycle, cycles=cycles)
        total += len(record.findings)
        print(
            f"{label:<42} {cycles} cycles: {len(record.findings)} growth finding(s), "
            f"{time.perf_counter() - t0:.1f} s, re-measured {list(record.remeasured) or 'none'}"
        )
        for finding in record.findings:
            print(f"  [{finding.code}] {finding.message}")
    out.append(
        Figure(
            f"growth findings, {cycles} cycles x {len(shapes)} clean shapes",
            total,
            "findings",
            limit=0,
        )
    )


def main(argv: Sequence[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="cycles per clean shape (20)")
    parser.add_argument("--repeat", type=int, default=9, help="census readings timed (9)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.cycles < 2 or args.repeat < 1:
        parser.error("--cycles must be >= 2 and --repeat >= 1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch  # noqa: F401

    figures: list[Figure] = []
    llm_check(figures)
    clean_engines(args.cycles, figures)
    census_cost(args.repeat, figures)  # last: it pads the heap
    print()
    return report(figures, args.json, ".4g")


if __name__ == "__main__":
    main()
