"""CONFIG_SGLANG_*: the command a run launches its server with, and the one loopback rule
every SGLang server address obeys, checked when the config loads.

The server runs `dill.loads` on a request field while `--enable-custom-logit-processor`
is on, so a launched server's --host, and every CONFIG_SGLANG_URLS host, must be loopback
unless CONFIG_SGLANG_ALLOW_REMOTE=y. The functions take any object with the settings'
names (`Config` has them), so this module stands below the one that defines `Config`.
"""

from __future__ import annotations

import shlex
from typing import Protocol
from urllib.parse import urlsplit

from compressor_2.endpoint import TUNNEL_HINT, is_loopback
from compressor_2.errors import ConfigError

CUSTOM_PROCESSOR_FLAG = "--enable-custom-logit-processor"
_LOOPBACK = "127.0.0.1"


class SGLangSettings(Protocol):
    @property
    def sglang_command(self) -> str: ...

    @property
    def sglang_port(self) -> int: ...

    @property
    def sglang_urls(self) -> tuple[str, ...]: ...

    @property
    def sglang_allow_remote(self) -> bool: ...

    @property
    def model_path(self) -> str: ...


def check_addresses(config: SGLangSettings) -> None:
    """The one loopback rule, for launched and attached servers alike, checked before anything
    starts: a launched server's --host, or every CONFIG_SGLANG_URLS host, must be loopback
    unless CONFIG_SGLANG_ALLOW_REMOTE=y."""
    if not config.sglang_urls:
        launch_command(config)
        return
    for url in config.sglang_urls:
        if not (config.sglang_allow_remote or is_loopback(urlsplit(url).hostname or "")):
            raise ConfigError(
                f"CONFIG_SGLANG_URLS has {url}, which is not a loopback address (anyone who reaches the "
                f"server can run code on it): {TUNNEL_HINT}, or set CONFIG_SGLANG_ALLOW_REMOTE=y if every "
                "peer on that network is trusted")


def option(command: list[str], flag: str) -> str | None:
    """The value of `flag` in `command` (`--flag v` or `--flag=v`), None when absent."""
    for i, arg in enumerate(command):
        if arg == flag:
            return command[i + 1] if i + 1 < len(command) else ""
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def bind_host(config: SGLangSettings) -> str:
    return "0.0.0.0" if config.sglang_allow_remote else _LOOPBACK


def launch_command(config: SGLangSettings) -> list[str]:
    """CONFIG_SGLANG_COMMAND plus the flags this project relies on, each added only when
    missing; a command that contradicts the config is refused rather than half-obeyed."""
    try:
        command = shlex.split(config.sglang_command)
    except ValueError as exc:
        raise ConfigError(
            f"CONFIG_SGLANG_COMMAND={config.sglang_command!r} cannot be parsed: {exc}") from None
    if not command:
        raise ConfigError("CONFIG_SGLANG_COMMAND is empty")

    port = option(command, "--port")
    if port is None:
        command += ["--port", str(config.sglang_port)]
    elif port != str(config.sglang_port):
        raise ConfigError(
            f"CONFIG_SGLANG_COMMAND has --port {port} but CONFIG_SGLANG_PORT={config.sglang_port}: "
            "set the port in CONFIG_SGLANG_PORT only"
        )
    host = option(command, "--host")
    if host is None:
        command += ["--host", bind_host(config)]
    elif not (config.sglang_allow_remote or is_loopback(host)):
        raise ConfigError(
            f"CONFIG_SGLANG_COMMAND has --host {host}, which exposes the server (it runs code sent "
            "in requests); remove it, or set CONFIG_SGLANG_ALLOW_REMOTE=y if you really mean it"
        )
    if option(command, "--model-path") is None:
        command += ["--model-path", config.model_path]
    if CUSTOM_PROCESSOR_FLAG not in command:
        command.append(CUSTOM_PROCESSOR_FLAG)
    return command
