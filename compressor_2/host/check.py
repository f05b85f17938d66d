"""`make install-gpu`'s check that the pinned SGLang stack can run on this host, before any
download:

    python -m compressor_2.host.check --python .venv/bin/python requirements-gpu.txt

The pinned wheels (requirements-gpu.txt's `sglang==` and `torch==`) say what they need in
their own metadata (`host.wheels`): the CUDA major version torch is built for, the Python
tags and `Requires-Python`, the manylinux glibc. The host says what it has (`host.probe`):
the NVIDIA driver (`nvidia-smi`), glibc (`ldd --version`) and the Python that will hold
the install. Each shortfall is one line saying what was found and what to do; exit 2 when
there is one, 0 when the host can run the stack.
"""

import argparse
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from compressor_2.host.probe import Interpreter, ProbeError, driver_version, glibc_version, interpreter, version_tuple
from compressor_2.host.wheels import Project, WheelError, cuda_majors, fits_python, project, satisfies, wheel_tag

PINNED = ("sglang", "torch")
PREFIX = "make install-gpu: "
SKIP = "make install-gpu HOST_CHECK=skip installs without this check"
# NVIDIA's minimum driver for each CUDA major version (minor version compatibility), from
# "CUDA Toolkit 11.x, 12.x, and 13.x Minimum and Maximum Required Driver Versions":
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
MINIMUM_DRIVER = {11: 450, 12: 525, 13: 580}
NEWER_OS = "a newer Linux (Ubuntu 22.04+, Debian 12, RHEL 9) or a container built on one"


def pins(requirements: Path) -> Dict[str, str]:
    """The exact versions `requirements` pins the PINNED projects to (`name==version`)."""
    found = {}
    for line in requirements.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)", line)
        if match and match.group(1).lower() in PINNED:
            found[match.group(1).lower()] = match.group(2)
    missing = [name for name in PINNED if name not in found]
    if missing:
        raise WheelError(f"{requirements} pins no exact version of {', '.join(missing)}")
    return found


def _stack(projects: Sequence[Project]) -> str:
    return " and ".join(f"{p.name} {p.version}" for p in projects)


def _pythons(project: Project, machine: str) -> List[str]:
    """The Python tags (cp311, ...) of `project`'s Linux wheels for `machine`."""
    tags = [wheel_tag(f) for f in project.files]
    return sorted({python for tag in tags if tag.machine in (machine, "any") for python in tag.pythons},
                  key=lambda tag: (len(tag), tag))


def python_problem(host: Interpreter, projects: Sequence[Project]) -> Optional[str]:
    """Why `host` cannot install every pinned wheel, or None."""
    name = {"cpython": "CPython", "pypy": "PyPy"}.get(host.implementation, host.implementation)
    shown = f"{host.path} is {name} {'.'.join(map(str, host.version))}" + \
        (" (free-threaded)" if host.free_threaded else "")
    for p in projects:
        if not any(wheel_tag(f).machine in (host.machine, "any") for f in p.files):
            machines = sorted({wheel_tag(f).machine for f in p.files if wheel_tag(f).glibc})
            return f"{p.name} {p.version} has Linux wheels for {', '.join(machines) or 'no machine'} only, not " \
                   f"{host.machine}: run make install-gpu on one of those"
    wheel_ok = all(any(fits_python(wheel_tag(f), host.implementation, host.version[:2], host.free_threaded)
                       and wheel_tag(f).machine in (host.machine, "any") for f in p.files) for p in projects)
    required_ok = all(satisfies(host.version, p.requires_python) for p in projects)
    if wheel_ok and required_ok:
        return None
    common = set.intersection(*(set(_pythons(p, host.machine)) for p in projects))
    usable = [tag for tag in sorted(common, key=lambda tag: (len(tag), tag)) if tag.startswith("cp")
              and all(satisfies((3, int(tag[3:]), 99), p.requires_python) for p in projects)]
    names = ", ".join(f"3.{tag[3:]}" for tag in usable)
    suggest = f"python3.{usable[-1][3:]}" if usable else "python3"
    return f"{shown}, but {_stack(projects)} have wheels for CPython {names or '(none)'} only" + \
        (" (standard builds, not free-threaded)" if host.free_threaded else "") + \
        f": remove {Path(host.path).parent.parent} and run make install-gpu PYTHON={suggest}"


