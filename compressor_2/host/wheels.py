"""The pinned wheels' metadata, read without downloading them, and what it says a host needs.

For a project pinned to a version, the package index's simple page (PEP 691 JSON, or the
PEP 503 HTML page) lists every file of that version with its `Requires-Python`; the core
metadata of one Linux wheel (its `Requires-Dist`) comes from the PEP 658 `.metadata` file
where the index serves one, else from the wheel itself by HTTP byte ranges: the zip's
central directory and its METADATA member, about 1 MB of a 500 MB torch wheel. What was
read is kept in the cache (`$COMPRESSOR_2_CACHE`, else `$XDG_CACHE_HOME/compressor_2`, else
~/.cache/compressor_2, under gpu-host/), so it is read once per pinned version.

From that metadata, never from a hand-written list: the Python tags and manylinux glibc of
every wheel (their file names), `Requires-Python`, and the CUDA major version the build
runs on (`cuda-toolkit==13.0.3`, `nvidia-*-cu13` and `[cu13]` extras in `Requires-Dist`).
"""

import email.parser
import html.parser
import io
import json
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

DEFAULT_INDEX = "https://pypi.org/simple"
_JSON = "application/vnd.pypi.simple.v1+json"
_CHUNK = 1 << 16  # bytes per range request
_TIMEOUT = 120
# Legacy manylinux tags, as the glibc they name (PEP 600).
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


class WheelError(Exception):
    """The index could not tell what the pinned wheels are; the message says why."""


class Project(NamedTuple):
    """What the index says about one pinned release."""

    name: str
    version: str
    files: List[str]  # every file of the version: its wheels, and its source distribution if any
    requires_python: str  # "" when unstated
    requires_dist: List[str]  # of its Linux wheel's METADATA


class Tag(NamedTuple):
    """One wheel's compatibility: its Python and ABI tags and, on Linux, glibc and machine."""

    pythons: Tuple[str, ...]  # "cp312", "py3"
    abis: Tuple[str, ...]  # "cp312", "cp313t", "abi3", "none"
    glibc: Optional[Tuple[int, int]]  # None: not a Linux wheel (or pure Python: "any")
    machine: str  # "x86_64", "aarch64", "any"


def file_version(filename: str) -> str:
    """The version in a wheel's (name-version-...whl) or a source distribution's file name."""
    if filename.endswith(".whl"):
        return filename.split("-")[1]
    return re.sub(r"\.(tar\.gz|zip|tar\.bz2)$", "", filename).rsplit("-", 1)[-1]


def wheel_tag(filename: str) -> Tag:
    """The tags of a wheel's file name (name-version[-build]-python-abi-platform.whl); a
    source distribution has none that a host can match."""
    if not filename.endswith(".whl"):
        return Tag((), (), None, "")
    python, abi, platforms = filename[: -len(".whl")].split("-")[-3:]
    glibc, machine = None, ""
    for platform in platforms.split("."):
        if platform == "any":
            glibc, machine = (0, 0), "any"
        found = re.match(r"(manylinux(?:_(\d+)_(\d+)|1|2010|2014))_(.+)$", platform)
        if found:
            level = (int(found.group(2)), int(found.group(3))) if found.group(2) else \
                _LEGACY_MANYLINUX[found.group(1)]
            glibc = level if glibc is None else min(glibc, level)
            machine = found.group(4)
    return Tag(tuple(python.split(".")), tuple(abi.split(".")), glibc, machine)


def fits_python(tag: Tag, implementation: str, version: Tuple[int, int], free_threaded: bool) -> bool:
    """Whether an interpreter can install a wheel of `tag` (CPython's tags and abi3)."""
    ours = "%d%d" % version
    prefix = {"cpython": "cp", "pypy": "pp"}.get(implementation, implementation[:2])
    for python in tag.pythons:
        for abi in tag.abis:
            if python == prefix + ours and abi == prefix + ours + ("t" if free_threaded else ""):
                return True
            if prefix == "cp" and abi == "abi3" and not free_threaded and python.startswith("cp3") \
                    and int(python[3:] or 0) <= version[1]:
                return True
            if abi == "none" and python in ("py3", "py" + ours):
                return True
    return False


