"""llama.cpp's server as `make llama-server` builds it (llama-cpp-python's, in a venv of its
own), started on a free loopback port with a GGUF; the tests that need it skip in one line
when it is not built."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.sglang_helpers import free_port, wait_until_up

DEFAULT_VENV = Path.home() / ".cache" / "compressor_2" / "llama-cpp-0.3.36" / "venv"


def llama_python() -> Path:
    """The built server's interpreter; skips the test, in one line, when it is not built."""
    venv = Path(os.environ.get("LLAMA_VENV") or DEFAULT_VENV)
    if not (venv / ".installed").is_file():
        pytest.skip(f"llama.cpp's server is not built at {venv}: `make llama-server` builds it (about 8 minutes)")
    return venv / "bin" / "python"


def smollm2_gguf() -> Path:
    from compressor_2.demo.smollm2 import ModelNotFound, installed_gguf

    try:
        return installed_gguf()
    except ModelNotFound as exc:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {exc}")


@contextmanager
def llama_server(gguf: Path, log: Path, *flags: str) -> Iterator[str]:
    """`python -m llama_cpp.server` serving `gguf` on one thread, its output in `log`; yields
    its base URL once /v1/models answers."""
    port = free_port()
    command = [str(llama_python()), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1", *flags]
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(process, url + "/v1/models", lambda: f"llama.cpp's server: {log.read_text()[-2000:]}",
                      timeout=5, pause=0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
