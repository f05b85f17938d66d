"""The SGLang server a run launches: its own process group, a log file, readiness
polling, and a stop that cannot leave a GPU-holding process behind.

One server serves the whole run (each request carries its own deltas), so it is
started once and restarted only when it crashed. The server runs `dill.loads` on a
request field while `--enable-custom-logit-processor` is on, so every server this
project talks to, launched or attached, must be on a loopback address unless the
config explicitly allows remote access (`config.sglang.check_addresses`).
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path

import httpx

from compressor_2.common import ConfigError, RunError
from compressor_2.config import ATTENTION_FLAG, PORTABLE_BACKEND, Config, bind_host, launch_command, option
from compressor_2.host import compute_capabilities

logger = logging.getLogger(__name__)

LOG_NAME = "sglang_server.log"
LOG_TAIL_LINES = 30
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # a server bound to all interfaces: its loopback
_TOO_OLD_DRIVER = ("the NVIDIA driver is too old for this torch's CUDA build: upgrade it (make install-gpu checks "
                   "it before installing)")
_OUT_OF_MEMORY = ("the model and its KV cache do not fit: spread the model over GPUs with --tp N in "
                  "CONFIG_SGLANG_COMMAND, or lower --mem-fraction-static if other processes hold GPU memory")
# Last words of a server that dies at start-up, as SGLang and torch word them, and the fix.
KNOWN_FAILURES: tuple[tuple[str, str], ...] = (
    ("FlashAttention v3 Backend requires SM>=80", f"this GPU cannot run fa3, the attention backend SGLang falls "
     f"back to: add {ATTENTION_FLAG} {PORTABLE_BACKEND} to CONFIG_SGLANG_COMMAND"),
    ("NVIDIA driver on your system is too old", _TOO_OLD_DRIVER),
    ("CUDA driver version is insufficient", _TOO_OLD_DRIVER),
    ("No module named 'compressor_2'", "the server's Python cannot import compressor_2: start CONFIG_SGLANG_COMMAND "
     "with python (the interpreter that runs compressor_2), or install compressor_2 where it runs"),
    ("CUDA out of memory", _OUT_OF_MEMORY),
    ("OutOfMemoryError", _OUT_OF_MEMORY),
)


def client_url(host: str, port: int) -> str:
    """Where this machine reaches a server bound to `host`: the loopback of a wildcard bind,
    else the host itself (an IPv6 address in brackets)."""
    host = _WILDCARDS.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def ensure_port_free(host: str, port: int) -> None:
    """Fail before launching, not after a long model load, when the port is taken."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(
            f"CONFIG_SGLANG_COMMAND has --host {host}, which does not resolve ({exc.strerror})") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # The server sets SO_REUSEADDR too, so a port in TIME_WAIT (a previous run) is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ConfigError(
                f"CONFIG_SGLANG_PORT={port}: {host}:{port} is already in use ({exc.strerror}); "
                "stop whatever listens there, choose another port, or attach to a running "
                "server with CONFIG_SGLANG_URLS"
            ) from None


def known_failure(lines: list[str]) -> str | None:
    """The fix for the first known failure in a server log's last lines, or None."""
    return next((fix for line in lines for pattern, fix in KNOWN_FAILURES if pattern in line), None)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last non-empty lines of the server log."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            return [line.rstrip() for line in deque((ln for ln in handle if ln.strip()), maxlen=lines)]
    except FileNotFoundError:
        return []


class SGLangServer:
    """One launched server. `start()` blocks until it is ready; `stop()` is idempotent and
    also runs at interpreter exit. Usable as a context manager."""

    def __init__(self, config: Config) -> None:
        self.command = launch_command(config, compute_capabilities())
        self.host = option(self.command, "--host") or bind_host(config)
        self.port = config.sglang_port
        self.url = client_url(self.host, config.sglang_port)
        self.log_path = config.output_dir / LOG_NAME
        self.startup_timeout = config.sglang_startup_timeout
        self.poll_interval = config.sglang_poll_interval
        self.stop_grace = config.sglang_stop_grace
        self.starts = 0
        # Deltas by phase read each row's output ids; SGLang's overlap scheduler appends the
        # previous token after the processor runs unless sampling is delayed.
        self.env = {**os.environ, "SGLANG_ENABLE_DELAY_SAMPLE": "1"} if config.delta_phases > 1 else None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.alive():
            return
        self.stop()  # reaps a crashed predecessor and anything left in its group
        ensure_port_free(self.host, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"\n=== compressor_2: server start #{self.starts} at {stamp}: "
                      f"{shlex.join(self.command)}\n".encode())
            log.flush()
            try:
                self._process = subprocess.Popen(
                    self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                    # Its own group: Ctrl+C in the terminal does not reach it, and stop()
                    # can signal its worker processes together with it.
                    start_new_session=True,
                )
            except OSError as exc:
                raise ConfigError(
                    f"CONFIG_SGLANG_COMMAND: cannot run {self.command[0]!r}: {exc.strerror}"
                ) from None
        atexit.register(self.stop)
        logger.info("SGLang server start #%d: pid %d, %s, log %s",
                    self.starts, self._process.pid, self.url, self.log_path)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        path = "/health_generate"
        with httpx.Client() as client:
            while True:
                if self._process.poll() is not None:
                    code = self._process.returncode
                    raise RunError(self._failure(f"exited with code {code} during start-up"))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RunError(self._failure(
                        f"was not ready after {self.startup_timeout:g} s (CONFIG_SGLANG_STARTUP_TIMEOUT)"))
                try:
                    status = client.get(self.url + path, timeout=remaining).status_code
                except httpx.TransportError:
                    status = None
                if status == 200:
                    return
                if status == 404 and path == "/health_generate":
                    path = "/health"  # older SGLang versions have only /health
                    continue
                try:
                    # Returns as soon as the process exits: a crash is reported at once.
                    self._process.wait(timeout=min(self.poll_interval, max(remaining, 0.0)))
                except subprocess.TimeoutExpired:
                    pass

    def _failure(self, what: str) -> str:
        tail = log_tail(self.log_path)
        last = tail[-1] if tail else "(the log is empty)"
        fix = known_failure(tail)
        # The CLI prints only the first line: make it carry the server's last words.
        return f"the SGLang server {what}; last log line: {last}" + (f"; hint: {fix}" if fix else "") + \
            f"\n--- last lines of {self.log_path} ---\n" + "\n".join(tail)

    def failure_summary(self) -> str:
        """The server log's last line, and the fix of a known failure, for errors raised
        after start-up."""
        tail = log_tail(self.log_path)
        fix = known_failure(tail)
        return f"last line of {self.log_path}: {tail[-1] if tail else '(empty)'}" + (f"; hint: {fix}" if fix else "")

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL after the grace period."""
        process, self._process = self._process, None
        if process is None:
            return
        atexit.unregister(self.stop)
        try:
            if process.poll() is None:
                _signal_group(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=self.stop_grace)
                except subprocess.TimeoutExpired:
                    logger.warning("SGLang server pid %d ignored SIGTERM for %g s: killing it",
                                   process.pid, self.stop_grace)
        finally:
            # Also after a clean exit or a crash: workers left in the group hold GPU memory.
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        logger.info("SGLang server pid %d stopped (exit code %s)", process.pid, process.returncode)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> SGLangServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone
