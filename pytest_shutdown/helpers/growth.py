"""``assert_no_growth``: what each build → use → shut down cycle leaves behind.

One before/after comparison cannot tell a leak from a cache that fills once; repetition can.
The cycle runs ``warmup`` times (one-time costs: imports, caches, lazily started pools), then
``cycles`` times, with a :class:`~pytest_shutdown.helpers.census.Census` after each run: live
objects by type, Python and OS threads, file descriptors, RSS, and device memory where a reader
exists. :func:`judge` applies the rules stated in docs/growth.md: a noise allowance from the
warm-up, a noisy reading re-measured once, growth in every cycle, net growth past a derived
threshold (less the largest single cycle), or past a threshold stated in ``max_growth``.

A grown type is shown by one instance made by one more cycle (failure path only), with the
backref chain that keeps it alive (:mod:`~pytest_shutdown.helpers.holders`, bounded) and, in the
message, the nearest named holder: ``CachedEngine: +1 per cycle (6 cycles); held by lru_cache
wrapper CachedEngine.tokenizer_for``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_shutdown._base.arguments import require_callable
from pytest_shutdown.findings.finding import Finding, raise_if_any
from pytest_shutdown.helpers.census import (
    AUTO,
    BYTE_METRICS,
    DEVICE_MEMORY,
    FDS,
    OBJECTS,
    OS_THREADS,
    RSS,
    SCALARS,
    THREADS,
    Census,
    describe_fds,
    describe_os_threads,
    describe_threads,
    fd_numbers,
    os_thread_ids,
    pick_device_reader,
    short_name,
    type_name,
)
from pytest_shutdown.helpers.holders import holder_chain
from pytest_shutdown.helpers.report import is_seconds

if TYPE_CHECKING:  # pragma: no cover
    from pytest_shutdown.gpu.readers import MemoryReader

__all__ = [
    "DEFAULT_DEVICE_TOLERANCE",
    "DEFAULT_RSS_TOLERANCE",
    "GrowthRecord",
    "Verdict",
    "assert_no_growth",
    "judge",
    "measure_growth",
]

MiB = 1 << 20
#: The per-cycle allowance of the resident set size below which it is noise (bytes).
DEFAULT_RSS_TOLERANCE = 4 * MiB
#: The per-cycle allowance of device memory below which it is noise (bytes).
DEFAULT_DEVICE_TOLERANCE = 2 * MiB
#: Seconds a noisy reading waits before it is taken again.
DEFAULT_SETTLE_S = 0.1
#: Grown types shown with a backref chain (the rest are listed by name).
DEFAULT_DIAGNOSE = 3
#: Types of pytest-shutdown's own bookkeeping, explained last (the reference engine's first).
OWN_PREFIX = "pytest_shutdown."
ENGINE_PREFIX = "pytest_shutdown.engine."
#: The engine's own grown types looked at to explain the outermost first.
OUTER_CANDIDATES = 20
#: Types named in the message of the finding that lists the other grown types.
LISTED_TYPES = 6

#: The keys of ``max_growth`` that name a metric rather than a type.
METRIC_KEYS: tuple[str, ...] = (OBJECTS, *SCALARS)

#: Types that only carry references: a backref chain's holder is the nearest node that is not one.
_ANONYMOUS = (dict, list, tuple, set, frozenset, types.CellType, types.MappingProxyType)


# --- the rules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """How one metric grew: which rule decided, by how much, against what.

    ``rule`` is ``"every cycle"`` or ``"net"``; ``deltas`` are the changes of the measured
    cycles; ``net`` is the net growth the ``net`` rule compares; ``allowance`` the per-cycle noise
    allowance; ``threshold`` the net threshold (stated or derived).
    """

    metric: str
    rule: str
    deltas: tuple[int, ...]
    net: int
    allowance: int
    threshold: float
    stated: bool

    @property
    def per_cycle(self) -> float:
        """The mean growth per measured cycle."""
        return sum(self.deltas) / len(self.deltas) if self.deltas else 0.0


def noise(warmup: Sequence[int]) -> int:
    """The largest change between consecutive warm-up readings (0 with fewer than two)."""
    return max((abs(b - a) for a, b in zip(warmup, warmup[1:], strict=False)), default=0)


def judge(
    metric: str,
    warmup: Sequence[int],
    readings: Sequence[int],
    *,
    unit: int = 1,
    stated: float | None = None,
) -> Verdict | None:
    """Apply the growth rules to one metric; ``None`` when it did not grow.

    ``warmup`` are the readings after each warm-up cycle; ``readings`` are the baseline (the last
    warm-up reading, or a reading before any cycle) followed by one reading per measured cycle.
    ``unit`` is the smallest per-cycle change that is not noise; ``stated`` a threshold for the
    net growth that replaces both rules.
    """
    if len(readings) < 2:
        return None
    measured = len(readings) - 1
    deltas = tuple(b - a for a, b in zip(readings, readings[1:], strict=False))
    allowance = max(unit, noise(warmup))
    last = min(readings[-2:]) if measured >= 2 else readings[-1]
    net = last - readings[0]
    if stated is not None:
        if net > stated:
            return Verdict(metric, "net", deltas, net, allowance, stated, True)
        return None
    threshold = float(allowance * math.ceil(measured / 3))
    if measured >= 2 and all(delta >= allowance for delta in deltas):
        return Verdict(metric, "every cycle", deltas, net, allowance, threshold, False)
    step = max(0, *deltas)  # one jump is a cache filled once, not growth
    if net - step > threshold:
        return Verdict(metric, "net", deltas, net, allowance, threshold, False)
    return None


def _noisy(
    reading: Mapping[str, int], previous: Mapping[str, int], allowances: Mapping[str, int]
) -> bool:
    return any(v - previous.get(k, 0) > allowances.get(k, 1) for k, v in reading.items())


# --- the record -----------------------------------------------------------------------------
@dataclass(frozen=True)
class GrowthRecord:
    """What a growth check measured.

    ``series`` maps each scalar metric (``threads``, ``os-threads``, ``fds``, ``rss``,
    ``device-memory``) to its readings: baseline first, then one per measured cycle;
    ``warmup_series`` the warm-up readings. ``grown`` are the verdicts (every grown metric, an
    object type as ``objects:<type>``), ``findings`` the ``growth`` findings they became.
    ``remeasured`` lists the measured cycles (1-based) whose reading was taken again;
    ``device_memory`` names the reader, or says why device memory was not measured;
    ``measure_s`` is the cost of each reading (gc.collect and counting), ``duration_s`` the
    whole check.
    """

    cycles: int
    warmup: int
    series: Mapping[str, tuple[int, ...]]
    warmup_series: Mapping[str, tuple[int, ...]]
    grown: tuple[Verdict, ...]
    findings: tuple[Finding, ...]
    remeasured: tuple[int, ...]
    device_memory: str
    measure_s: tuple[float, ...]
    duration_s: float
    object_types: int = 0
    details: Mapping[str, Any] = field(default_factory=dict)


# --- the check ------------------------------------------------------------------------------
def assert_no_growth(
    cycle: Callable[[], object],
    *,
    cycles: int = 5,
    warmup: int = 2,
    max_growth: Mapping[str, float] | None = None,
    rss_tolerance: int = DEFAULT_RSS_TOLERANCE,
    device_memory: MemoryReader | str | None = AUTO,
    device_tolerance: int = DEFAULT_DEVICE_TOLERANCE,
    settle_s: float = DEFAULT_SETTLE_S,
    diagnose: int = DEFAULT_DIAGNOSE,
) -> GrowthRecord:
    """Run ``cycle()`` (build, use, shut down) ``warmup`` then ``cycles`` times; require that
    nothing grows from cycle to cycle.

    Measured after each cycle (after ``gc.collect()``): live objects by type, Python threads, OS
    threads, file descriptors, RSS, and device memory (``device_memory``: ``"auto"`` picks a
    reader on CUDA/ROCm once torch is imported, ``None`` measures none, or pass a reader with
    ``used_bytes()``). A metric that grew in every measured cycle, or whose net growth passed its
    threshold, is a ``growth`` finding naming what grew, by how much per cycle, and, for objects,
    what holds one new instance. ``max_growth`` states net thresholds by metric (``"threads"``,
    ``"os-threads"``, ``"fds"``, ``"rss"``, ``"device-memory"``, ``"objects"`` for every type) or
    by type name (``"CachedEngine"`` or ``"pkg.mod.CachedEngine"``); a stated threshold replaces
    the rules for its metric. The rules are in docs/growth.md.

    An exception raised by ``cycle`` propagates unchanged. Raises
    :class:`~pytest_shutdown.ShutdownContractError`; returns the :class:`GrowthRecord` when
    nothing grew.
    """
    __tracebackhide__ = True  # a failure points at the caller's line
    record = measure_growth(
        cycle,
        cycles=cycles,
        warmup=warmup,
        max_growth=max_growth,
        rss_tolerance=rss_tolerance,
        device_memory=device_memory,
        device_tolerance=device_tolerance,
        settle_s=settle_s,
        diagnose=diagnose,
    )
    raise_if_any(record.findings)
    return record


def _count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")


def _threshold(key: str, value: float) -> float:
    if not isinstance(key, str) or not key:
        raise ValueError(
            f"max_growth: keys are metric names ({', '.join(METRIC_KEYS)}) or type names, "
            f"got {key!r}"
        )
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or math.isnan(value) or value < 0:
        raise ValueError(f"max_growth[{key!r}]: expected a number >= 0, got {value!r}")
    return float(value)


def measure_growth(
    cycle: Callable[[], object],
    *,
    cycles: int = 5,
    warmup: int = 2,
    max_growth: Mapping[str, float] | None = None,
    rss_tolerance: int = DEFAULT_RSS_TOLERANCE,
    device_memory: MemoryReader | str | None = AUTO,
    device_tolerance: int = DEFAULT_DEVICE_TOLERANCE,
    settle_s: float = DEFAULT_SETTLE_S,
    diagnose: int = DEFAULT_DIAGNOSE,
) -> GrowthRecord:
    """:func:`assert_no_growth` without the raise: the record, its findings included."""
    require_callable("assert_no_growth", "cycle", cycle, "a function: build, use, shut down")
    _count("cycles", cycles, 1)
    _count("warmup", warmup, 0)
    _count("rss_tolerance", rss_tolerance, 1)
    _count("device_tolerance", device_tolerance, 1)
    _count("diagnose", diagnose, 0)
    if not is_seconds(settle_s, zero_ok=True):
        raise ValueError(f"settle_s: expected a number of seconds >= 0, got {settle_s!r}")
    stated = {key: _threshold(key, value) for key, value in dict(max_growth or {}).items()}
    if isinstance(device_memory, str) and device_memory != AUTO:
        pick_device_reader(device_memory)  # the error names the accepted values
    started = time.perf_counter()
    units = {RSS: rss_tolerance, DEVICE_MEMORY: device_tolerance}
    # Everything kept across readings lives in lists made before the first cycle and holds only
    # untracked values (dicts of str -> int, ints, floats): the check adds no object per cycle.
    warm_objects: list[dict[str, int]] = []
    warm_scalars: list[dict[str, int]] = []
    objects: list[dict[str, int]] = []
    scalars: list[dict[str, int]] = []
    remeasured: list[int] = []
    costs: list[float] = []
    census: Census | None = None
    note = ""

    def read() -> tuple[dict[str, int], dict[str, int]]:
        nonlocal census, note
        if census is None:  # picked after one cycle: "auto" looks for torch, imported by now
            reader, note = pick_device_reader(device_memory)
            census = Census(reader)
        t0 = time.perf_counter()
        reading = census.read()
        costs.append(time.perf_counter() - t0)
        return reading

    for _ in range(warmup):
        cycle()
        counted, measured = read()
        warm_objects.append(counted)
        warm_scalars.append(measured)
    # the baseline: the last warm-up reading, else one taken before any cycle
    counted, measured = (warm_objects[-1], warm_scalars[-1]) if warm_objects else read()
    objects.append(counted)
    scalars.append(measured)
    # what the baseline had, to name what a grown fd, OS thread or thread count added
    baseline = (
        tuple(fd_numbers()),
        tuple(os_thread_ids()),
        tuple(t.ident or 0 for t in threading.enumerate()),
    )
    object_allowance = _allowances(warm_objects, {})
    scalar_allowance = _allowances(warm_scalars, units)

    for number in range(1, cycles + 1):
        cycle()
        counted, measured = read()
        if _noisy(measured, scalars[-1], scalar_allowance) or _noisy(
            counted, objects[-1], object_allowance
        ):
            time.sleep(settle_s)
            del counted, measured
            counted, measured = read()
            remeasured.append(number)
        objects.append(counted)
        scalars.append(measured)
        del counted, measured

    assert census is not None  # read() made it
    verdicts = _judge_all(warm_objects, objects, warm_scalars, scalars, units, stated)
    findings = _findings(verdicts, census, cycle, diagnose, baseline, tuple(remeasured))
    reader_name = getattr(census.device_reader, "name", None)
    if isinstance(device_memory, str):  # a reader picked here is closed here (NVML, amdsmi)
        close = getattr(census.device_reader, "close", None)
        if callable(close):
            close()
    series = {m: tuple(r[m] for r in scalars) for m in SCALARS if m in scalars[0]}
    warm = {m: tuple(r[m] for r in warm_scalars) for m in SCALARS if m in scalars[0]}
    return GrowthRecord(
        cycles=cycles,
        warmup=warmup,
        series=series,
        warmup_series=warm,
        grown=tuple(verdicts),
        findings=tuple(findings),
        remeasured=tuple(remeasured),
        device_memory=str(reader_name) if reader_name else note,
        measure_s=tuple(costs),
        duration_s=time.perf_counter() - started,
        object_types=len(objects[-1]),
    )


def _allowances(warm: list[dict[str, int]], units: Mapping[str, int]) -> dict[str, int]:
    names = {name for reading in warm for name in reading} | set(units)
    return {name: max(units.get(name, 1), noise([r.get(name, 0) for r in warm])) for name in names}


def _threshold_for(metric: str, name: str, stated: Mapping[str, float]) -> float | None:
    if not stated:
        return None
    if metric != OBJECTS:
        return stated.get(metric)
    for key in (name, short_name(name)):
        if key in stated:
            return stated[key]
    return stated.get(OBJECTS)


def _judge_all(
    warm_objects: list[dict[str, int]],
    objects: list[dict[str, int]],
    warm_scalars: list[dict[str, int]],
    scalars: list[dict[str, int]],
    units: Mapping[str, int],
    stated: Mapping[str, float],
) -> list[Verdict]:
    found = [
        judge(
            metric,
            [r[metric] for r in warm_scalars],
            [r[metric] for r in scalars],
            unit=units.get(metric, 1),
            stated=_threshold_for(metric, metric, stated),
        )
        for metric in SCALARS
        if metric in scalars[0]
    ]
    found += [
        judge(
            f"{OBJECTS}:{name}",
            [r.get(name, 0) for r in warm_objects],
            [r.get(name, 0) for r in objects],
            stated=_threshold_for(OBJECTS, name, stated),
        )
        for name in sorted({name for reading in objects for name in reading})
    ]
    return [verdict for verdict in found if verdict is not None]


# --- findings ---------------------------------------------------------------------------------
def _amount(metric: str, value: float) -> str:
    if metric in BYTE_METRICS:
        return f"{value / MiB:+.1f} MiB"
    return f"{value:+g}" if float(value).is_integer() else f"{value:+.1f}"


def _growth_text(subject: str, verdict: Verdict) -> str:
    metric = verdict.metric
    measured = len(verdict.deltas)
    if verdict.rule == "every cycle":
        rate = verdict.per_cycle
        shown = _amount(metric, rate) if metric in BYTE_METRICS else _amount(metric, round(rate, 1))
        return f"{subject}: {shown} per cycle ({measured} cycles)"
    limit = _amount(metric, verdict.threshold).lstrip("+")
    if verdict.stated:
        return (
            f"{subject}: {_amount(metric, verdict.net)} over {measured} cycles, past its stated "
            f"threshold of {limit}"
        )
    step = _amount(metric, max(0, *verdict.deltas))
    return (
        f"{subject}: {_amount(metric, verdict.net)} over {measured} cycles ({step} in its largest "
        f"single cycle), past its derived threshold of {limit} beyond that cycle"
    )


def _verdict_details(verdict: Verdict, remeasured: tuple[int, ...]) -> dict[str, Any]:
    return {
        "metric": verdict.metric,
        "rule": verdict.rule,
        "per_cycle": verdict.per_cycle,
        "deltas": list(verdict.deltas),
        "net": verdict.net,
        "allowance": verdict.allowance,
        "threshold": verdict.threshold,
        "threshold_stated": verdict.stated,
        "cycles": len(verdict.deltas),
        "remeasured_cycles": list(remeasured),
    }


def _findings(
    verdicts: list[Verdict],
    census: Census,
    cycle: Callable[[], object],
    diagnose: int,
    baseline: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
    remeasured: tuple[int, ...],
) -> list[Finding]:
    findings: list[Finding] = []
    by_metric = {v.metric: v for v in verdicts}
    baseline_fds, baseline_tids, baseline_threads = baseline

    def new_ones(verdict: Verdict, subject: str, key: str, new: dict[Any, Any], shown: str) -> None:
        text = _growth_text(subject, verdict) + (f"; new: {shown}" if shown else "")
        findings.append(
            Finding("growth", text, {**_verdict_details(verdict, remeasured), key: new})
        )

    threads = by_metric.get(THREADS)
    if threads is not None:
        new = [t for t in threading.enumerate() if (t.ident or 0) not in baseline_threads]
        named = describe_threads(new)
        shown = ", ".join(f"{name!r} ({what})" for name, what in list(named.items())[:5])
        new_ones(threads, "threads", "new_threads", named, shown)
    native = by_metric.get(OS_THREADS)
    if native is not None and threads is None:  # Python threads are OS threads too: said once
        tids = [tid for tid in os_thread_ids() if tid not in baseline_tids]
        named = describe_os_threads(tids)
        shown = ", ".join(f"{name!r}" for name in list(named.values())[:5])
        new_ones(native, "OS threads", "new_os_threads", named, shown)
    fds = by_metric.get(FDS)
    if fds is not None:
        opened = describe_fds(fd for fd in fd_numbers() if fd not in baseline_fds)
        shown = ", ".join(f"{fd} -> {target}" for fd, target in list(opened.items())[:5])
        new_ones(fds, "file descriptors", "new_fds", opened, shown)
    for metric, subject in ((RSS, "RSS"), (DEVICE_MEMORY, "device memory")):
        verdict = by_metric.get(metric)
        if verdict is not None:
            details = _verdict_details(verdict, remeasured)
            if metric == DEVICE_MEMORY:
                details["reader"] = str(getattr(census.device_reader, "name", "?"))
            findings.append(Finding("growth", _growth_text(subject, verdict), details))
    grown = [v for v in verdicts if v.metric.startswith(OBJECTS + ":")]
    return findings + _object_findings(grown, census, cycle, diagnose, remeasured)


def _is_library(name: str) -> bool:
    """Builtins, the standard library and the plugin's own bookkeeping (thread origins): they
    grow with what leaked; the engine's types (the reference engine's too) are the cause."""
    root = name.split(".", 1)[0]
    library = "." not in name or root in getattr(sys, "stdlib_module_names", ())
    return library or name.startswith(OWN_PREFIX) and not name.startswith(ENGINE_PREFIX)


def _type_of(verdict: Verdict) -> str:
    return verdict.metric.split(":", 1)[1]  # "objects:<type>"


def _diagnosis_order(verdict: Verdict) -> tuple[int, float]:
    """The engine's own types first, then the fastest growing."""
    return (1 if _is_library(_type_of(verdict)) else 0, -verdict.per_cycle)


