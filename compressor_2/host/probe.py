"""What the host runs, asked of the host's own tools: the NVIDIA driver and the GPUs'
compute capability (`nvidia-smi`), the C library (`ldd --version`), and an interpreter's
implementation, version, ABI and machine (a one-line probe that any Python 3 runs)."""

import os
import re
import subprocess
from typing import List, NamedTuple, Optional, Tuple

# Runs on the interpreter being checked, whatever its version: no f-strings, nothing newer.
_PYTHON_PROBE = (
    "import platform, sys, sysconfig; "
    "sys.stdout.write(' '.join([getattr(sys, 'implementation', sys).name, "
    "'.'.join(map(str, sys.version_info[:3])), platform.machine(), "
    "str(sysconfig.get_config_var('Py_GIL_DISABLED') or 0)]) + '\\n')"
)
_TIMEOUT = 60  # seconds for one tool: nvidia-smi can take a while on a busy 8-GPU box


class ProbeError(Exception):
    """A tool is missing or failed; the message says what was found."""


class Interpreter(NamedTuple):
    path: str
    implementation: str  # "cpython", "pypy", ...
    version: Tuple[int, int, int]
    machine: str  # "x86_64", "aarch64", ...
    free_threaded: bool


def _output(command: List[str]) -> Tuple[int, str]:
    """(exit status, stdout and stderr) of a host tool."""
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=_TIMEOUT)
    except (FileNotFoundError, PermissionError):
        raise ProbeError(f"{command[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise ProbeError(f"`{' '.join(command)}` gave no answer within {_TIMEOUT} s") from None
    return done.returncode, done.stdout + done.stderr


def _run(command: List[str]) -> str:
    status, out = _output(command)
    if status != 0:
        last = out.strip().splitlines()
        raise ProbeError(f"`{' '.join(command)}` failed ({last[-1] if last else 'exit status %d' % status})")
    return out


def version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def _visible_devices() -> List[str]:
    """nvidia-smi's -i for the GPUs CUDA_VISIBLE_DEVICES leaves a process, or [] for all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [] if visible is None else ["-i", visible]


def nvidia_smi(field: str) -> List[str]:
    """One value per visible GPU of an nvidia-smi --query-gpu field."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return []
    out = _run(["nvidia-smi", *_visible_devices(), f"--query-gpu={field}", "--format=csv,noheader"])
    return [line.strip() for line in out.splitlines() if line.strip()]


def driver_version() -> str:
    """The NVIDIA driver's version, e.g. "550.54.15"; ProbeError when there is none."""
    versions = nvidia_smi("driver_version")
    if not versions:
        raise ProbeError("nvidia-smi lists no GPU")
    return min(versions, key=version_tuple)


def compute_capabilities() -> List[Tuple[int, int]]:
    """(major, minor) of every visible GPU; [] where nvidia-smi is missing or cannot say."""
    try:
        values = nvidia_smi("compute_cap")
    except ProbeError:
        return []
    found = [version_tuple(value) for value in values]
    return [(v[0], v[1]) for v in found if len(v) == 2]


def glibc_version() -> Tuple[int, int]:
    """The C library's version from `ldd --version` ("ldd (GNU libc) 2.35", "ldd (Ubuntu
    GLIBC 2.35-0ubuntu3.1) 2.35"); ProbeError for another C library (musl's ldd says musl)."""
    status, out = _output(["ldd", "--version"])
    first = out.strip().splitlines()[0] if out.strip() else "no output"
    if "musl" in out.lower():
        raise ProbeError("the C library is musl, not glibc")
    if status != 0 or not re.search(r"glibc|gnu libc|gnu c library", out, re.IGNORECASE):
        raise ProbeError(f"`ldd --version` does not name glibc ({first})")
    found = re.search(r"(\d+)\.(\d+)\s*$", first)
    if found is None:
        raise ProbeError(f"`ldd --version` gives no version ({first})")
    return int(found.group(1)), int(found.group(2))


def interpreter(path: str) -> Interpreter:
    """What the Python at `path` is, asked of it."""
    out = _run([path, "-c", _PYTHON_PROBE]).split()
    if len(out) != 4:
        raise ProbeError(f"{path} did not describe itself ({' '.join(out) or 'no output'})")
    version = version_tuple(out[1])
    return Interpreter(path, out[0].lower(), (version + (0, 0, 0))[:3], out[2], out[3] not in ("0", "False"))

