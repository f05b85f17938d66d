"""The install paths.

The GPU path: requirements-gpu.txt pins the torch the pinned sglang release requires (read
from the wheel's own metadata), the Makefile installs that set, never the CPU set, into a
virtualenv that holds sglang, and `make install-gpu` first checks, before any download,
that the host can run the pinned wheels: the NVIDIA driver against their CUDA build,
glibc against their manylinux tag, the venv's Python against their tags and
Requires-Python, all read from their metadata (tests/data/gpu_wheels/ records it, and a
test holds that record to the wheels). Test tools (apt's chromium and tmux,
requirements-test.txt) are installed by `make test` only.

The Makefile runs for real against a stand-in virtualenv whose `python` only records what
it is asked (no package is installed), with stand-in `nvidia-smi`, `ldd` and `apt-get` on
PATH.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from compressor_2.host import check, wheels
from compressor_2.host.check import pins
from tests.sglang_wheel import GPU_REQUIREMENTS, REPO, pinned, sglang_wheel, wheel_metadata

RECORDED = REPO / "tests" / "data" / "gpu_wheels"
STAND_IN_PYTHON = """#!/bin/sh
echo "$*" >> "$STAND_IN_LOG"
case "$*" in
  *find_spec*) exit "${STAND_IN_NO_SGLANG:-0}" ;;
  *getattr\\(sys*) echo "${STAND_IN_PYTHON_IS:-cpython 3.12.1 x86_64 0}" ;;
esac
exit 0
"""
STAND_IN_NVIDIA_SMI = """#!/bin/sh
[ -n "$STAND_IN_NO_DRIVER" ] && { echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA \
driver." ; exit 9; }
case "$*" in
  *driver_version*) echo "${STAND_IN_DRIVER:-580.65.06}" ;;
  *compute_cap*) echo 9.0 ;;
esac
"""
STAND_IN_LDD = """#!/bin/sh
[ -n "$STAND_IN_MUSL" ] && { echo "musl libc (x86_64)" >&2; echo "Version 1.2.4" >&2; exit 1; }
echo "ldd (Ubuntu GLIBC ${STAND_IN_GLIBC:-2.35}-0ubuntu3.1) ${STAND_IN_GLIBC:-2.35}"
"""
STAND_IN_APT = """#!/bin/sh
echo "apt-get $*" >> "$STAND_IN_APT_LOG"
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


# -- the recorded metadata is the pinned wheels' ---------------------------------------------------


def recorded(name: str) -> wheels.Project:
    return wheels.Project(**json.loads((RECORDED / f"{name}-{pins(GPU_REQUIREMENTS)[name]}.json").read_text()))


def test_the_recorded_metadata_is_the_pinned_sglang_wheels():
    sglang = recorded("sglang")
    wheel = sglang_wheel()  # the cache's, downloaded once by the contract tests (skips without a registry)
    metadata = wheel_metadata(wheel)
    assert sglang.version == metadata["Version"] == pinned(GPU_REQUIREMENTS, "sglang")
    assert wheel.name in sglang.files
    assert sglang.requires_python == metadata["Requires-Python"]
    assert sglang.requires_dist == metadata.get_all("Requires-Dist")
    # ... and names the torch the record of torch is about.
    torch = recorded("torch")
    assert f"torch=={torch.version}" in sglang.requires_dist and torch.version == pinned(GPU_REQUIREMENTS, "torch")


def test_what_the_check_derives_from_the_recorded_metadata():
    sglang, torch = recorded("sglang"), recorded("torch")
    assert wheels.cuda_majors(torch.requires_dist) == {13} and wheels.cuda_majors(sglang.requires_dist) == {13}
    assert {wheels.wheel_tag(f).glibc for f in sglang.files} == {(2, 34)}
    assert {wheels.wheel_tag(f).glibc for f in torch.files if wheels.wheel_tag(f).machine == "x86_64"} == {(2, 28)}
    assert {p for f in sglang.files for p in wheels.wheel_tag(f).pythons} == {"cp311", "cp312", "cp313"}
    assert sglang.requires_python == ">=3.11" and not any(f.endswith(".tar.gz") for f in sglang.files)


