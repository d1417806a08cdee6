"""assert_no_growth: each measurement catches its kind of growth, the rules keep noise out.

Both sides of ``growth`` for every measurement: a cycle that leaves one more thing behind each
time is caught and named; the same cycle without the leak passes. The rules themselves are
tested on plain numbers (:func:`judge`).
"""

from __future__ import annotations

import _thread
import functools
import os
import threading

import pytest

from pytest_shutdown import ShutdownContractError, assert_no_growth
from pytest_shutdown.devices import NvmlProcessReader
from pytest_shutdown.helpers import census
from pytest_shutdown.helpers.growth import judge, measure_growth, nearest_holder, noise
from tests.gpu.gpu_fakes import FakeNvml, Gpu

MiB = 1 << 20
#: Quick settle for the tests (the default is 0.1 s).
SETTLE_S = 0.05


def metrics(error: ShutdownContractError) -> list[str]:
    return [str(f.details.get("metric")) for f in error.findings]


# --- the rules on plain numbers ---------------------------------------------------------------
def test_plus_one_in_every_cycle_is_growth() -> None:
    verdict = judge("objects:Engine", [7, 8], [8, 9, 10, 11, 12, 13])

    assert verdict is not None
    assert verdict.rule == "every cycle" and verdict.per_cycle == 1.0 and verdict.net == 4


def test_a_flat_series_is_not_growth() -> None:
    assert judge("threads", [3, 3], [3, 3, 3, 3, 3, 3]) is None


def test_a_one_off_spike_in_the_middle_is_not_growth() -> None:
    assert judge("objects:dict", [100, 100], [100, 100, 150, 100, 100, 100]) is None


def test_a_spike_on_the_last_reading_is_not_growth() -> None:
    """The net growth is taken to the smaller of the last two readings."""
    assert judge("objects:dict", [100, 100], [100, 100, 100, 100, 100, 180]) is None


def test_a_one_off_step_is_not_growth() -> None:
    """A cache filled once during the measured cycles: one jump, then flat."""
    assert judge("objects:dict", [100, 100], [100, 100, 140, 140, 140, 140]) is None


def test_two_steps_are_growth_by_the_net_rule() -> None:
    verdict = judge("objects:dict", [100, 100], [100, 120, 120, 140, 140, 140])

    assert verdict is not None and verdict.rule == "net" and verdict.net == 40


def test_a_leak_in_most_cycles_is_growth_by_the_net_rule() -> None:
    """+1 in 8 of 10 cycles: not every cycle, but the net growth passes the threshold."""
    readings = [0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8]

    verdict = judge("objects:Engine", [0, 0], readings)

    assert verdict is not None and verdict.rule == "net"
    assert verdict.threshold == 4.0  # allowance 1 x ceil(10 / 3)


def test_warmup_noise_raises_the_allowance() -> None:
    """A type that moved by 3 between warm-up readings must grow by 3 a cycle to count."""
    assert noise([50, 53]) == 3
    assert judge("objects:frame", [50, 53], [53, 54, 55, 56, 57, 58]) is None
    assert judge("objects:frame", [50, 53], [53, 56, 59, 62, 65, 68]) is not None


def test_the_first_warmup_reading_is_only_compared_with_the_next() -> None:
    assert noise([10]) == 0 and noise([]) == 0 and noise([1, 9, 8]) == 8


def test_bytes_below_the_unit_are_noise() -> None:
    rss = [100 * MiB + i * 100_000 for i in range(6)]  # +0.1 MB a cycle
    assert judge("rss", [rss[0], rss[0]], rss, unit=4 * MiB) is None
    grown = [100 * MiB + i * 8 * MiB for i in range(6)]
    assert judge("rss", [grown[0], grown[0]], grown, unit=4 * MiB) is not None


def test_a_stated_threshold_replaces_the_rules() -> None:
    steady = [0, 1, 2, 3, 4, 5]
    assert judge("threads", [0, 0], steady, stated=10) is None
    verdict = judge("threads", [0, 0], steady, stated=3)
    assert verdict is not None and verdict.stated and verdict.threshold == 3


