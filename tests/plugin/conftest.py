"""Suites the plugin tests run with pytester, as fixtures that write them."""

from __future__ import annotations

import contextlib
import textwrap

import pytest

# An inline pytester run drops the modules it imported when it ends, and torch's C extension
# cannot be imported a second time in one process: import it here, before any inline run whose
# suite starts an engine, so every run finds it already loaded.
with contextlib.suppress(ImportError):
    import torch  # noqa: F401

#: A child process that exits by itself once its parent (the pytester run) is gone, so a leak
#: left on purpose with the guard off never outlives the test that started it. A parent that died
#: before the child looked (orphaned at birth: parent pid 1) and a 60 s deadline end it too.
CHILD = (
    "import os, time\\np = os.getppid()\\nend = time.monotonic() + 60\\n"
    "while p != 1 and os.getppid() == p and time.monotonic() < end: time.sleep(0.05)"
)

LEAKY = textwrap.dedent(
    f"""
    import gc, subprocess, sys, threading

    CHILD = "{CHILD}"
    _release = threading.Event()

    def test_clean():
        t = threading.Thread(target=sum, args=([1, 2],))
        t.start()
        t.join()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        gc.freeze()
        gc.unfreeze()

    def test_thread_leak():
        threading.Thread(target=_release.wait, name="leaky-thread", daemon=True).start()

    def test_process_leak():
        subprocess.Popen([sys.executable, "-c", CHILD])

    def test_freeze_leak():
        gc.freeze()
    """
)


@pytest.fixture
def leaky_suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """test_leaky.py: one clean test, then a thread leak, a process leak and a gc.freeze()."""
    pytester.makepyfile(test_leaky=LEAKY)
    return pytester


@pytest.fixture
def child_script() -> str:
    """Python source of a child process that ends when its parent does."""
    return CHILD
