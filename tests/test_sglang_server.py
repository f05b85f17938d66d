"""The launched SGLang server's lifecycle, against the fake server as a real subprocess."""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from compressor_2.common.endpoint import is_loopback
from compressor_2.common.errors import ConfigError, RunError
from compressor_2.config.sglang import launch_command
from compressor_2.engines.sglang.server import LOG_NAME, SGLangServer
from tests.sglang_helpers import REPO, fake_stats, logged_pids, process_gone, sglang_config


@pytest.fixture()
def config_for(tmp_path: Path):
    # No /generate here, so the fake never loads a model: any path will do.
    def make(*fake_flags: str, **overrides):
        return sglang_config(tmp_path / "run", tmp_path / "no_model", *fake_flags, **overrides)
    return make


def started_pids(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [int(pid) for pid in re.findall(r"SGLang server start #\d+: pid (\d+)", caplog.text)]


def listening_address(port: int) -> str | None:
    """The local address (hex, as in /proc/net/tcp) a socket listens on at `port`."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, port_hex = fields[1].split(":")
        if int(port_hex, 16) == port and fields[3] == "0A":  # 0A = LISTEN
            return address
    return None


def test_launch_command_adds_only_missing_flags(config_for):
    config = dataclasses.replace(config_for(), model_path="/models/mine")
    command = launch_command(dataclasses.replace(
        config, sglang_command="python -m sglang.launch_server --enable-custom-logit-processor "
                               "--model-path /models/mine/ --mem-fraction-static 0.8"))
    assert command[1:3] == ["-m", "sglang.launch_server"]
    assert command.count("--enable-custom-logit-processor") == 1
    assert command[command.index("--model-path") + 1] == "/models/mine/"
    assert command.count("--model-path") == 1
    assert command[command.index("--port") + 1] == str(config.sglang_port)
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command.count("--enable-deterministic-inference") == 1
    assert "--mem-fraction-static" in command
    again = launch_command(dataclasses.replace(
        config, sglang_command="python -m sglang.launch_server --enable-deterministic-inference"))
    assert again.count("--enable-deterministic-inference") == 1
    assert again[again.index("--model-path") + 1] == "/models/mine"


@pytest.mark.parametrize(("given", "runs"), [
    ("python -m sglang.launch_server", sys.executable), ("python3 -m sglang.launch_server", sys.executable),
    ("/opt/sglang/bin/python -m sglang.launch_server", "/opt/sglang/bin/python"),
    ("sglang serve", "sglang"),
])
def test_a_leading_python_is_the_interpreter_that_runs_compressor_2(config_for, given: str, runs: str):
    # The `python` a shell finds first may lack sglang or compressor_2 (make run does not
    # activate .venv); an explicit path or another program is left as written.
    assert launch_command(dataclasses.replace(config_for(), sglang_command=given))[0] == runs


@pytest.mark.parametrize("flags", [
    "--speculative-algorithm EAGLE", "--speculative-algorithm=NGRAM", "--speculative-algo EAGLE3",
    "--speculative-draft-model-path /models/draft", "--speculative-num-steps 3 --speculative-eagle-topk 1",
])
def test_speculative_decoding_in_the_command_is_refused(config_for, flags: str):
    config = dataclasses.replace(config_for(), sglang_command=f"python -m sglang.launch_server {flags}")
    with pytest.raises(ConfigError, match=r"^CONFIG_SGLANG_COMMAND has --speculative-\S+: .*unsteered") as raised:
        launch_command(config)
    assert "\n" not in str(raised.value)


def test_a_command_serving_another_model_is_refused_unless_allowed(config_for):
    config = dataclasses.replace(config_for(), sglang_command="python -m sglang.launch_server --model /models/other")
    with pytest.raises(ConfigError, match=r"--model-path '/models/other' but CONFIG_MODEL_PATH=.*no_model"):
        launch_command(config)
    allowed = launch_command(dataclasses.replace(config, sglang_allow_other_model=True))
    assert allowed[allowed.index("--model") + 1] == "/models/other" and "--model-path" not in allowed


SPECULATIVE_CONFIG = """CONFIG_ENGINE_TRANSFORMERS=n
CONFIG_ENGINE_SGLANG=y
CONFIG_SGLANG_COMMAND="python -m sglang.launch_server --speculative-algorithm EAGLE"
CONFIG_OUTPUT_DIR="{out}"
"""


def test_a_config_naming_speculative_decoding_fails_before_any_work(tmp_path: Path):
    config = tmp_path / "spec.config"
    config.write_text((REPO / "defconfig").read_text() + SPECULATIVE_CONFIG.format(out=tmp_path / "run"))
    done = subprocess.run([sys.executable, "-m", "compressor_2", "evolve", "--config", str(config)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--speculative-algorithm" in done.stderr
    assert not (tmp_path / "run").exists()


def test_launch_command_binds_all_interfaces_only_when_allowed(config_for):
    allowed = launch_command(dataclasses.replace(config_for(), sglang_allow_remote=True))
    assert allowed[allowed.index("--host") + 1] == "0.0.0.0"
    exposed = dataclasses.replace(config_for(), sglang_command="sglang.launch_server --host 0.0.0.0")
    with pytest.raises(ConfigError, match="CONFIG_SGLANG_ALLOW_REMOTE"):
        launch_command(exposed)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LocalHost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("gpu1", False), ("", False),
])
def test_one_loopback_rule(host: str, loopback: bool):
    assert is_loopback(host) is loopback


def test_a_server_launched_on_the_ipv6_loopback_is_reached_there(config_for):
    config = config_for()
    config = dataclasses.replace(config, sglang_command=config.sglang_command + " --host ::1")
    with SGLangServer(config) as server:
        assert server.url == f"http://[::1]:{config.sglang_port}"
        assert fake_stats(server.url)["host"] == "::1"


def test_launch_command_refuses_a_port_that_contradicts_the_config(config_for):
    config = config_for()
    clash = dataclasses.replace(config, sglang_command=f"serve --port={config.sglang_port + 1}")
    with pytest.raises(ConfigError, match=f"CONFIG_SGLANG_PORT={config.sglang_port}"):
        launch_command(clash)


def test_server_binds_loopback_logs_its_start_and_stops_on_exit(config_for, caplog):
    config = config_for()
    caplog.set_level(logging.INFO, logger="compressor_2.engines.sglang.server")
    with SGLangServer(config) as server:
        pid = server.pid
        assert fake_stats(server.url)["host"] == "127.0.0.1"
        assert listening_address(config.sglang_port) == "0100007F"  # 127.0.0.1, not 0.0.0.0
    assert process_gone(pid)
    assert server.starts == 1
    assert "SGLang server start #1" in caplog.text
    log = (config.output_dir / LOG_NAME).read_text()
    assert "server start #1" in log and logged_pids(config.output_dir / LOG_NAME, "sglang") == [pid]


def test_restart_starts_a_new_process_and_counts_it(config_for, caplog):
    caplog.set_level(logging.INFO, logger="compressor_2.engines.sglang.server")
    server = SGLangServer(config_for("--fake-start-delay", "0.2"))
    try:
        server.start()
        first = server.pid
        server.restart()
        assert server.pid != first and server.alive()
        assert process_gone(first)
        assert server.starts == 2
        assert "SGLang server start #2" in caplog.text
    finally:
        server.stop()
    server.stop()  # idempotent
    log = (server.log_path).read_text()
    assert log.count("=== compressor_2: server start #") == 2  # appended, not overwritten


def test_readiness_timeout_stops_the_server_and_says_so(config_for, caplog):
    caplog.set_level(logging.INFO, logger="compressor_2.engines.sglang.server")
    config = config_for("--fake-never-ready", sglang_startup_timeout=1.5)
    server = SGLangServer(config)
    with pytest.raises(RunError, match=r"not ready after 1.5 s \(CONFIG_SGLANG_STARTUP_TIMEOUT\)"):
        server.start()
    assert not server.alive()
    [pid] = started_pids(caplog)
    assert process_gone(pid)


def test_exit_during_startup_fails_at_once_with_the_log_tail(config_for):
    # A long readiness timeout: only noticing the exit can end start() with this message.
    config = config_for("--fake-exit-during-startup", "7", sglang_startup_timeout=120.0)
    with pytest.raises(RunError) as caught:
        SGLangServer(config).start()
    message = str(caught.value)
    first_line = message.splitlines()[0]
    assert "exited with code 7 during start-up" in first_line
    assert "CUDA out of memory (fake)" in first_line  # the CLI prints only this line
    assert "Loading model weights..." in message  # the tail, for --debug
    assert str(config.output_dir / LOG_NAME) in message


def test_busy_port_is_a_clear_error_before_anything_starts(config_for):
    config = config_for()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", config.sglang_port))
        squatter.listen()
        server = SGLangServer(config)
        with pytest.raises(ConfigError, match=f"CONFIG_SGLANG_PORT={config.sglang_port}: .*already in use"):
            server.start()
    assert server.starts == 0
    assert not (config.output_dir / LOG_NAME).exists()


def test_readiness_falls_back_to_health_on_old_servers(config_for):
    # /health_generate answers 404 here: without the fallback start() would time out.
    config = config_for("--fake-no-health-generate", sglang_startup_timeout=5.0)
    with SGLangServer(config) as server:
        assert server.alive()


def test_stop_kills_the_whole_group_when_sigterm_is_ignored(config_for, caplog):
    config = config_for("--fake-ignore-sigterm", "--fake-child", sglang_stop_grace=0.3)
    server = SGLangServer(config)
    server.start()
    [child] = logged_pids(server.log_path, "child")
    pid = server.pid
    with caplog.at_level(logging.WARNING, logger="compressor_2.engines.sglang.server"):
        server.stop()
    assert "ignored SIGTERM" in caplog.text
    assert process_gone(pid) and process_gone(child)


CHILD = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # background jobs start with SIGINT ignored
from pathlib import Path
from compressor_2.engines.sglang.server import SGLangServer
from tests.sglang_helpers import sglang_config
server = SGLangServer(sglang_config(Path(sys.argv[1]), Path(sys.argv[1]) / "no_model"))
server.start()  # no context manager, no stop(): only the atexit hook can clean up
print("server pid", server.pid, flush=True)
time.sleep(600)
"""


def test_ctrl_c_in_the_client_stops_the_server_it_launched(tmp_path: Path):
    client = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = client.stdout.readline()
        assert line.startswith("server pid"), client.stderr.read()
        server_pid = int(line.split()[-1])
        client.send_signal(signal.SIGINT)
        _, stderr = client.communicate(timeout=60)
    finally:
        client.kill()
    assert "KeyboardInterrupt" in stderr
    assert process_gone(server_pid)


@pytest.mark.parametrize("phases, delayed", [(1, False), (2, True)])
def test_a_server_for_deltas_by_phase_samples_after_appending_the_last_token(config_for, phases: int,
                                                                            delayed: bool):
    # A phased row reads its output ids: SGLang's overlap scheduler must not run the processor
    # before the previous token is appended, which SGLANG_ENABLE_DELAY_SAMPLE=1 ensures.
    config = dataclasses.replace(config_for(), delta_phases=phases)
    with SGLangServer(config) as server:
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
    assert (b"SGLANG_ENABLE_DELAY_SAMPLE=1" in environ) is delayed