def test_one_measured_cycle_has_no_every_cycle_rule() -> None:
    assert judge("threads", [0, 0], [0, 1]) is None


# --- the measurements, both sides -------------------------------------------------------------
class CachedEngine:
    """vLLM PR #46023's shape: lru_cache on a method keeps every engine (self is in the key)."""

    @functools.cache  # noqa: B019 - the bug under test
    def tokenizer_for(self, name: str) -> str:
        return name.upper()


class Engine:
    def tokenizer_for(self, name: str) -> str:
        return name.upper()


def test_objects_kept_by_lru_cache_are_growth_named_with_their_holder() -> None:
    def cycle() -> None:
        CachedEngine().tokenizer_for("gpt2")

    try:
        with pytest.raises(ShutdownContractError) as info:
            assert_no_growth(cycle, cycles=6, settle_s=SETTLE_S)
    finally:
        CachedEngine.tokenizer_for.cache_clear()

    first = info.value.findings[0]
    assert first.code == "growth"
    assert first.message.startswith("CachedEngine: +1 per cycle (6 cycles); held by ")
    assert "lru_cache wrapper CachedEngine.tokenizer_for" in first.message
    assert first.details["type"].endswith("test_growth.CachedEngine")
    assert "_lru_cache_wrapper" in first.details["backref_chain"]


def test_objects_that_are_collected_are_not_growth() -> None:
    record = assert_no_growth(lambda: Engine().tokenizer_for("gpt2"), cycles=6)

    assert record.findings == () and record.grown == ()
    assert record.object_types > 10


REGISTRY: list[Engine] = []


def test_a_module_registry_is_named_as_the_holder() -> None:
    try:
        with pytest.raises(ShutdownContractError) as info:
            assert_no_growth(lambda: REGISTRY.append(Engine()), settle_s=SETTLE_S)
    finally:
        REGISTRY.clear()

    assert f"held by list {__name__}.REGISTRY" in info.value.findings[0].message


def test_threads_started_and_never_ended_are_growth() -> None:
    stop = threading.Event()

    def cycle() -> None:
        threading.Thread(target=stop.wait, name="engine-output", daemon=True).start()

    try:
        with pytest.raises(ShutdownContractError) as info:
            assert_no_growth(cycle, settle_s=SETTLE_S)
    finally:
        stop.set()
    found = {f.details["metric"]: f for f in info.value.findings}
    assert found["threads"].message.startswith("threads: +1 per cycle (5 cycles); new: ")
    assert "'engine-output'" in found["threads"].message
    assert "os-threads" not in found  # the same threads, said once


def test_threads_joined_at_shutdown_are_not_growth() -> None:
    def cycle() -> None:
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait, name="engine-output")
        thread.start()
        stop.set()
        thread.join(5)

    record = assert_no_growth(cycle)

    assert set(record.series["threads"]) == {record.series["threads"][0]}


def test_os_threads_outside_threading_are_growth() -> None:
    """``_thread.start_new_thread`` threads are not in threading.enumerate(): /proc sees them."""
    locks: list[_thread.LockType] = []

    def cycle() -> None:
        lock = _thread.allocate_lock()
        lock.acquire()
        locks.append(lock)
        _thread.start_new_thread(lock.acquire, ())

    try:
        with pytest.raises(ShutdownContractError) as info:
            assert_no_growth(cycle, max_growth={"objects": 100}, settle_s=SETTLE_S)
    finally:
        for lock in locks:
            lock.release()
    assert metrics(info.value) == ["os-threads"]
    assert info.value.findings[0].message.startswith("OS threads: +1 per cycle (5 cycles)")


def test_file_descriptors_left_open_are_growth() -> None:
    opened: list[int] = []

    def cycle() -> None:
        opened.extend(os.pipe())

    try:
        with pytest.raises(ShutdownContractError) as info:
            assert_no_growth(cycle, max_growth={"objects": 100}, settle_s=SETTLE_S)
    finally:
        for fd in opened:
            os.close(fd)
    finding = info.value.findings[0]
    assert finding.details["metric"] == "fds" and finding.details["per_cycle"] == 2.0
    assert finding.message.startswith("file descriptors: +2 per cycle (5 cycles); new: ")
    assert "pipe:[" in finding.message


