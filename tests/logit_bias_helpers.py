"""Shared by the logit_bias engine's tests: the fake server (tests/fakes/logit_bias_server.py)
started as a real subprocess, a config that reaches it, and its request log."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


from compressor_2.config import Config, load_config
from tests.sglang_helpers import hung, serve_fake

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "fakes" / "logit_bias_server.py"


@contextmanager
def logit_bias_server(model_dir: Path, *flags: str) -> Iterator[str]:
    """The fake on a free loopback port with `flags`; yields its base URL once it answers."""
    with serve_fake(FAKE, model_dir, "/v1/models", *flags) as url:
        yield url


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


def interrupted_evolve(config: Path, started: Callable[[], bool], guard: float = 600.0) -> str:
    """`python -m compressor_2 evolve` on `config` in a process of its own, SIGINT sent once
    `started()` holds (polled: what it waits for is the run's progress, never a clock), with
    Python's own SIGINT handler (a suite started in the background inherits an ignored one);
    returns its stderr. It must stop as a Ctrl+C stops it: exit 130."""
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from compressor_2.cli import main; sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-c", code, "evolve", "--config", str(config)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + guard
        while not started():
            assert process.poll() is None, f"evolve ended before it was interrupted: {process.stderr.read()}"
            hung(deadline, "evolve never reached the point to interrupt")
            time.sleep(0.05)
        # Sent again until the process ends: one that lands in a window where the run ignores
        # signals (its state save) is lost, and every one after the first that lands is
        # ignored by design.
        while True:
            process.send_signal(signal.SIGINT)
            try:
                _, err = process.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                hung(deadline, "evolve did not stop on SIGINT")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    return err
