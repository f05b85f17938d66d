"""The GPU install path: requirements-gpu.txt pins the torch the pinned sglang release
requires (read from the wheel's own metadata), and the Makefile installs that set, never
the CPU set, into a virtualenv that holds sglang, so a pull and `make run` on a GPU
machine cannot downgrade torch under SGLang.

The Makefile runs for real against a stand-in virtualenv whose `python` only records
what it is asked (no package is installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.sglang_wheel import GPU_REQUIREMENTS, REPO, pinned, sglang_wheel, wheel_metadata

STAND_IN_PYTHON = """#!/bin/sh
echo "$*" >> "$STAND_IN_LOG"
case "$*" in
  *find_spec*) exit "${STAND_IN_NO_SGLANG:-0}" ;;
  *version_info*) exit "${STAND_IN_NOT_311:-0}" ;;
  -V) echo "Python 3.12.1" ;;
esac
exit 0
"""


def test_the_gpu_path_installs_exactly_the_torch_sglang_requires():
    wheel = sglang_wheel()
    metadata = wheel_metadata(wheel)
    assert metadata["Version"] == pinned(GPU_REQUIREMENTS, "sglang")
    base = [Requirement(line) for line in metadata.get_all("Requires-Dist")]
    [torch] = [r for r in base if r.name == "torch" and r.marker is None]  # no extra, no platform
    assert str(torch.specifier) == f"=={pinned(GPU_REQUIREMENTS, 'torch')}"


def test_both_paths_pin_their_own_torch_and_share_everything_else():
    for requirements in (REPO / "requirements.txt", GPU_REQUIREMENTS):
        pinned(requirements, "torch")
        assert "-r requirements-common.txt" in requirements.read_text().splitlines()
    common = (REPO / "requirements-common.txt").read_text()
    assert "torch" not in [Requirement(line).name for line in common.splitlines()
                           if line.strip() and not line.startswith("#")]


@pytest.fixture()
def make(tmp_path: Path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    tools = tmp_path / "bin"  # a tmux, so that no test reaches for apt-get
    tools.mkdir()
    (tools / "tmux").write_text("#!/bin/sh\nexit 0\n")
    (tools / "tmux").chmod(0o755)
    log = tmp_path / "python.log"

    def run(target: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        done = subprocess.run(["make", "--no-print-directory", target, f"VENV={venv}"], cwd=REPO,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}",
                                   "STAND_IN_LOG": str(log), **env})
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return done, [call for call in calls if call.startswith("-m pip install -q -r")]

    return run


def test_make_install_installs_the_cpu_set_where_there_is_no_sglang(make):
    done, installs = make("install", STAND_IN_NO_SGLANG="1")
    assert done.returncode == 0, done.stderr
    assert installs == ["-m pip install -q -r requirements.txt"]


def test_make_install_keeps_the_gpu_set_where_sglang_is_installed(make):
    done, installs = make("install")
    assert done.returncode == 0, done.stderr
    assert installs == ["-m pip install -q -r requirements-gpu.txt"]


def test_make_install_gpu_installs_the_gpu_set(make):
    done, installs = make("install-gpu")
    assert done.returncode == 0, done.stderr
    assert set(installs) == {"-m pip install -q -r requirements-gpu.txt"}


def test_make_install_gpu_needs_python_3_11(make):
    done, installs = make("install-gpu", STAND_IN_NOT_311="1")
    assert done.returncode == 2 and installs == []
    assert "sglang 0.5.23 needs CPython 3.11" in done.stdout + done.stderr
    assert "PYTHON=python3.11" in done.stdout + done.stderr