def _held_by_another(names: list[str], census: Census) -> set[str]:
    """Of the given types, those whose newest instance is held (directly or through its
    ``__dict__``) by an instance of another of them: an engine's parts, explained after the
    engine that holds them. Failure path only (one heap scan per type)."""
    wanted = set(names)
    instances = census.one_instance_each(names, set())
    inner: set[str] = set()
    for name, instance in instances.items():
        holders = [r for r in gc.get_referrers(instance) if r is not instances]
        for holder in list(holders):
            if isinstance(holder, dict):
                holders += [r for r in gc.get_referrers(holder) if r is not holders]
        kinds = {type_name(type(holder)) for holder in holders}
        if kinds & (wanted - {name}):
            inner.add(name)
        del holders, instance
    instances.clear()
    return inner


def _object_findings(
    verdicts: list[Verdict],
    census: Census,
    cycle: Callable[[], object],
    diagnose: int,
    remeasured: tuple[int, ...],
) -> list[Finding]:
    if not verdicts:
        return []
    ordered = sorted(verdicts, key=_diagnosis_order)
    own = [_type_of(v) for v in ordered if _diagnosis_order(v)[0] == 0]
    if len(own) > 1:
        inner = _held_by_another(own[:OUTER_CANDIDATES], census)
        # stable: within the engine's types, the outermost first
        ordered.sort(key=lambda v: (_diagnosis_order(v)[0], _type_of(v) in inner))
    shown, rest = ordered[:diagnose], ordered[diagnose:]  # diagnose=0: every one listed
    chains = _chains([_type_of(v) for v in shown], census, cycle)
    findings: list[Finding] = []
    for verdict in shown:
        name = _type_of(verdict)
        chain_text, holder, instance = chains.get(name, ("", "", ""))
        message = _growth_text(short_name(name), verdict) + (
            f"; held by {holder}" if holder else ""
        )
        details = {**_verdict_details(verdict, remeasured), "type": name}
        details.update({"instance": instance, "backref_chain": chain_text, "held_by": holder})
        findings.append(Finding("growth", message, details))
    if rest:
        listed = ", ".join(
            f"{short_name(_type_of(v))} {_amount(v.metric, round(v.per_cycle, 1))}"
            for v in rest[:LISTED_TYPES]
        )
        more = f" and {len(rest) - LISTED_TYPES} more" if len(rest) > LISTED_TYPES else ""
        text = f"objects of {len(rest)} more type(s) grew with them (per cycle): {listed}{more}."
        types_ = {_type_of(v): _verdict_details(v, remeasured) for v in rest}
        details = {"metric": OBJECTS, "types": types_, "remeasured_cycles": list(remeasured)}
        findings.append(Finding("growth", text, details))
    return findings


