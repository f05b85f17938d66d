"""Shared by the logit_bias engine's tests: the fake server (tests/fakes/logit_bias_server.py)
started as a real subprocess, a config that reaches it, and its request log."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from compressor_2.config import Config, load_config
from tests.sglang_helpers import STARTUP_GUARD, free_port

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fakes" / "logit_bias_server.py"


@contextmanager
def logit_bias_server(model_dir: Path, *flags: str) -> Iterator[str]:
    """The fake on a free loopback port with `flags`; yields its base URL once it answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(FAKE), "--model-path", str(model_dir), "--port", str(port),
                                *flags], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_GUARD
        while True:
            assert process.poll() is None, "the fake server died"
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
            assert time.monotonic() < deadline, f"{url} never came up"
        yield url
    finally:
        process.kill()
        process.wait()


def logit_bias_config(output_dir: Path, model_dir: Path | str, url: str, **overrides: Any) -> Config:
    """The repo's defconfig switched to the logit_bias engine on `url`."""
    settings: dict[str, Any] = dict(engine="logit_bias", model_path=str(model_dir), output_dir=output_dir,
                                    logit_bias_url=url, logit_bias_request_timeout=60.0, max_new_tokens=24,
                                    temperature=0.0, eval_concurrency=4)
    settings.update(overrides)
    return dataclasses.replace(load_config(REPO / "defconfig"), **settings)


def logged(log: Path) -> list[dict[str, Any]]:
    """The completion request bodies a fake started with --fake-request-log LOG received."""
    if not log.exists():
        return []
    return [entry["body"] for line in log.read_text().splitlines()
            if (entry := json.loads(line))["path"] == "/v1/completions"]
