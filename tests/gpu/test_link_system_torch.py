"""USE_SYSTEM_TORCH=1 finds the machine's torch even when ``python3`` is itself a venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "link-system-torch"


def make_venv(path: Path, python: str, *flags: str) -> str:
    subprocess.run([python, "-m", "venv", "--without-pip", *flags, str(path)], check=True,
                   timeout=120)
    return str(path / "bin" / "python")


def site_packages(python: str) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    return Path(out.stdout.strip())


def link(python: str, venv: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), python, str(venv)], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def parent_venv(tmp_path: Path) -> str:
    """A venv standing for a GPU image's Python: torch (a stand-in) in its own site-packages."""
    return make_venv(tmp_path / "system", sys.executable)


def test_the_torch_of_a_parent_venv_is_importable_in_the_new_venv(tmp_path, parent_venv) -> None:
    fake = site_packages(parent_venv) / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '9.9.9+gpu'\n")
    (site_packages(parent_venv) / "torch-9.9.9.dist-info").mkdir()
    (site_packages(parent_venv) / "torch-9.9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n"
    )
    venv = tmp_path / "project-venv"
    child = make_venv(venv, parent_venv, "--system-site-packages")
    before = subprocess.run([child, "-c", "import torch"], capture_output=True, timeout=60)
    assert before.returncode != 0, "--system-site-packages alone does not reach a venv's torch"

    done = link(parent_venv, venv)

    assert done.returncode == 0, done.stderr
    assert "using the system torch 9.9.9+gpu" in done.stdout
    out = subprocess.run(
        [child, "-c", "import torch, importlib.metadata as m; "
                      "print(torch.__file__, m.version('torch'))"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    assert out.stdout.split() == [str(fake / "__init__.py"), "9.9.9"], "pip sees it installed"


def test_without_a_system_torch_it_stops_and_never_downloads(tmp_path, parent_venv) -> None:
    venv = tmp_path / "project-venv"
    make_venv(venv, parent_venv, "--system-site-packages")
    done = link(parent_venv, venv)
    assert done.returncode == 1
    assert "USE_SYSTEM_TORCH=1, but torch cannot be imported" in done.stderr
    assert "torch is never downloaded in this mode" in done.stderr