def test_the_index_still_serves_what_was_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Reads the pinned wheels' metadata from the package index as `make install-gpu` does
    (PEP 691 page, then PEP 658 metadata or byte ranges: never a whole wheel)."""
    for name, version in pins(GPU_REQUIREMENTS).items():
        try:
            fetched = wheels.fetch_project(name, version, os.environ.get("PIP_INDEX_URL") or wheels.DEFAULT_INDEX)
        except wheels.WheelError as exc:
            pytest.skip(f"the package index cannot be read here: {exc}")
        assert fetched == recorded(name)


@pytest.mark.parametrize(("specifier", "version", "ok"), [
    (">=3.11", (3, 12, 1), True), (">=3.11", (3, 10, 12), False), (">=3.10,<3.13", (3, 13, 0), False),
    ("!=3.12.*", (3, 12, 4), False), ("!=3.12.*", (3, 13, 0), True), ("~=3.11", (3, 14, 0), True),
    ("~=3.11.2", (3, 12, 0), False), ("==3.12.*", (3, 12, 9), True), ("", (3, 6, 0), True)])
def test_requires_python_is_read_as_pip_reads_it(specifier: str, version: tuple[int, ...], ok: bool):
    assert wheels.satisfies(version, specifier) is ok


def test_the_check_parses_in_the_oldest_python_it_may_meet():
    import ast

    for path in (REPO / "compressor_2" / "host").glob("*.py"):
        ast.parse(path.read_text(), feature_version=(3, 6))  # RHEL 8's python3: it runs before any install


# -- a malformed answer of the index: one line, no traceback ---------------------------------------

WHEEL = f"sglang-{pins(GPU_REQUIREMENTS)['sglang']}-cp311-abi3-manylinux_2_34_x86_64.whl"
NOT_A_ZIP = b"<html>not a wheel</html>" * 8


def page_of(**wheel: object) -> bytes:
    """A PEP 691 page listing the pinned sglang's one wheel, with `wheel`'s keys."""
    return json.dumps({"meta": {"api-version": "1.1"}, "name": "sglang",
                       "files": [{"filename": WHEEL, "url": WHEEL, "hashes": {}, **wheel}]}).encode()


# case -> ({path: body}, the end of what the check says after the index's address)
MALFORMED_ANSWERS: dict[str, tuple[dict[str, bytes], str]] = {
    "a JSON page without files": ({"/simple/sglang/": b'{"meta": {"api-version": "1.1"}, "name": "sglang"}'},
                                  "/simple/sglang/: unexpected answer (KeyError: 'files')"),
    "a JSON page that is not JSON": ({"/simple/sglang/": b"<html>Sign in to the proxy</html>"},
                                     "/simple/sglang/: unexpected answer (JSONDecodeError: Expecting value: "
                                     "line 1 column 1 (char 0))"),
    "core metadata not UTF-8": ({"/simple/sglang/": page_of(**{"core-metadata": True}),
                                 f"/simple/sglang/{WHEEL}.metadata": b"Name: sglang\nSummary: caf\xe9\n"},
                                f"/simple/sglang/{WHEEL}: unexpected answer (UnicodeDecodeError: 'utf-8' codec "
                                "can't decode byte 0xe9 in position 25: invalid continuation byte)"),
    "a wheel that is no zip": ({"/simple/sglang/": page_of(), f"/simple/sglang/{WHEEL}": NOT_A_ZIP},
                               f"/simple/sglang/{WHEEL}: unexpected answer (BadZipFile: File is not a zip file)"),
}


@contextlib.contextmanager
def index_serving(answers: dict[str, bytes]) -> Iterator[str]:
    """A package index on 127.0.0.1 whose every answer is a PEP 691 page, the body `answers`
    holds for the path (404 for any other), whole or the byte range asked for."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            body = answers.get(self.path)
            if body is None:
                self.send_error(404)
                return
            wanted = re.fullmatch(r"bytes=-(\d+)", self.headers.get("Range", ""))
            self.send_response(206 if wanted else 200)
            self.send_header("Content-Type", wheels._JSON)
            if wanted:  # the zip reader's first read: the end of the file, here all of it
                self.send_header("Content-Range", f"bytes 0-{len(body) - 1}/{len(body)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("case", sorted(MALFORMED_ANSWERS))
def test_a_malformed_index_answer_is_one_line_naming_it(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]):
    """Each of these escaped `make install-gpu`'s check as a traceback (only WheelError was caught)."""
    answers, said = MALFORMED_ANSWERS[case]
    monkeypatch.setenv("COMPRESSOR_2_CACHE", str(tmp_path))  # nothing cached: the index is read
    monkeypatch.setenv("no_proxy", "*")
    with index_serving(answers) as index:
        monkeypatch.setenv("PIP_INDEX_URL", f"{index}/simple")
        code = check.main([str(GPU_REQUIREMENTS), "--python", sys.executable])
    assert (code, capsys.readouterr().err) == (2, (
        f"make install-gpu: cannot read the pinned wheels' metadata ({index}{said}): check the package index "
        "(PIP_INDEX_URL), or make install-gpu HOST_CHECK=skip installs without this check\n"))
    assert not (tmp_path / "gpu-host").exists()  # nothing cached: the next check asks again