def satisfies(version: Tuple[int, ...], specifier: str) -> bool:
    """Whether a Python version meets a `Requires-Python` specifier (">=3.11", "<3.14,!=3.12.*")."""
    for clause in filter(None, (part.strip() for part in specifier.split(","))):
        found = re.match(r"(~=|==|!=|<=|>=|<|>)\s*([\d.]+)(\.\*)?$", clause)
        if found is None:
            continue  # a clause this check cannot read: pip will judge it
        op, wanted, wildcard = found.group(1), tuple(int(p) for p in found.group(2).split(".")), found.group(3)
        mine = tuple(version[: len(wanted)]) if wildcard else tuple(version)
        padded = wanted + (0,) * (len(mine) - len(wanted)) if not wildcard else wanted
        if op == "~=":
            ok = mine >= padded and mine[: len(wanted) - 1] == wanted[:-1]
        else:
            ok = {"==": mine == padded, "!=": mine != padded, "<=": mine <= padded, ">=": mine >= padded,
                  "<": mine < padded, ">": mine > padded}[op]
        if not ok:
            return False
    return True


def cuda_majors(requires_dist: List[str]) -> Set[int]:
    """The CUDA major versions a build's requirements name: `cuda-toolkit==13.0.3`,
    `nvidia-cudnn-cu13`, `flashinfer_python[cu13]`, `cuda-python>=13.0`."""
    found: Set[int] = set()
    for requirement in requires_dist:
        head = requirement.split(";", 1)[0].strip().lower()
        if "extra ==" in requirement.replace('"', "").replace("'", ""):
            continue  # optional: not what a plain install runs on
        patterns = (r"^cuda-toolkit\b.*==\s*(\d+)", r"^nvidia-[a-z0-9-]+-cu(\d+)\b", r"\[[^\]]*\bcu(\d+)\b",
                    r"^cuda-python\s*>=\s*(\d+)")
        found.update(int(m.group(1)) for m in (re.search(p, head) for p in patterns) if m)
    return found