def _chains(
    names: list[str], census: Census, cycle: Callable[[], object]
) -> dict[str, tuple[str, str, str]]:
    """``{type name: (backref chain text, nearest named holder, the instance shown)}``.

    Failure path only: the cycle runs once more, so that the instance shown is one it made
    (when that diagnosis cycle raises, the newest instance is shown instead); each backref
    search is bounded (:data:`~pytest_shutdown.helpers.holders.MAX_DEPTH` levels, ``BUDGET_S``).
    """
    if not names:
        return {}
    old_ids = census.instance_ids(names)
    with contextlib.suppress(Exception):  # the diagnosis only loses its "new" instance
        cycle()
    gc.collect()
    instances = census.one_instance_each(names, old_ids)
    del old_ids
    found: dict[str, tuple[str, str, str]] = {}
    for name in names:
        instance = instances.pop(name, None)
        if instance is None:
            continue
        try:
            chain, text = holder_chain(instance)
            holder = nearest_holder(chain)
        except Exception as exc:  # noqa: BLE001 - a diagnosis that fails must not hide the finding
            chain, text, holder = [], f"no backref chain: {exc}", ""
        found[name] = (text, holder, _short_repr(instance))
        del chain, instance
    return found


def _short_repr(obj: object) -> str:
    try:
        text = repr(obj)
    except Exception:  # noqa: BLE001 - a repr that raises
        text = f"<{type(obj).__qualname__} at {id(obj):#x}>"
    return text if len(text) <= 200 else text[:197] + "..."