def glibc_problem(glibc: Tuple[int, int], host: Interpreter, projects: Sequence[Project]) -> Optional[str]:
    """Why this glibc is too old for the pinned wheels of `host`'s machine, or None."""
    needed, needer = (0, 0), None
    for p in projects:
        levels = [wheel_tag(f).glibc for f in p.files if wheel_tag(f).machine in (host.machine, "any")
                  and fits_python(wheel_tag(f), host.implementation, host.version[:2], host.free_threaded)]
        levels = [level for level in levels if level is not None] or \
            [wheel_tag(f).glibc for f in p.files if wheel_tag(f).glibc and wheel_tag(f).machine == host.machine]
        lowest = min(levels) if levels else (0, 0)  # type: ignore[type-var]
        if lowest > needed:
            needed, needer = lowest, p
    if needer is None or glibc >= needed:
        return None
    level = "%d.%d" % needed
    source = "its source distribution would need building" if any(not f.endswith(".whl") for f in needer.files) \
        else "there is no source distribution"
    return f"glibc {glibc[0]}.{glibc[1]} is older than {level}, which {needer.name} {needer.version}'s wheels need " \
           f"(manylinux_{needed[0]}_{needed[1]}; {source}): use {NEWER_OS}"


def driver_problem(driver: str, projects: Sequence[Project]) -> Optional[str]:
    """Why this NVIDIA driver cannot run the CUDA build the pinned wheels name, or None."""
    majors = sorted(set().union(*(cuda_majors(p.requires_dist) for p in projects)))
    if not majors:
        return None
    cuda = majors[-1]
    torch = next((p for p in projects if p.name == "torch"), projects[0])
    minimum = MINIMUM_DRIVER.get(cuda)
    if minimum is None:
        return f"CUDA {cuda} ({torch.name} {torch.version}) is not in the minimum-driver table this check " \
               f"knows: check NVIDIA's table for it, then {SKIP}"
    if version_tuple(driver)[:1] >= (minimum,):
        return None
    return f"driver {driver} is older than R{minimum}, which CUDA {cuda} ({torch.name} {torch.version}, the build " \
           f"{_stack([p for p in projects if p is not torch])} requires) needs: upgrade the NVIDIA driver to " \
           f"R{minimum} or newer, or use a GPU image that has it (NVIDIA's CUDA forward-compatibility package also " \
           f"works on data-center GPUs: then {SKIP})"


def problems(python: str, projects: Sequence[Project]) -> List[str]:
    """Every reason this host cannot run the pinned stack, one line each."""
    found: List[str] = []
    try:
        host = interpreter(python)
    except ProbeError as exc:
        return [f"cannot ask {python} what it is ({exc}): create the virtualenv with a CPython 3 first"]
    found.append(python_problem(host, projects) or "")
    try:
        found.append(glibc_problem(glibc_version(), host, projects) or "")
    except ProbeError as exc:
        found.append(f"{exc}: the wheels of {_stack(projects)} are built for glibc (manylinux); use {NEWER_OS}")
    try:
        found.append(driver_problem(driver_version(), projects) or "")
    except ProbeError as exc:
        majors = sorted(set().union(*(cuda_majors(p.requires_dist) for p in projects)))
        need = f"CUDA {majors[-1]} needs driver R{MINIMUM_DRIVER.get(majors[-1], '?')} or newer" if majors else \
            "SGLang needs an NVIDIA GPU"
        found.append(f"no NVIDIA driver answers ({exc}), and {need}: run make install-gpu on the GPU machine, with "
                     "its driver installed")
    return [line for line in found if line]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compressor_2.host.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("requirements", type=Path, help="the file that pins sglang== and torch==")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the install goes into")
    args = parser.parse_args(argv)
    try:
        projects = [project(name, version) for name, version in pins(args.requirements).items()]
    except WheelError as exc:
        print(f"{PREFIX}cannot read the pinned wheels' metadata ({exc}): check the package index (PIP_INDEX_URL), "
              f"or {SKIP}", file=sys.stderr)
        return 2
    found = problems(args.python, projects)
    for line in found:
        print(PREFIX + line, file=sys.stderr)
    if found:
        return 2
    print(f"host check: {_stack(projects)} can run here (driver, glibc and Python checked against their wheels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
