"""assert_second_engine_clean: engine A is gone before engine B is built (vLLM #54162 shape)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest

from pytest_shutdown import ShutdownContractError, assert_second_engine_clean
from pytest_shutdown.devices import NvmlProcessReader
from tests.gpu.gpu_fakes import FakeNvml, Gpu

MiB = 1 << 20


class Engine:
    """Starts an output thread and opens a pipe; ``shutdown`` releases both."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.stop.wait, name="engine-output")
        self.thread.start()
        self.read_fd, self.write_fd = os.pipe()
        self.requests: list[str] = []

    def generate(self, prompt: str) -> str:
        self.requests.append(prompt)
        return prompt.upper()

    def shutdown(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


ENGINES: list[Engine] = []


class RegisteredEngine(Engine):
    def __init__(self) -> None:
        super().__init__()
        ENGINES.append(self)  # the bug: a module registry keeps every engine


class ThreadLeakingEngine(Engine):
    def shutdown(self) -> None:  # the bug: the output thread is never stopped
        os.close(self.read_fd)
        os.close(self.write_fd)


class FdLeakingEngine(Engine):
    def shutdown(self) -> None:  # the bug: the pipe stays open
        self.stop.set()
        self.thread.join(5)


def use(engine: Engine) -> None:
    assert engine.generate("hello") == "HELLO"


def findings_of(build: Any, device_memory: Any = None, **options: Any) -> ShutdownContractError:
    """The error ``assert_second_engine_clean`` raises for ``build`` (engine A checked 0.3 s
    after its shutdown)."""
    with pytest.raises(ShutdownContractError) as info:
        assert_second_engine_clean(
            build, use, device_memory=device_memory, deadline_s=0.3, **options
        )
    return info.value


def test_a_clean_engine_passes_and_the_second_one_is_used() -> None:
    built: list[int] = []  # counts only: holding engine A would be the bug under test
    used: list[str] = []

    def build() -> Engine:
        built.append(1)
        return Engine()

    def use_and_record(engine: Engine) -> None:
        use(engine)
        used.append(engine.thread.name)

    report = assert_second_engine_clean(build, use_and_record, device_memory=None)

    assert report.check == "second-engine-clean" and report.subject == "Engine"
    assert len(built) == 3 and used == ["engine-output"] * 3  # warm-up, A, B
    assert report.details["threads_of_first"] == 1 and len(report.details["fds_of_first"]) == 2


def test_an_engine_kept_by_a_registry_is_not_collected_with_its_chain() -> None:
    try:
        error = findings_of(RegisteredEngine)
    finally:
        ENGINES.clear()

    assert error.codes == ["not-collected"]
    finding = error.findings[0]
    assert "the first RegisteredEngine was still alive after its shutdown" in finding.message
    assert "['ENGINES']" in finding.details["backref_chains"][0]


def test_a_thread_of_the_first_engine_still_running_is_a_thread_leak() -> None:
    stops: list[threading.Event] = []

    def build() -> Engine:
        engine = ThreadLeakingEngine()
        stops.append(engine.stop)
        return engine

    try:
        error = findings_of(build)
    finally:
        for stop in stops:
            stop.set()
    # the engine is collected; its running thread (and that thread's Event) are not
    assert error.codes == ["not-collected", "thread-leak"]
    surviving = error.findings[0].details["surviving"]
    assert {name.rsplit(".", 1)[-1] for name in surviving} == {"Thread", "Event"}
    assert error.findings[1].details["threads"] == ["engine-output"]


def test_descriptors_of_the_first_engine_left_open_are_growth() -> None:
    fds: list[int] = []

    def build() -> Engine:
        engine = FdLeakingEngine()
        fds.extend((engine.read_fd, engine.write_fd))
        return engine

    try:
        error = findings_of(build)
    finally:
        for fd in fds:
            os.close(fd)
    assert error.codes == ["growth"]
    assert len(error.findings[0].details["fds"]) == 2
    assert "pipe:[" in error.findings[0].message


def test_device_memory_of_the_first_engine_held_is_reported() -> None:
    gpu = Gpu("GPU-aaaa", processes=[(os.getpid(), 400 * MiB)])
    reader = NvmlProcessReader(0, nvml=FakeNvml([gpu]), environ={}, pids=lambda: [os.getpid()])

    def build() -> Engine:
        gpu.processes[0] = (os.getpid(), (gpu.processes[0][1] or 0) + 256 * MiB)
        return Engine()  # its KV cache is never given back

    error = findings_of(build, device_memory=reader)

    assert error.codes == ["device-memory-held"]
    assert "held 256.0 MiB of device memory" in error.findings[0].message


def test_a_second_engine_that_fails_propagates_its_error() -> None:
    built: list[int] = []

    def build() -> Engine:
        if len(built) == 2:  # the warm-up engine and A were fine
            raise OSError("address already in use")
        built.append(1)
        return Engine()

    with pytest.raises(OSError, match="address already in use") as info:
        assert_second_engine_clean(build, use, device_memory=None)
    if sys.version_info >= (3, 11):
        assert "the first" not in str(info.value)  # build failed: no note from use()


def test_a_second_engine_whose_use_fails_is_noted() -> None:
    calls = [0]

    def broken_use(engine: Engine) -> None:
        calls[0] += 1
        if calls[0] == 3:  # B, after the warm-up engine and A
            raise RuntimeError("engine core died")

    with pytest.raises(RuntimeError, match="engine core died") as info:
        assert_second_engine_clean(Engine, broken_use, device_memory=None)
    if sys.version_info >= (3, 11):
        assert "the second Engine failed" in "".join(getattr(info.value, "__notes__", []))


HELPER_FDS: list[int] = []


class EngineWithAProcessHelper(Engine):
    """The first engine of a process starts a helper kept for the process's lifetime (as
    multiprocessing's fork server is, with its pipes)."""

    def __init__(self) -> None:
        super().__init__()
        if not HELPER_FDS:
            HELPER_FDS.extend(os.pipe())


def test_what_the_first_engine_starts_for_the_process_is_not_a_leak() -> None:
    try:
        assert_second_engine_clean(EngineWithAProcessHelper, use, device_memory=None)
        for fd in HELPER_FDS:
            os.close(fd)
        HELPER_FDS.clear()
        error = findings_of(EngineWithAProcessHelper, warmup=0)  # no warm-up: A started it
        assert error.codes == ["growth"]
    finally:
        for fd in HELPER_FDS:
            os.close(fd)
        HELPER_FDS.clear()
