"""The SGLang path on a real GPU host, against the fake server: deterministic inference as a
choice (CONFIG_SGLANG_DETERMINISTIC) and the GPU it runs on (a stand-in `nvidia-smi`, which
the launcher and the fake both ask, as SGLang asks CUDA), a server that cannot import
compressor_2 never killed by the probe, slow requests retried, and known start-up deaths
given the flag that fixes them."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import httpx
import pytest

from compressor_2.common.errors import ConfigError, RunError
from compressor_2.config.sglang import launch_command
from compressor_2.engines.base import GenerationRequest
from compressor_2.engines.sglang.engine import TIMEOUT_RETRIES, SGLangEngine
from compressor_2.engines.sglang.server import SGLangServer
from compressor_2.steering.guarded import guarded_spec
from compressor_2.steering.processor import processor_spec
from tests.sglang_helpers import ATTACHABLE, fake_server, logged_requests, probe_clusters, sglang_config

FLAG = "--enable-deterministic-inference"
PROMPTS = ["Revenue was", "Total assets"]
# The request timeout of the slow-request tests: far above a healthy answer of the warm toy
# model on a busy machine, far below the stall (tests/fakes/sglang_server.py's STALL, 30 s).
TIMEOUT = 8.0


@pytest.fixture(scope="module")
def clusters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    return probe_clusters(tiny_model_dir, tmp_path_factory.mktemp("clusters"))


@pytest.fixture()
def gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`gpu("7.5")`: a stand-in nvidia-smi on PATH that reports one GPU of that compute
    capability (and a R580 driver), for this process and the servers it starts."""
    def install(capability: str) -> None:
        tools = tmp_path / "gpu-bin"
        tools.mkdir(exist_ok=True)
        (tools / "nvidia-smi").write_text(
            f'#!/bin/sh\ncase "$*" in *compute_cap*) echo {capability};; *driver_version*) echo 580.65.06;; esac\n')
        (tools / "nvidia-smi").chmod(0o755)
        monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    return install


def config(tmp_path: Path, model: Path, *fake_flags: str, **overrides):
    return sglang_config(tmp_path / "run", model, *fake_flags, **overrides)


def flags_after(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


# -- deterministic inference: a choice, and the GPU it runs on -----------------------------------


def test_a_launched_config_without_deterministic_inference_omits_the_flag(tmp_path: Path, tiny_model_dir: Path):
    off = config(tmp_path, tiny_model_dir, sglang_deterministic=False)
    assert FLAG not in launch_command(off)
    with SGLangServer(off) as server:
        info = httpx.get(server.url + "/server_info", timeout=10).json()
    assert info["enable_deterministic_inference"] is False
    assert launch_command(config(tmp_path, tiny_model_dir)).count(FLAG) == 1


def test_a_command_that_contradicts_the_setting_is_refused(tmp_path: Path, tiny_model_dir: Path):
    named = config(tmp_path, tiny_model_dir, FLAG, sglang_deterministic=False)
    with pytest.raises(ConfigError, match=rf"^CONFIG_SGLANG_COMMAND has {FLAG} but CONFIG_SGLANG_DETERMINISTIC=n"):
        launch_command(named)
    other = config(tmp_path, tiny_model_dir, "--attention-backend", "torch_native")
    with pytest.raises(ConfigError, match="--attention-backend torch_native, on which SGLang cannot run "
                                          "deterministic inference .*triton"):
        launch_command(other)


@pytest.mark.parametrize(("capability", "added"), [("7.0", "triton"), ("7.5", "triton"), ("8.0", None),
                                                   ("9.0", None), ("10.0", None), ("12.0", None)])
def test_an_sm7x_gpu_gets_the_attention_backend_that_runs_there(tmp_path, tiny_model_dir, gpu, capability, added):
    gpu(capability)
    with SGLangServer(config(tmp_path, tiny_model_dir)) as server:  # fa3 would assert on SM7x: it starts
        assert flags_after(server.command, "--attention-backend") == added
        info = httpx.get(server.url + "/server_info", timeout=10).json()
    assert info["attention_backend"] == (added or ("flashinfer" if capability in ("10.0", "12.0") else "fa3"))


def test_fa3_named_for_an_sm7x_gpu_is_refused_naming_the_flag(tmp_path, tiny_model_dir, gpu):
    gpu("7.5")
    with pytest.raises(ConfigError, match=r"--attention-backend fa3, whose kernels need an SM80-SM90 GPU, but this "
                                          r"server gets SM7x GPUs: use --attention-backend triton"):
        SGLangServer(config(tmp_path, tiny_model_dir, "--attention-backend", "fa3"))


def test_a_server_dying_of_the_fa3_assertion_gets_a_hint_naming_the_flag(tmp_path, tiny_model_dir, gpu):
    gpu("7.5")
    server = SGLangServer(config(tmp_path, tiny_model_dir, sglang_startup_timeout=60.0))
    # As when the launcher cannot read the GPU: SGLang's own fallback, fa3.
    server.command = [part for part in server.command if part not in ("--attention-backend", "triton")]
    with pytest.raises(RunError) as died:
        server.start()
    first = str(died.value).splitlines()[0]
    assert "FlashAttention v3 Backend requires SM>=80" in first
    assert "hint: this GPU cannot run fa3, the attention backend SGLang falls back to: add --attention-backend " \
           "triton to CONFIG_SGLANG_COMMAND" in first


@pytest.mark.parametrize("capability", ["10.0", "12.0"])
def test_the_radix_cache_that_deterministic_inference_turns_off_is_warned_about_with_its_cost(
        tmp_path, tiny_model_dir, clusters, gpu, caplog, capability):
    gpu(capability)
    prompts = {"a": "Revenue was", "b": "Total assets of the company"}
    with fake_server(tiny_model_dir, *ATTACHABLE) as url:
        with caplog.at_level(logging.WARNING, logger="compressor_2.engines"):
            SGLangEngine.from_config(config(tmp_path, tiny_model_dir, sglang_urls=(url,)), clusters,
                                     prompts=prompts).close()
    [warning] = [r.getMessage() for r in caplog.records if "radix" in r.getMessage()]
    assert f"{url} has no radix cache (deterministic inference on the flashinfer attention backend turns it off" \
           in warning
    assert "--attention-backend triton keeps it" in warning and "over the run's 2 prompts, for every genome" in warning


def test_a_server_with_a_radix_cache_gets_no_warning(tmp_path, tiny_model_dir, clusters, gpu, caplog):
    gpu("9.0")
    with fake_server(tiny_model_dir, *ATTACHABLE) as url:
        with caplog.at_level(logging.WARNING, logger="compressor_2.engines"):
            SGLangEngine.from_config(config(tmp_path, tiny_model_dir, sglang_urls=(url,)), clusters).close()
    assert not [r for r in caplog.records if "radix" in r.getMessage()]


# -- never kill an attached server -------------------------------------------------------------


def test_the_fake_dies_of_the_runs_string_as_sglang_does_when_it_cannot_import_compressor_2(tiny_model_dir,
                                                                                            clusters):
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-without-compressor-2") as url:
        body = {"text": "Hello", "custom_logit_processor": processor_spec(),
                "sampling_params": {"max_new_tokens": 2, "custom_params": {"deltas": [0.0, 0.0, 0.0]}}}
        with pytest.raises(httpx.TransportError):
            httpx.post(url + "/generate", json=body, timeout=30)
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=5)


