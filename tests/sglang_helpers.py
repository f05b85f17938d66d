"""Shared by the SGLang tests: a config that launches tests/fakes/sglang_server.py, free
ports, and checks on real processes."""

from __future__ import annotations

import dataclasses
import re
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from compressor_2.config import Config, load_config

REPO = Path(__file__).resolve().parent.parent
FAKE_SERVER = REPO / "tests" / "fakes" / "sglang_server.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def sglang_config(output_dir: Path, model_dir: Path, *fake_flags: str, **overrides: Any) -> Config:
    """The repo's defconfig switched to the SGLang engine, launching the fake server."""
    settings: dict[str, Any] = dict(
        engine="sglang", model_path=str(model_dir), output_dir=output_dir,
        sglang_command=shlex.join([sys.executable, str(FAKE_SERVER), *fake_flags]),
        sglang_urls=(), sglang_port=free_port(), sglang_allow_remote=False,
        sglang_startup_timeout=30.0, sglang_poll_interval=0.05, sglang_request_timeout=60.0,
        sglang_max_restarts=2, sglang_stop_grace=5.0, max_new_tokens=24, temperature=0.0,
        eval_concurrency=4,
    )
    settings.update(overrides)
    return dataclasses.replace(load_config(REPO / "defconfig"), **settings)


def logged_pids(log: Path, label: str) -> list[int]:
    """Pids the fake printed to its log (`fake sglang pid N`, `fake child pid N`)."""
    return [int(m) for m in re.findall(rf"fake {label} pid (\d+)", log.read_text())]


def process_gone(pid: int, wait: float = 5.0) -> bool:
    """True once `pid` no longer runs (a zombie counts as gone: it holds nothing)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def fake_stats(url: str) -> dict[str, Any]:
    return httpx.get(url + "/fake_stats", timeout=10).json()
