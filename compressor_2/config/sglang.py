"""CONFIG_SGLANG_*: the command a run launches its server with, and the one loopback rule
every SGLang server address obeys, checked when the config loads.

The server runs `dill.loads` on a request field while `--enable-custom-logit-processor`
is on, so a launched server's --host, and every CONFIG_SGLANG_URLS host, must be loopback
unless CONFIG_SGLANG_ALLOW_REMOTE=y. The command is also refused when it would silently
stop the steering (speculative decoding) or serve another model than CONFIG_MODEL_PATH.
With CONFIG_SGLANG_DETERMINISTIC it gets --enable-deterministic-inference, and the
attention backend SGLang's deterministic mode can run on the GPUs it is given; without,
a command that names the flag is refused. The functions take any object with the
settings' names (`Config` has them), so this module stands below the one that defines
`Config`.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from compressor_2.common import TUNNEL_HINT, ConfigError, is_loopback

CUSTOM_PROCESSOR_FLAG = "--enable-custom-logit-processor"
DETERMINISTIC_FLAG = "--enable-deterministic-inference"
ATTENTION_FLAG = "--attention-backend"
# SGLang 0.5.23's DETERMINISTIC_ATTENTION_BACKEND_CHOICES: it refuses to start deterministic
# inference on any other backend.
DETERMINISTIC_BACKENDS = ("ascend", "fa3", "fa4", "flashinfer", "intel_xpu", "triton")
# Without --attention-backend, deterministic inference falls back to flashinfer on SM100 and
# SM120 GPUs and to fa3 on every other one, and fa3 asserts outside SM80-SM90 (SM7x: V100,
# T4). Triton runs there, and keeps the radix cache.
FA3_MAJORS = (8, 9)
FLASHINFER_FALLBACK_MAJORS = (10, 12)
PORTABLE_BACKEND = "triton"
# Every --speculative-* flag (--speculative-algorithm, --speculative-draft-model-path, ...):
# SGLang's EAGLE/NGRAM verification samples draft tokens without the custom logit
# processor, so every token after an answer's first would go unsteered.
SPECULATIVE_PREFIX = "--speculative"
# A command starting with one of these runs on the interpreter that runs compressor_2: the
# one that has compressor_2 (the processor travels by reference) and, after `make
# install-gpu`, sglang. The `python` a shell finds first may have neither.
_BARE_PYTHONS = ("python", "python3")
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

    @property
    def sglang_allow_other_model(self) -> bool: ...

    @property
    def sglang_deterministic(self) -> bool: ...


def check_addresses(config: SGLangSettings) -> None:
    """The one loopback rule, for launched and attached servers alike, checked before anything
    starts: a launched server's --host, or every CONFIG_SGLANG_URLS host, must be loopback
    unless CONFIG_SGLANG_ALLOW_REMOTE=y."""
    if not config.sglang_urls:
        launch_command(config)
        return
    for url in config.sglang_urls:
        check_loopback(url, config, "CONFIG_SGLANG_URLS has")


def check_loopback(url: str, config: SGLangSettings, subject: str) -> None:
    """Refuse a server address that is not loopback unless CONFIG_SGLANG_ALLOW_REMOTE=y.
    `subject` starts the line: "CONFIG_SGLANG_URLS has", "the router at URL routes to"."""
    if not (config.sglang_allow_remote or is_loopback(urlsplit(url).hostname or "")):
        raise ConfigError(
            f"{subject} {url}, which is not a loopback address (anyone who reaches the "
            f"server can run code on it): {TUNNEL_HINT}, or set CONFIG_SGLANG_ALLOW_REMOTE=y if every "
            "peer on that network is trusted")


def same_model(served: str, configured: str) -> bool:
    """Whether a server's model path names CONFIG_MODEL_PATH's model: the same string (a
    trailing slash aside), or two paths to the same directory, or to the same GGUF file,
    on this machine."""
    if served.rstrip("/") == configured.rstrip("/"):
        return True
    a, b = Path(served).expanduser(), Path(configured).expanduser()
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def check_served_model(served: str, config: SGLangSettings, subject: str) -> None:
    """Refuse a server of another model unless CONFIG_SGLANG_ALLOW_OTHER_MODEL=y: prompts are
    tokenized, and the cluster map built, with CONFIG_MODEL_PATH's tokenizer. `subject`
    starts the line: "http://127.0.0.1:30000 serves", "CONFIG_SGLANG_COMMAND has --model-path"."""
    if not (config.sglang_allow_other_model or same_model(served, config.model_path)):
        raise ConfigError(
            f"{subject} {served!r} but CONFIG_MODEL_PATH={config.model_path!r}: prompts and clusters "
            "come from CONFIG_MODEL_PATH's tokenizer; serve that model, or set "
            "CONFIG_SGLANG_ALLOW_OTHER_MODEL=y if both paths hold the same model")


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


def launch_command(config: SGLangSettings, capabilities: Sequence[tuple[int, int]] = ()) -> list[str]:
    """CONFIG_SGLANG_COMMAND plus the flags this project relies on, each added only when
    missing; a command that contradicts the config, or would stop the steering, is refused
    rather than half-obeyed. A leading `python` or `python3` becomes this interpreter.
    `capabilities`: the compute capability of each GPU the server gets (none: unknown)."""
    try:
        command = shlex.split(config.sglang_command)
    except ValueError as exc:
        raise ConfigError(
            f"CONFIG_SGLANG_COMMAND={config.sglang_command!r} cannot be parsed: {exc}") from None
    if not command:
        raise ConfigError("CONFIG_SGLANG_COMMAND is empty")
    if command[0] in _BARE_PYTHONS:
        command[0] = sys.executable
    speculative = next((arg for arg in command if arg.startswith(SPECULATIVE_PREFIX)), None)
    if speculative is not None:
        raise ConfigError(
            f"CONFIG_SGLANG_COMMAND has {speculative.split('=', 1)[0]}: SGLang's speculative decoding "
            "verifies draft tokens without calling the custom logit processor, so every token after "
            "an answer's first would go unsteered; remove the --speculative-* flags")

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
    model = option(command, "--model-path") or option(command, "--model")
    if model is None:
        command += ["--model-path", config.model_path]
    else:
        check_served_model(model, config, "CONFIG_SGLANG_COMMAND has --model-path")
    if CUSTOM_PROCESSOR_FLAG not in command:
        command.append(CUSTOM_PROCESSOR_FLAG)
    return command + deterministic_flags(command, config.sglang_deterministic, capabilities)


def deterministic_flags(command: list[str], deterministic: bool, capabilities: Sequence[tuple[int, int]]) -> list[str]:
    """What `command` lacks for CONFIG_SGLANG_DETERMINISTIC on GPUs of `capabilities`:
    the flag, and triton where SGLang's own fallback backend would assert."""
    if not deterministic:
        if DETERMINISTIC_FLAG in command:
            raise ConfigError(f"CONFIG_SGLANG_COMMAND has {DETERMINISTIC_FLAG} but CONFIG_SGLANG_DETERMINISTIC=n: "
                              "remove the flag, or set CONFIG_SGLANG_DETERMINISTIC=y")
        return []
    backend = option(command, ATTENTION_FLAG)
    if backend is not None and backend not in DETERMINISTIC_BACKENDS:
        raise ConfigError(f"CONFIG_SGLANG_COMMAND has {ATTENTION_FLAG} {backend}, on which SGLang cannot run "
                          f"deterministic inference (it takes {', '.join(DETERMINISTIC_BACKENDS)}): choose one of "
                          "those, or set CONFIG_SGLANG_DETERMINISTIC=n")
    # GPUs on which SGLang's fallback, fa3, asserts (V100, T4).
    no_fa3 = sorted({major for major, _ in capabilities if major not in (*FA3_MAJORS, *FLASHINFER_FALLBACK_MAJORS)})
    if no_fa3 and backend == "fa3":
        raise ConfigError(f"CONFIG_SGLANG_COMMAND has {ATTENTION_FLAG} fa3, whose kernels need an SM80-SM90 GPU, "
                          f"but this server gets SM{no_fa3[0]}x GPUs: use {ATTENTION_FLAG} {PORTABLE_BACKEND}")
    added = [] if DETERMINISTIC_FLAG in command else [DETERMINISTIC_FLAG]
    if no_fa3 and backend is None:
        added += [ATTENTION_FLAG, PORTABLE_BACKEND]  # SGLang's fallback there, fa3, would assert
    return added
