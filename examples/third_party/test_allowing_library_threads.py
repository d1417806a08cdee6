"""Allowing a third-party library's long-lived thread, by name and with a reason.

Some libraries start a daemon thread the first time they are used and keep it for the life of
the process (a metrics exporter, a telemetry flusher, a file watcher). When the library keeps it
where the guard can see it (here a class attribute, or a module global), it is owned: never the
first test's leak, listed as a long-lived resource at the end (docs/ownership.md). When it keeps
it only in C or in the thread's own frame, the first test that triggers it would be blamed for a
``thread-leak``: allow exactly that thread, by name pattern, on the tests that start it; the
guard still reports any other thread. Or start it in a fixture of wider scope: what a module or
session fixture starts belongs to that fixture, and is checked when the fixture is torn down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest


class MetricsExporter:
    """Stands in for a library's process-wide background thread, started lazily and kept where
    the guard cannot see it: no Python object refers to the thread (a C extension's, say); the
    library finds it again by name."""

    _started = False
    _stop = threading.Event()

    @classmethod
    def ensure_started(cls) -> None:
        if not cls._started:
            cls._stop.clear()
            threading.Thread(target=cls._stop.wait, name="metrics-exporter-0", daemon=True).start()
            cls._started = True

    @classmethod
    def thread(cls) -> threading.Thread | None:
        return next((t for t in threading.enumerate() if t.name == "metrics-exporter-0"), None)

    @classmethod
    def stop(cls, timeout: float = 5.0) -> None:
        """What the library does at interpreter exit; here so the example leaves nothing."""
        cls._stop.set()
        thread = cls.thread()
        if thread is not None:
            thread.join(timeout)
            assert not thread.is_alive(), "metrics exporter did not stop"
        cls._started = False


@pytest.fixture(scope="module", autouse=True)
def stop_exporter_at_module_end() -> Iterator[None]:
    yield
    MetricsExporter.stop()


@pytest.mark.allow_leaks(threads=["metrics-exporter-*"], reason="library thread, process-wide")
def test_first_use_of_the_library_starts_its_thread() -> None:
    MetricsExporter.ensure_started()
    thread = MetricsExporter.thread()
    assert thread is not None and thread.is_alive()


@pytest.fixture(scope="module")
def exporter() -> Iterator[type[MetricsExporter]]:
    """Started by a module fixture: the thread is the fixture's, checked at its teardown."""
    MetricsExporter.ensure_started()
    yield MetricsExporter
    MetricsExporter.stop()


def test_a_wider_scope_fixture_owns_the_library_thread(exporter: type[MetricsExporter]) -> None:
    thread = exporter.thread()
    assert thread is not None and thread.is_alive()
