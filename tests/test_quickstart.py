"""docs/quickstart.md runs as a newcomer would run it, copied from the page as it is.

Every ``python`` block of the page is a file of one project, named by its first line
(``# my_engine.py``); every ``console`` block is commands to run in that project, in page order.
The test writes the files into a temporary folder, makes a virtual environment, runs the page's
``pip install`` with the package's source pointed at this checkout (offline: ``--no-deps
--no-build-isolation --no-index``; the environment sees the running interpreter's packages for
pytest and the build backend, not its ``pytest_shutdown``), then the page's ``pytest`` command,
and compares the output with the ``text`` block the page shows after that command: each of its
lines is found in one output line, ``...`` standing for anything, and the counts of its summary
line are pytest's.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from doc_pages import DOCS, ROOT, Block, blocks

PAGE = DOCS / "quickstart.md"
FILE_NAME = re.compile(r"\A# ([\w/]+\.py)\n")
#: pytest's outcome counts; warnings are left out (they come from the environment's plugins).
SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")
#: The variables of the run this test is part of that would change the inner one: the checkout
#: on PYTHONPATH would shadow the installed package.
OUTER_ONLY = ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_XDIST_WORKER",
              "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST")

PAGE_BLOCKS = blocks([PAGE])


def project_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for block in PAGE_BLOCKS:
        if block.lang == "python":
            name = FILE_NAME.match(block.code)
            assert name, f"{block.where}: a python block starts with its file name, '# name.py'"
            assert name.group(1) not in files, f"{block.where}: {name.group(1)} shown twice"
            files[name.group(1)] = block.code
    return files


def commands() -> list[tuple[str, Block]]:
    """Each command line of the page's console blocks, with its block."""
    return [
        (line, block)
        for block in PAGE_BLOCKS
        if block.lang == "console"
        for line in block.code.splitlines()
        if line.strip()
    ]


def expected_output(after: Block) -> list[str]:
    """The lines of the ``text`` block that follows the console block ``after``."""
    following = PAGE_BLOCKS[PAGE_BLOCKS.index(after) + 1 :]
    assert following and following[0].lang == "text", f"{after.where}: show its output after it"
    return following[0].code.splitlines()


def shows(line: str, output: str) -> bool:
    """``line`` (``...`` for anything) is in one line of ``output``."""
    parts = [re.escape(part.strip()) for part in line.split("...")]
    pattern = r"(?<![\w-])" + ".*".join(part for part in parts if part)
    return any(re.search(pattern, out) for out in output.splitlines())


def counts(summary: str) -> dict[str, int]:
    return {word.rstrip("s") if word != "passed" else word: int(n) for n, word in
            SUMMARY.findall(summary)}


def installed_to(args: list[str], venv_python: Path) -> list[str]:
    """The page's ``pip install ARGS`` with the package's source pointed at this checkout."""
    assert args[:2] == ["pip", "install"], args
    names_us = re.compile(r"^(\./)?pytest-shutdown(\[[\w,]+\])?( @ .*|/?)$")
    targets = [str(ROOT) if names_us.match(arg) else arg for arg in args[2:]]
    assert str(ROOT) in targets, f"{shlex.join(args)} does not install pytest-shutdown"
    assert all(t == str(ROOT) or t.startswith("-") for t in targets), "only pytest-shutdown"
    offline = ["--no-deps", "--no-build-isolation", "--no-index", "-q"]
    return [str(venv_python), "-m", "pip", "--disable-pip-version-check", "install", *offline,
            *targets]


def make_venv(where: Path) -> Path:
    """A venv whose own site-packages comes first and then the running interpreter's ones
    (a ``.pth`` of their paths: ``--system-site-packages`` alone would reach the base
    interpreter's, not those of a venv running this test); its python."""
    venv.create(where, with_pip=False, system_site_packages=True)
    python = where / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (Path(own) / "outer_site_packages.pth").write_text("\n".join(ours) + "\n")
    return python


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in OUTER_ONLY}
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_page_is_a_project_and_its_commands() -> None:
    assert set(project_files()) == {"my_engine.py", "conftest.py", "test_engine.py"}
    assert [shlex.split(line)[0] for line, _ in commands()] == ["pip", "pytest"]
    assert any("[thread-leak]" in line for line in expected_output(commands()[-1][1]))


def test_shows_reads_the_elisions_and_the_counts() -> None:
    output = "x\ntest_a.py::test_b: [thread-leak] 1 thread 'poller'.\n= 16 passed, 1 error in 3s"
    assert shows("test_a.py::test_b: [thread-leak] ... 'poller' ...", output)
    assert not shows("test_a.py::test_b: [fd-leak] ... 'poller' ...", output)
    assert not shows("6 passed, 1 error in ...", output)  # 16 is not 6
    assert counts("16 passed, 1 error in 3s") == {"passed": 16, "error": 1}
    assert counts("1 failed, 2 errors, 1 warning") == {"failed": 1, "error": 2}


@pytest.mark.timeout(480)  # each of its four runs is bounded at 120 s
def test_the_quick_start_runs_as_the_page_says(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the offline install builds with hatchling ('dev')")
    project = tmp_path / "project"
    for name, code in project_files().items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(code, encoding="utf-8")
    python = make_venv(tmp_path / "venv")

    for line, block in commands():
        args = shlex.split(line)
        if args[0] == "pip":
            done = run(installed_to(args, python), project)
            assert done.returncode == 0, done.stdout + done.stderr
            where = run([str(python), "-c", "import pytest_shutdown as p; print(p.__file__)"],
                        project)
            installed = Path(where.stdout.strip())
            assert installed.is_relative_to(tmp_path / "venv"), where.stdout + where.stderr
            continue
        assert args[0] == "pytest", f"{block.where}: no way to run {line!r} here"
        done = run([str(python), "-m", "pytest", *args[1:]], project)
        output = done.stdout + done.stderr
        expected = expected_output(block)
        for shown in expected:
            assert shows(shown, output), f"{block.where}: {shown!r} not in:\n{output[-4000:]}"
        summary = [s for s in expected if SUMMARY.match(s)]
        assert summary, f"{block.where}: the output shown ends with pytest's counts"
        ran = [s for s in output.splitlines() if " in " in s and SUMMARY.search(s)]
        assert ran and counts(ran[-1]) == counts(summary[-1]), output[-4000:]