def test_an_attached_server_that_cannot_import_compressor_2_is_never_sent_the_runs_string(tmp_path, tiny_model_dir,
                                                                                          clusters):
    log = tmp_path / "requests.jsonl"
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-without-compressor-2", "--fake-request-log",
                     str(log)) as url:
        with pytest.raises(RunError) as refused:
            SGLangEngine.from_config(config(tmp_path, tiny_model_dir, sglang_urls=(url,)), clusters)
        assert httpx.get(url + "/health", timeout=5).status_code == 200  # alive
    message = str(refused.value)
    assert message.startswith(f"{url} cannot load compressor_2's steering processor")
    assert "Install this compressor_2 into the Python environment the server runs in" in message
    sent = logged_requests(log)
    assert len(sent) == 2 and all(body["custom_logit_processor"] == guarded_spec() for body in sent)


def test_a_launched_interpreter_without_compressor_2_is_refused_naming_the_command(tmp_path, tiny_model_dir,
                                                                                   clusters):
    launched = config(tmp_path, tiny_model_dir, "--fake-without-compressor-2")
    with pytest.raises(RunError, match=r"cannot load compressor_2's steering processor.*CONFIG_SGLANG_COMMAND runs "
                                       + sys.executable):
        SGLangEngine.from_config(launched, clusters)


# -- slow requests ------------------------------------------------------------------------------


def _warm(url: str) -> None:
    """The toy model's first request loads torch (seconds): before the timeouts below."""
    httpx.post(url + "/generate", json={"text": "warm", "sampling_params": {"max_new_tokens": 1}}, timeout=120)


@pytest.mark.slow  # a request timeout of TIMEOUT
def test_a_timed_out_request_is_sent_again(tmp_path, tiny_model_dir, clusters, caplog):
    # Request 1 warms the model, 2-5 are the probes, 6 (the run's first) stalls past the timeout.
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-stall", "6") as url:
        _warm(url)
        attached = config(tmp_path, tiny_model_dir, sglang_urls=(url,), sglang_request_timeout=TIMEOUT)
        batch = [GenerationRequest(PROMPTS[0], (0.0, 0.0, 0.0))]
        with caplog.at_level(logging.WARNING, logger="compressor_2.engines"):
            with SGLangEngine.from_config(attached, clusters) as engine:
                [answer] = engine.generate(batch)
        with SGLangEngine.from_config(attached, clusters) as again:
            assert again.generate(batch) == [answer]
    assert (f"gave no answer to request 0 (prompt ending 'Revenue was') within {TIMEOUT:g} s "
            f"(CONFIG_SGLANG_REQUEST_TIMEOUT): sending it again (1 of at most {TIMEOUT_RETRIES})") in caplog.text


@pytest.mark.slow  # three request timeouts of TIMEOUT
def test_a_request_that_keeps_timing_out_stops_the_run_naming_the_setting(tmp_path, tiny_model_dir, clusters):
    stalled = ",".join(str(n) for n in range(6, 6 + TIMEOUT_RETRIES + 1))
    with fake_server(tiny_model_dir, *ATTACHABLE, "--fake-stall", stalled) as url:
        _warm(url)
        attached = config(tmp_path, tiny_model_dir, sglang_urls=(url,), sglang_request_timeout=TIMEOUT)
        with SGLangEngine.from_config(attached, clusters) as engine:
            with pytest.raises(RunError, match=r"gave no answer to request 0 \(prompt ending 'Revenue was'\) "
                                               rf"within {TIMEOUT:g} s \(CONFIG_SGLANG_REQUEST_TIMEOUT\), "
                                               rf"{TIMEOUT_RETRIES + 1} times in a row: raise "
                                               r"CONFIG_SGLANG_REQUEST_TIMEOUT"):
                engine.generate([GenerationRequest(PROMPTS[0], (0.0, 0.0, 0.0))])
