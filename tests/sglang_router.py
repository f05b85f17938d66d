"""SGLang's router for the tests and the router benchmark: the real `sglang-router` (a
Rust gateway), installed from the package registry into a virtualenv in the cache outside
the repository (like tests/sglang_wheel.py's wheel), started on 127.0.0.1 in front of
fake SGLang workers (tests/fakes/sglang_server.py), each in its own process group,
every one stopped on the way out, a failed test included.

The cache: $COMPRESSOR_2_CACHE, else $XDG_CACHE_HOME/compressor_2, else
~/.cache/compressor_2; the router's virtualenv is sglang-router-<version>/venv (about
150 MB, no torch), safe to delete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.sglang_helpers import FAKE_SERVER, free_port
from tests.sglang_wheel import cache_dir

ROUTER_VERSION = "0.3.2"
STARTUP_TIMEOUT = 60.0  # seconds for a router or a worker to answer
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


class RouterUnavailable(Exception):
    """sglang-router cannot be installed here (no registry, no wheel for this platform)."""


def router_python() -> Path:
    """The Python of a virtualenv that holds sglang-router==ROUTER_VERSION, made once."""
    folder = cache_dir() / f"sglang-router-{ROUTER_VERSION}"
    python = folder / "venv" / "bin" / "python"
    if python.exists():
        return python
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as building:
        venv = Path(building) / "venv"
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                  f"sglang-router=={ROUTER_VERSION}"],
                 [str(venv / "bin" / "python"), "-c", "import sglang_router.launch_router"]]
        for step in steps:
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            except subprocess.TimeoutExpired:
                raise RouterUnavailable(f"`{' '.join(step[-3:])}` took more than 15 minutes") from None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
                raise RouterUnavailable(f"cannot install sglang-router=={ROUTER_VERSION}: {last}")
        try:
            venv.rename(folder / "venv")  # atomic: a concurrent run sees the whole venv or none
        except OSError:
            if not python.exists():
                raise
    return python


def wait_until(check: Callable[[], bool], what: str, process: subprocess.Popen, log: Path | None,
               timeout: float = STARTUP_TIMEOUT) -> None:
    """Polls `check()` until it is true; fails naming `what` when the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log and log.exists() else ""
            raise RuntimeError(f"{what} exited with status {process.returncode}:\n{tail}")
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {timeout:g} s")
        time.sleep(0.05)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group, SIGKILL after STOP_GRACE; also when it died already."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


@dataclass(frozen=True)
class Worker:
    url: str
    process: subprocess.Popen
    requests: Path  # --fake-request-log: one JSON line per POST


@contextmanager
def fake_workers(model_dir: Path, count: int, folder: Path, *flags: str,
                 flags_of: dict[int, Sequence[str]] | None = None) -> Iterator[list[Worker]]:
    """`count` fake SGLang workers on free loopback ports, started as a user starts
    attachable servers (the processor flag, deterministic inference), each logging the
    requests it gets to folder/worker<i>.jsonl; worker i also gets `flags_of[i]`."""
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        workers = []
        for i in range(count):
            port = free_port()
            log = folder / f"worker{i}.jsonl"
            errors = stack.enter_context((folder / f"worker{i}.err").open("w"))
            process = subprocess.Popen(
                [sys.executable, str(FAKE_SERVER), "--model-path", str(model_dir), "--port", str(port),
                 "--host", "127.0.0.1", "--enable-custom-logit-processor", "--enable-deterministic-inference",
                 "--fake-request-log", str(log), *flags, *(flags_of or {}).get(i, ())],
                stdout=subprocess.DEVNULL, stderr=errors, start_new_session=True)
            stack.callback(stop, process)
            workers.append(Worker(f"http://127.0.0.1:{port}", process, log))
        for worker in workers:
            wait_until(lambda w=worker: httpx.get(w.url + "/health", timeout=2).status_code == 200,
                       f"the fake worker at {worker.url}", worker.process, None)
        yield workers


@contextmanager
def router(python: Path, worker_urls: Sequence[str], log: Path, *flags: str,
           policy: str = "round_robin") -> Iterator[str]:
    """sglang-router on 127.0.0.1 (its default host is 0.0.0.0, and its Prometheus
    exporter's too) in front of `worker_urls`, routing by `policy`; yields its URL once it
    is ready. HF_ENDPOINT points at a closed loopback port: the
    router looks each worker's model up on the Hugging Face hub, which must never be
    reached from here."""
    port = free_port()
    command = [str(python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               "--policy", policy, "--health-check-interval-secs", "1",
               "--shutdown-grace-period-secs", "1", "--log-level", "warn", *flags,
               "--worker-urls", *worker_urls]
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/readiness", timeout=2).status_code == 200,
                   f"sglang-router at {url}", process, log)
        yield url
    finally:
        stop(process)