def test_file_descriptors_closed_are_not_growth() -> None:
    def cycle() -> None:
        for fd in os.pipe():
            os.close(fd)

    assert_no_growth(cycle)


def test_resident_memory_kept_is_growth() -> None:
    kept: list[bytes] = []

    def cycle() -> None:
        kept.append(b"\x01" * (16 * MiB))  # written: the pages are resident

    try:
        with pytest.raises(ShutdownContractError) as info:
            assert_no_growth(cycle, max_growth={"objects": 100}, settle_s=SETTLE_S)
    finally:
        kept.clear()
    assert metrics(info.value) == ["rss"]
    message = info.value.findings[0].message
    # +16 MiB in every cycle, or (when the allocator reuses pages in one of them under load) the
    # net growth past the threshold derived from the largest single cycle: growth either way
    assert "MiB per cycle (5 cycles)" in message or "MiB over 5 cycles" in message, message


def test_resident_memory_freed_is_not_growth() -> None:
    def cycle() -> None:
        block = b"\x01" * (16 * MiB)
        del block

    assert_no_growth(cycle)


# --- device memory: a per-process NVML reader over a fake NVML --------------------------------
def fake_gpu_reader(gpu: Gpu) -> NvmlProcessReader:
    return NvmlProcessReader(0, nvml=FakeNvml([gpu]), environ={}, pids=lambda: [os.getpid()])


def test_device_memory_kept_by_each_cycle_is_growth() -> None:
    gpu = Gpu("GPU-aaaa", processes=[(os.getpid(), 500 * MiB)])

    def cycle() -> None:
        pid, used = gpu.processes[0]
        gpu.processes[0] = (pid, (used or 0) + 64 * MiB)  # a KV cache never freed

    with pytest.raises(ShutdownContractError) as info:
        assert_no_growth(cycle, device_memory=fake_gpu_reader(gpu), settle_s=SETTLE_S)

    finding = info.value.findings[0]
    assert finding.details["metric"] == "device-memory"
    assert finding.details["reader"] == "nvml-per-process"
    assert finding.message == "device memory: +64.0 MiB per cycle (5 cycles)"


def test_device_memory_returned_is_not_growth_and_other_processes_do_not_count() -> None:
    gpu = Gpu("GPU-aaaa", processes=[(os.getpid(), 500 * MiB), (1, 0)])

    def cycle() -> None:
        gpu.processes[1] = (1, (gpu.processes[1][1] or 0) + 64 * MiB)  # someone else's

    record = assert_no_growth(cycle, device_memory=fake_gpu_reader(gpu))

    assert record.device_memory == "nvml-per-process"
    assert set(record.series["device-memory"]) == {500 * MiB}


def test_auto_measures_no_device_memory_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import pytest_shutdown.devices as devices

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    monkeypatch.setattr(devices, "detect_platform", lambda: "cpu")

    record = assert_no_growth(lambda: None, cycles=2, warmup=1)

    assert "device-memory" not in record.series
    assert record.device_memory == "not measured: no device (the CPU platform)"


def test_auto_reads_device_memory_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import pytest_shutdown.devices as devices

    gpu = Gpu("GPU-aaaa", processes=[(os.getpid(), 300 * MiB)])
    nvml = FakeNvml([gpu])
    asked: list[str] = []

    def memory_reader(platform: str) -> NvmlProcessReader:
        asked.append(platform)
        return NvmlProcessReader(0, nvml=nvml, environ={}, pids=lambda: [os.getpid()])

    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or object())
    monkeypatch.setattr(devices, "detect_platform", lambda: "cuda")
    monkeypatch.setattr(devices, "memory_reader", memory_reader)

    record = assert_no_growth(lambda: None, cycles=2, warmup=1)

    assert asked == ["cuda"]
    assert record.series["device-memory"] == (300 * MiB,) * 3
    assert (nvml.inits, nvml.shutdowns) == (1, 1)  # the reader it picked, it closed