def nearest_holder(chain: Sequence[Any]) -> str:
    """The nearest named holder of ``chain[-1]`` in a backref chain ``[root, ..., target]``.

    Walking from the target towards the root, containers are skipped (dicts, lists, tuples,
    sets, cells, an ``lru_cache`` key); the first function, ``lru_cache`` wrapper, bound method,
    thread, frame, class or other object names the holder. A module root names the attribute
    that leads to the target: ``list engines.ENGINES``. ``""`` when the chain has no root.
    """
    if len(chain) < 2:
        return ""
    for index in range(len(chain) - 2, -1, -1):
        node = chain[index]
        if isinstance(node, types.ModuleType):
            child = chain[index + 1]
            if child is vars(node) and index + 2 < len(chain):
                child = chain[index + 2]  # the module's namespace: name the attribute
            attribute = next(
                (key for key, value in vars(node).items() if value is child), "__dict__"
            )
            kind = type(child).__qualname__
            return f"{kind} {node.__name__}.{attribute}"
        if _is_anonymous(node):
            continue
        return _describe_holder(node)
    return ""


def _is_anonymous(node: object) -> bool:
    kind = type(node)
    if kind.__module__ == "functools" and kind.__name__ == "_HashedSeq":
        return True
    return kind in _ANONYMOUS or (isinstance(node, _ANONYMOUS) and kind.__module__ == "builtins")


def _describe_holder(node: object) -> str:
    kind = type(node)
    if kind.__name__ == "_lru_cache_wrapper":
        return f"lru_cache wrapper {getattr(node, '__qualname__', '?')}"
    if isinstance(node, types.FunctionType):
        return f"function {node.__qualname__}"
    if isinstance(node, types.MethodType):
        return f"bound method {node.__qualname__}"
    if isinstance(node, threading.Thread):
        return f"thread {node.name!r}"
    if isinstance(node, types.FrameType):
        return f"frame {node.f_code.co_name} ({node.f_code.co_filename}:{node.f_lineno})"
    if isinstance(node, type):
        return f"class {node.__qualname__}"
    return f"{kind.__qualname__} object"
