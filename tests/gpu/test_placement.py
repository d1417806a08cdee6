"""Data-parallel rank r uses the r-th visible device; a device context before a baseline."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.gpu.placement import device_for_rank, establish_device_context, place_rank


@pytest.mark.parametrize(
    ("device", "rank", "count", "expected"),
    [("cuda", 0, 4, "cuda:0"), ("cuda", 3, 4, "cuda:3"), ("cuda", 5, 4, "cuda:1"),
     ("cuda", 1, 1, "cuda:0"), ("cuda:0", 2, 3, "cuda:2"), ("cpu", 3, 4, "cpu"),
     ("cuda", 1, 0, "cuda")],
    ids=["rank0", "rank3", "wraps", "one-gpu", "indexed", "cpu", "no-count"],
)
def test_rank_r_uses_the_r_th_visible_device(device, rank, count, expected) -> None:
    assert device_for_rank(device, rank, count) == expected


def test_a_negative_rank_is_an_error() -> None:
    with pytest.raises(ValueError, match="dp_rank: expected an integer >= 0, got -1"):
        device_for_rank("cuda", -1, 2)


def fake_torch(count: int) -> SimpleNamespace:
    calls: list[tuple[str, object]] = []
    cuda = SimpleNamespace(
        device_count=lambda: count,
        set_device=lambda d: calls.append(("set_device", str(d))),
        synchronize=lambda d=None: calls.append(("synchronize", d)),
    )
    return SimpleNamespace(
        cuda=cuda, device=lambda d: d, calls=calls,
        zeros=lambda n, device: calls.append(("zeros", device)),
    )


def test_place_rank_makes_the_ranks_device_current_before_the_engine_allocates() -> None:
    config = EngineConfig(platform="cuda", device="cuda")
    torch = fake_torch(count=2)
    placed = place_rank(config, 1, torch=torch)
    assert placed.device == "cuda:1" and placed.platform == "cuda"
    assert torch.calls == [("set_device", "cuda:1")]
    cpu = EngineConfig(platform="cpu")
    assert place_rank(cpu, 1, torch=torch) is cpu and len(torch.calls) == 1


def test_the_device_context_is_made_on_the_device_only() -> None:
    torch = fake_torch(count=1)
    assert establish_device_context("cuda:0", torch=torch) is True
    assert torch.calls == [("zeros", "cuda:0"), ("synchronize", "cuda:0")]
    assert establish_device_context("cpu", torch=torch) is False and len(torch.calls) == 2


PLACED_ENGINES = r"""
import json, os, sys
from pytest_shutdown.engine import core_proc
from pytest_shutdown.engine.config import EngineConfig
from pytest_shutdown.engine.llm import ReferenceLLM

real = core_proc.place_rank

def recording(config, dp_rank, torch=None):
    with open(sys.argv[1], "a") as out:
        out.write(json.dumps([dp_rank, os.getpid()]) + "\n")
    return real(config, dp_rank)

core_proc.place_rank = recording  # inherited by the forked engine processes
config = EngineConfig(platform="cpu", start_method="fork", data_parallel_size=2)
with ReferenceLLM(config) as llm:
    pids = [p.pid for p in llm.manager.processes]
    llm.generate(["a", "b"], max_tokens=2)
print(json.dumps(pids))
"""


def test_every_engine_process_places_its_own_rank(tmp_path) -> None:
    log = tmp_path / "placed.jsonl"
    done = subprocess.run([sys.executable, "-c", PLACED_ENGINES, str(log)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    placed = sorted(tuple(json.loads(line)) for line in log.read_text().splitlines())
    assert placed == [(0, pids[0]), (1, pids[1])]
