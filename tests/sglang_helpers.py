"""Shared by the SGLang tests: a config that launches tests/fakes/sglang_server.py, fake
servers started by hand (to attach to), free ports, and checks on real processes."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from compressor_2.clusters.clusterset import BUILD_RECORD_FILE, ClusterSet
from compressor_2.config import Config, load_config

REPO = Path(__file__).resolve().parent.parent
FAKE_SERVER = REPO / "tests" / "fakes" / "sglang_server.py"
# What a server you attach to needs, and what the launched one gets.
ATTACHABLE = ("--enable-custom-logit-processor", "--enable-deterministic-inference")
STARTUP_GUARD = 300.0  # seconds for a fake server to answer: a hang guard for a loaded machine, not a speed limit


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def hung(deadline: float, what: str) -> None:
    """Fails the test when `deadline` (a monotonic time, set by a hang guard far beyond any
    loaded machine's pace) has passed: `what` hangs. A wait loop calls it between polls of
    the progress it waits for, so no test rests on how fast something runs."""
    if time.monotonic() > deadline:
        pytest.fail(f"{what} (no progress within the hang guard)")


def wait_until_up(process: subprocess.Popen[bytes], probe: str, why_dead: Callable[[], str],
                  timeout: float = 1, pause: float = 0.05) -> None:
    """Until GET `probe` answers 200: a server `process` started; `why_dead()` says what
    to show when it dies first. Bounded by STARTUP_GUARD."""
    deadline = time.monotonic() + STARTUP_GUARD
    while True:
        assert process.poll() is None, why_dead()
        try:
            if httpx.get(probe, timeout=timeout).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(pause)
        hung(deadline, f"{probe} never came up: {why_dead()}")


def sglang_config(output_dir: Path, model_dir: Path, *fake_flags: str, **overrides: Any) -> Config:
    """The repo's defconfig switched to the SGLang engine, launching the fake server."""
    settings: dict[str, Any] = dict(
        engine="sglang", model_path=str(model_dir), output_dir=output_dir,
        sglang_command=shlex.join([sys.executable, str(FAKE_SERVER), *fake_flags]),
        sglang_urls=(), sglang_port=free_port(), sglang_allow_remote=False,
        sglang_startup_timeout=30.0, sglang_poll_interval=0.05, sglang_request_timeout=60.0,
        sglang_max_restarts=2, sglang_stop_grace=5.0, max_new_tokens=24, temperature=0.0,
        eval_concurrency=4, sglang_deterministic=True,  # Kconfig's default with the SGLang engine
    )
    settings.update(overrides)
    return dataclasses.replace(load_config(REPO / "defconfig"), **settings)


def logged_pids(log: Path, label: str) -> list[int]:
    """Pids the fake printed to its log (`fake sglang pid N`, `fake child pid N`)."""
    return [int(m) for m in re.findall(rf"fake {label} pid (\d+)", log.read_text())]


def process_gone(pid: int, wait: float = 120.0) -> bool:
    """True once `pid` no longer runs (a zombie counts as gone: it holds nothing); `wait` is a
    hang guard for a loaded machine, not a speed limit."""
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


@contextmanager
def serve_fake(script: Path, model_dir: Path, health: str, *flags: str) -> Iterator[str]:
    """The fake server `script` with exactly `flags`, on a free loopback port; yields its URL
    once `health` answers, and kills it on the way out."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(script), "--model-path", str(model_dir), "--port", str(port),
                                *flags], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(process, url + health, lambda: "the fake server died")
        yield url
    finally:
        process.kill()
        process.wait()


@contextmanager
def fake_server(model_dir: Path, *flags: str) -> Iterator[str]:
    """A fake SGLang server started with exactly `flags` (nothing added: real servers you
    attach to are started by hand), on a free loopback port; yields its URL once it is up."""
    with serve_fake(FAKE_SERVER, model_dir, "/health", *flags) as url:
        yield url


def logged_requests(log: Path, path: str = "/generate") -> list[dict[str, Any]]:
    """The bodies a fake started with --fake-request-log LOG received on `path`."""
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    return [entry["body"] for entry in entries if entry["path"] == path]


CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def chat_model(model_dir: Path, target: Path, *, adds_bos: bool) -> Path:
    """A copy of the tiny model whose chat template starts with BOS (its EOS, as in GPT-2),
    and whose tokenizer adds a BOS to every text it tokenizes with special tokens when
    `adds_bos` (as Llama's does): the fake server tokenizes a text prompt with it too."""
    shutil.copytree(model_dir, target)
    tokenizer = json.loads((target / "tokenizer.json").read_text())
    if adds_bos:
        bos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
        tokenizer["post_processor"] = {
            "type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "tokens": ["<|endoftext|>"], "ids": [
                next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|endoftext|>")]}}}
        (target / "tokenizer.json").write_text(json.dumps(tokenizer))
    settings = json.loads((target / "tokenizer_config.json").read_text())
    settings.update(chat_template=CHAT_TEMPLATE, bos_token="<|endoftext|>")
    (target / "tokenizer_config.json").write_text(json.dumps(settings))
    return target


def probe_clusters(model_dir: Path, folder: Path) -> ClusterSet:
    """Three clusters over the model's tokenizer: 0 holds EOS only, 1 and 2 the even and odd
    ids of everything else; the map saved in `folder` with its build record."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    token_clusters = np.arange(len(tokenizer), dtype=np.int64) % 2 + 1
    token_clusters[tokenizer.eos_token_id] = 0
    path = folder / "token_clusters.npy"
    np.save(path, token_clusters)
    # The processor checks the map on the server against the build digest the client sends.
    (folder / BUILD_RECORD_FILE).write_text(json.dumps({"fingerprint": "test"}))
    descriptions = {cid: {"description": f"cluster {cid}"} for cid in ("0", "1", "2")}
    return ClusterSet(cluster_ids=("0", "1", "2"), token_clusters=token_clusters,
                      token_clusters_path=path.resolve(), descriptions=descriptions, build_digest="test")
