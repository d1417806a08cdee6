"""``collective-hang`` from stacks: which collective or store wait a thread is blocked in."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_shutdown.helpers.collectives import (
    collective_hang_finding,
    collective_wait,
    rank_of,
    read_environ,
)

C10D = "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"


def dump(*frames: str, header: str = "Thread 0x00007f0000000001") -> str:
    body = "\n".join(f'  File "{file}", line {line} in {func}' for file, line, func in
                     (f.split("|") for f in frames))
    return f"Fatal Python error: Aborted\n\n{header} (most recent call first):\n{body}\n"


def test_a_thread_inside_a_torch_collective_is_named_by_it() -> None:
    stacks = dump(f"{C10D}|2890|all_reduce", f"{C10D}|81|wrapper", "/app/worker.py|40|step")
    wait = collective_wait(stacks)
    assert wait is not None
    assert wait.operation == "all_reduce"
    assert "distributed_c10d.py" in wait.frame
    assert "worker.py" in wait.stack


@pytest.mark.parametrize(
    ("line", "operation"),
    [
        ("    store.wait([f'step/{n}'])", "store.wait"),
        ("    value = self._store.get('ready')", "store.get"),
        ("    dist.barrier()", "barrier"),
        ("    torch.distributed.broadcast(t, src=0)", "broadcast"),
        ("    work.wait()", "work.wait"),
    ],
)
def test_the_frame_that_entered_cpp_is_read_at_its_source_line(
    tmp_path: Path, line: str, operation: str
) -> None:
    source = tmp_path / "rank.py"
    source.write_text("def f():\n" + line + "\n")
    wait = collective_wait(dump(f"{source}|2|f", "/app/main.py|9|main"))
    assert wait is not None and wait.operation == operation


def test_a_thread_elsewhere_is_not_a_collective_hang(tmp_path: Path) -> None:
    source = tmp_path / "loop.py"
    source.write_text("def f():\n    time.sleep(1)\n    store = None\n")
    stacks = dump(f"{source}|2|f") + dump(
        "/usr/lib/python3.12/threading.py|1147|_wait_for_tstate_lock",
        header="Current thread 0x00007f0000000002",
    )
    assert collective_wait(stacks) is None
    assert collective_wait("") is None
    # A torch.distributed frame that is no collective, under a frame that is none either.
    assert collective_wait(dump(f"{C10D}|100|is_initialized", f"{source}|2|f")) is None


def test_the_second_thread_of_a_dump_is_found_too(tmp_path: Path) -> None:
    source = tmp_path / "idle.py"
    source.write_text("def f():\n    pass\n")
    stacks = dump(f"{source}|2|f") + dump(
        f"{C10D}|4800|barrier", header="Current thread 0x00007f0000000002"
    )
    wait = collective_wait(stacks)
    assert wait is not None and wait.operation == "barrier"
    assert wait.stack.startswith("Current thread")


@pytest.mark.parametrize(
    ("environ", "name", "rank"),
    [
        ({"RANK": "3"}, "python", 3),
        ({"RANK": "x"}, "Worker_TP1", 1),
        (None, "EngineCore_DP0", 0),
        ({}, "rank12", 12),
        (None, "python3", None),
    ],
)
def test_the_rank_comes_from_the_environment_or_the_name(
    environ: dict[str, str] | None, name: str, rank: int | None
) -> None:
    assert rank_of(environ, name) == rank


def test_the_environment_of_this_process_is_readable() -> None:
    import os

    environ = read_environ(os.getpid())
    assert environ is not None and "PATH" in environ
    assert read_environ(2**22 + 7) is None


def test_the_finding_names_rank_operation_and_stack() -> None:
    wait = collective_wait(dump(f"{C10D}|2890|all_reduce"))
    assert wait is not None
    finding = collective_hang_finding(
        wait, name="Worker_TP0", pid=42, rank=0, after="10.0 s after SIGKILL to rank1",
        facts={"pid": 42},
    )
    assert finding.code == "collective-hang"
    assert finding.message == (
        "Worker_TP0 (pid 42, rank 0) is blocked in all_reduce 10.0 s after SIGKILL to rank1"
    )
    assert finding.details["operation"] == "all_reduce"
    assert finding.details["rank"] == 0
    assert "all_reduce" in finding.details["collective_stack"]
