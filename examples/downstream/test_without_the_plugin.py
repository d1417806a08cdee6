"""The same leak checks without the pytest plugin: ``no_leaks`` as a context manager.

Useful in a test runner other than pytest, in a script, or around one block of a larger test.
"""

from __future__ import annotations

from mini_engine import MiniEngine

from pytest_shutdown import no_leaks


def test_the_engine_leaves_no_thread_or_process_behind() -> None:
    # ignore a debugger's threads by name pattern, and any thread a predicate accepts
    allow = ["pydevd.*", lambda thread: thread.name.startswith("tqdm")]
    with no_leaks(grace=5.0, allow=allow):
        engine = MiniEngine()
        assert engine.generate("ok") == [222, 214]
        engine.shutdown()