# -- the Makefile, with stand-ins ----------------------------------------------------------------------


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture()
def make(tmp_path: Path):
    """run(target, *make_args, cwd=REPO, **env) -> (the finished make, every call of the stand-in
    python, apt-get's calls). PATH holds only the stand-ins and the few tools the recipes
    call: no tmux, no chromium."""
    maker = shutil.which("make")
    if maker is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _script(venv / "bin" / "python", STAND_IN_PYTHON)
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, text in (("nvidia-smi", STAND_IN_NVIDIA_SMI), ("ldd", STAND_IN_LDD), ("apt-get", STAND_IN_APT)):
        _script(tools / name, text)
    for name in ("sh", "touch", "rm"):
        (tools / name).symlink_to(shutil.which(name))
    cache = tmp_path / "cache"
    shutil.copytree(RECORDED, cache / "gpu-host")
    logs = {"python": tmp_path / "python.log", "apt": tmp_path / "apt.log"}

    def run(target: str, *make_args: str, cwd: Path = REPO,
            **env: str) -> tuple[subprocess.CompletedProcess[str], list[str], list[str]]:
        for log in logs.values():
            log.unlink(missing_ok=True)
        done = subprocess.run([maker, "--no-print-directory", target, f"VENV={venv}", f"PYTHON={sys.executable}",
                               f"CONFIG={tmp_path / 'test.config'}", "CHROMIUM=/nonexistent/chromium", *make_args],
                              cwd=cwd, capture_output=True, text=True, timeout=120,
                              env={"PATH": str(tools), "HOME": str(tmp_path), "COMPRESSOR_2_CACHE": str(cache),
                                   "STAND_IN_LOG": str(logs["python"]), "STAND_IN_APT_LOG": str(logs["apt"]), **env})
        calls, apt = (log.read_text().splitlines() if log.exists() else [] for log in logs.values())
        for stamp in (".installed", ".test-tools"):  # each call starts from a fresh venv
            (venv / stamp).unlink(missing_ok=True)
        return done, calls, apt

    return run


def installs(calls: list[str]) -> list[str]:
    return [call for call in calls if call.startswith("-m pip install -q -r")]


def test_make_install_installs_the_cpu_set_where_there_is_no_sglang(make):
    done, calls, _ = make("install", STAND_IN_NO_SGLANG="1")
    assert done.returncode == 0, done.stderr
    assert installs(calls) == ["-m pip install -q -r requirements.txt"]


def test_make_install_keeps_the_gpu_set_where_sglang_is_installed(make):
    done, calls, _ = make("install")
    assert done.returncode == 0, done.stderr
    assert installs(calls) == ["-m pip install -q -r requirements-gpu.txt"]


@pytest.mark.parametrize("python", ["cpython 3.11.9 x86_64 0", "cpython 3.12.1 x86_64 0", "cpython 3.13.0 x86_64 0",
                                    "cpython 3.12.3 aarch64 0"])
def test_make_install_gpu_installs_the_gpu_set_on_a_host_that_can_run_it(make, python: str):
    done, calls, _ = make("install-gpu", STAND_IN_PYTHON_IS=python)
    assert done.returncode == 0, done.stderr
    assert "host check: sglang 0.5.23 and torch 2.14.1 can run here" in done.stdout
    assert set(installs(calls)) == {"-m pip install -q -r requirements-gpu.txt"}