def test_auto_without_torch_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    reader, note = census.pick_device_reader("auto")
    assert reader is None and note == "not measured: torch is not imported"
    assert "torch" not in sys.modules


# --- noise handling, end to end -----------------------------------------------------------------
def test_a_spike_that_settles_is_measured_again_and_does_not_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Leftovers that are gone a moment later (a thread still exiting with its objects): the
    noisy reading is taken again after the settle time, and the second reading stands. The
    settle is made deterministic: the leftovers go exactly while the check waits."""
    import time

    from pytest_shutdown.helpers import growth

    held: list[Engine] = []
    calls = [0]

    class SettlingClock:
        perf_counter = staticmethod(time.perf_counter)

        @staticmethod
        def sleep(seconds: float) -> None:
            held.clear()  # the exiting thread lets go

    monkeypatch.setattr(growth, "time", SettlingClock)

    def cycle() -> None:
        calls[0] += 1
        if calls[0] == 4:  # the second measured cycle
            held.extend(Engine() for _ in range(50))

    record = assert_no_growth(cycle)

    assert record.remeasured == (2,)
    assert record.findings == ()


def test_a_spike_that_stays_for_one_cycle_does_not_fail() -> None:
    calls = [0]
    held: list[Engine] = []

    def cycle() -> None:
        calls[0] += 1
        held.clear()
        if calls[0] == 4:
            held.extend(Engine() for _ in range(50))

    record = assert_no_growth(cycle, settle_s=SETTLE_S)

    assert 2 in record.remeasured  # noisy: measured again, still there, then gone a cycle later


def test_an_exception_of_the_cycle_propagates_unchanged() -> None:
    def cycle() -> None:
        raise KeyError("engine failed to start")

    with pytest.raises(KeyError, match="engine failed to start"):
        assert_no_growth(cycle)


def test_measure_growth_returns_the_findings_instead_of_raising() -> None:
    kept: list[Engine] = []

    record = measure_growth(lambda: kept.append(Engine()), settle_s=SETTLE_S)

    assert [f.code for f in record.findings][:1] == ["growth"]
    assert len(record.measure_s) == 2 + 5  # warm-up readings, then one per measured cycle


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cycles": 0}, "cycles: expected an integer >= 1, got 0"),
        ({"cycles": True}, "cycles: expected an integer >= 1, got True"),
        ({"warmup": -1}, "warmup: expected an integer >= 0, got -1"),
        ({"settle_s": float("nan")}, "settle_s: expected a number of seconds >= 0"),
        ({"max_growth": {"threads": -1}}, r"max_growth\['threads'\]: expected a number >= 0"),
        ({"device_memory": "nvml"}, "device_memory: expected 'auto', None or a reader"),
    ],
)
def test_bad_arguments_are_refused_naming_them(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        assert_no_growth(lambda: None, **kwargs)  # type: ignore[arg-type]


def test_the_nearest_holder_skips_containers() -> None:
    wrapper = functools.lru_cache(maxsize=None)(Engine.tokenizer_for)
    target = Engine()
    module = type(os)("engines")
    module.ENGINES = [target]  # type: ignore[attr-defined]

    assert nearest_holder([wrapper, {}, (target,), target]).startswith("lru_cache wrapper ")
    assert nearest_holder([module, module.ENGINES, target]) == "list engines.ENGINES"  # type: ignore[attr-defined]
    assert nearest_holder([target]) == ""


def test_the_guards_own_process_records_are_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the guard on, pytest_shutdown.ownership.origins keeps a bounded record per started
    process: the guard's bookkeeping, not the engine's growth."""
    import collections
    import weakref

    from pytest_shutdown.ownership import origins

    records: collections.OrderedDict[int, object] = collections.OrderedDict()
    monkeypatch.setattr(origins, "_processes", records)

    def cycle() -> None:
        engine = Engine()
        records[len(records) + 1] = (weakref.ref(engine), origins.Origin((), None))

    assert_no_growth(cycle)

    kept: list[object] = []
    with pytest.raises(ShutdownContractError, match="Origin: \\+1 per cycle"):
        assert_no_growth(lambda: kept.append(origins.Origin((), None)), settle_s=SETTLE_S)