def cache_dir() -> Path:
    explicit = os.environ.get("COMPRESSOR_2_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "compressor_2"


def cached_project(name: str, version: str) -> Path:
    return cache_dir() / "gpu-host" / f"{name}-{version}.json"


def project(name: str, version: str, index: Optional[str] = None) -> Project:
    """The pinned release's metadata: from the cache, else read from the index and cached."""
    path = cached_project(name, version)
    try:
        return Project(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass
    found = fetch_project(name, version, index or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        json.dump(found._asdict(), handle, indent=1)
    os.chmod(handle.name, 0o644)
    os.replace(handle.name, path)  # atomic: a concurrent check sees the whole file or none
    return found


def fetch_project(name: str, version: str, index: str) -> Project:
    """Read the release's files and one Linux wheel's core metadata from the index."""
    page = urllib.parse.urljoin(index.rstrip("/") + "/", re.sub(r"[-_.]+", "-", name).lower() + "/")
    try:
        files = [f for f in _simple_page(page) if file_version(f["filename"]) == version]
        wheels = [f for f in files if f["filename"].endswith(".whl")]
        if not wheels:
            raise WheelError(f"{page} lists no wheel of {name} {version}")
        chosen = ([f for f in wheels if wheel_tag(f["filename"]).glibc not in (None, (0, 0))] or wheels)[0]
    except _MALFORMED as exc:
        raise WheelError(_unexpected(page, exc)) from None
    try:
        metadata = email.parser.Parser().parsestr(_core_metadata(chosen))
    except _MALFORMED as exc:
        raise WheelError(_unexpected(chosen["url"], exc)) from None
    return Project(name, version, sorted(f["filename"] for f in files),
                   chosen.get("requires-python") or metadata.get("Requires-Python") or "",
                   list(metadata.get_all("Requires-Dist") or []))


# What a malformed answer raises while it is read, for `make install-gpu` to say in one line
# rather than as a traceback: a JSON page without "files" (KeyError) or not JSON at all
# (ValueError), a file entry or name of another shape, a wheel that is no zip (BadZipFile,
# zlib.error, EOFError; NotImplementedError and RuntimeError for a compression or encryption
# zipfile cannot read), metadata not UTF-8 (UnicodeDecodeError, a ValueError).
_MALFORMED = (LookupError, TypeError, AttributeError, ValueError, RuntimeError, EOFError, zipfile.BadZipFile,
              zlib.error)


def _unexpected(url: str, exc: BaseException) -> str:
    return f"{url}: unexpected answer ({type(exc).__name__}: {exc})"


def _get(url: str, headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), b""
    except (urllib.error.URLError, OSError) as exc:
        raise WheelError(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _simple_page(url: str) -> List[Dict[str, str]]:
    """The files of a project page: {"filename", "url", "requires-python", "core-metadata"}."""
    status, headers, body = _get(url, {"Accept": f"{_JSON}, text/html;q=0.1"})
    if status != 200:
        raise WheelError(f"{url} answered HTTP {status}")
    if "json" in headers.get("Content-Type", headers.get("content-type", "")):
        return [{"filename": f["filename"], "url": urllib.parse.urljoin(url, f["url"]),
                 "requires-python": f.get("requires-python") or "",
                 "core-metadata": "y" if f.get("core-metadata") or f.get("dist-info-metadata") else ""}
                for f in json.loads(body)["files"]]
    anchors = _Anchors()
    anchors.feed(body.decode("utf-8", "replace"))
    return [{"filename": text.strip(), "url": urllib.parse.urljoin(url, attrs.get("href", "")).split("#")[0],
             "requires-python": attrs.get("data-requires-python") or "",
             "core-metadata": "y" if attrs.get("data-core-metadata") or attrs.get("data-dist-info-metadata") else ""}
            for attrs, text in anchors.links]


class _Anchors(html.parser.HTMLParser):
    """The links of a PEP 503 page, with their attributes (entities already unescaped)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: List[Tuple[Dict[str, str], str]] = []
        self._open: Optional[Dict[str, str]] = None

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        if tag == "a":
            self._open = {key: value or "" for key, value in attrs}
            self.links.append((self._open, ""))

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.links[-1] = (self._open, self.links[-1][1] + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._open = None


def _core_metadata(file: Dict[str, str]) -> str:
    """The wheel's METADATA: the PEP 658 file, else the zip member read by byte ranges."""
    url = file["url"].split("#")[0]
    if file.get("core-metadata"):
        status, _, body = _get(url + ".metadata")
        if status == 200:
            return body.decode("utf-8")
    with zipfile.ZipFile(io.BufferedReader(_RangeFile(url), _CHUNK)) as wheel:  # type: ignore[arg-type]
        names = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise WheelError(f"{url} holds no single .dist-info/METADATA")
        return wheel.read(names[0]).decode("utf-8")


class _RangeFile(io.RawIOBase):
    """A remote file read by HTTP byte ranges: what a zip reader needs of a wheel."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.position = 0
        status, headers, tail = _get(url, {"Range": f"bytes=-{_CHUNK}"})
        total = re.search(r"/(\d+)$", headers.get("Content-Range", headers.get("content-range", "")))
        if status != 206 or total is None:
            raise WheelError(f"{url} does not serve byte ranges (HTTP {status}) and the index has no "
                             "PEP 658 metadata for it")
        self.size = int(total.group(1))
        self._tail = (self.size - len(tail), tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence] + offset
        return self.position

    def readinto(self, buffer: "memoryview") -> int:  # type: ignore[override]
        wanted = min(len(buffer), self.size - self.position)
        if wanted <= 0:
            return 0
        start, tail = self._tail
        if self.position >= start:  # the end of the file, read when opened: the central directory
            data = tail[self.position - start: self.position - start + wanted]
        else:
            status, _, data = _get(self.url, {"Range": f"bytes={self.position}-{self.position + wanted - 1}"})
            if status != 206:
                raise WheelError(f"{self.url}: byte range answered HTTP {status}")
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)