REFUSALS = {
    "an old driver": ({"STAND_IN_DRIVER": "550.54.15"},
                      "driver 550.54.15 is older than R580, which CUDA 13 (torch 2.14.1, the build sglang 0.5.23 "
                      "requires) needs: upgrade the NVIDIA driver to R580 or newer"),
    "no driver": ({"STAND_IN_NO_DRIVER": "1"},
                  "no NVIDIA driver answers (`nvidia-smi --query-gpu=driver_version --format=csv,noheader` failed "
                  "(NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)), and CUDA 13 "
                  "needs driver R580 or newer: run make install-gpu on the GPU machine, with its driver installed"),
    "an old glibc": ({"STAND_IN_GLIBC": "2.31"},
                     "glibc 2.31 is older than 2.34, which sglang 0.5.23's wheels need (manylinux_2_34; there is no "
                     "source distribution): use a newer Linux (Ubuntu 22.04+, Debian 12, RHEL 9) or a container "
                     "built on one"),
    "musl": ({"STAND_IN_MUSL": "1"}, "the C library is musl, not glibc: the wheels of sglang 0.5.23 and torch "
                                     "2.14.1 are built for glibc (manylinux)"),
    "Python 3.10": ({"STAND_IN_PYTHON_IS": "cpython 3.10.12 x86_64 0"},
                    "{venv}/bin/python is CPython 3.10.12, but sglang 0.5.23 and torch 2.14.1 have wheels for CPython "
                    "3.11, 3.12, 3.13 only: remove {venv} and run make install-gpu PYTHON=python3.13"),
    "Python 3.14": ({"STAND_IN_PYTHON_IS": "cpython 3.14.0 x86_64 0"},
                    "{venv}/bin/python is CPython 3.14.0, but sglang 0.5.23 and torch 2.14.1 have wheels for CPython "
                    "3.11, 3.12, 3.13 only"),
    "a free-threaded Python": ({"STAND_IN_PYTHON_IS": "cpython 3.13.1 x86_64 1"},
                               "{venv}/bin/python is CPython 3.13.1 (free-threaded), but sglang 0.5.23 and torch "
                               "2.14.1 have wheels for CPython 3.11, 3.12, 3.13 only (standard builds, not "
                               "free-threaded)"),
    "PyPy": ({"STAND_IN_PYTHON_IS": "pypy 3.11.9 x86_64 0"}, "{venv}/bin/python is PyPy 3.11.9, but sglang 0.5.23"),
    "another machine": ({"STAND_IN_PYTHON_IS": "cpython 3.12.3 ppc64le 0"},
                        "sglang 0.5.23 has Linux wheels for aarch64, x86_64 only, not ppc64le"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_make_install_gpu_refuses_a_host_that_cannot_run_the_wheels_before_any_download(make, tmp_path, case):
    env, expected = REFUSALS[case]
    done, calls, _ = make("install-gpu", **env)
    assert done.returncode == 2
    [refusal] = [line for line in done.stderr.splitlines() if line.startswith("make install-gpu: ")]
    assert expected.format(venv=tmp_path / "venv") in refusal
    assert not [call for call in calls if "pip" in call]  # nothing downloaded, pip not even upgraded


def test_host_check_skip_installs_without_the_check(make):
    done, calls, _ = make("install-gpu", "HOST_CHECK=skip", STAND_IN_DRIVER="470.57.02")
    assert done.returncode == 0, done.stderr
    assert "host check" not in done.stdout and set(installs(calls)) == {"-m pip install -q -r requirements-gpu.txt"}


@pytest.mark.parametrize("target", ["run", "install", "install-gpu"])
def test_the_users_targets_never_call_apt(make, target: str):
    done, calls, apt = make(target)
    assert done.returncode == 0, done.stderr
    assert apt == []
    if target == "run":
        assert calls[-1].startswith("-m compressor_2 evolve --config")


def test_make_test_installs_the_test_tools_best_effort(make):
    done, calls, apt = make("test")
    assert done.returncode == 0, done.stderr
    assert apt == ["apt-get update -qq", "apt-get install -y -qq tmux", "apt-get update -qq",
                   "apt-get install -y -qq chromium"]
    assert calls[-1] == "-m pytest -q tests"


def test_make_test_installs_requirements_test_when_there_is_one(make, tmp_path: Path):
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in ("Makefile", "requirements.txt", "requirements-common.txt", "requirements-gpu.txt",
                 "pyproject.toml"):
        shutil.copy(REPO / name, copy / name)
    done, calls, _ = make("test", cwd=copy)
    assert done.returncode == 0 and "-m pip install -q -r requirements-test.txt" not in calls
    (copy / "requirements-test.txt").write_text("optuna\n")
    done, calls, _ = make("test", cwd=copy)
    assert done.returncode == 0, done.stderr
    assert installs(calls)[-1] == "-m pip install -q -r requirements-test.txt"
    assert calls.index("-m pip install -q -r requirements-test.txt") < calls.index("-m pytest -q tests")
