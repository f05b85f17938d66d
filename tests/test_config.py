"""The config loader refuses every config it cannot trust, naming the symbol."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compressor_2.common.errors import ConfigError
from compressor_2.config import load_config
from tests.conftest import REPO

DEFCONFIG = (REPO / "defconfig").read_text()


def write_config(tmp_path: Path, text: str, base: str = DEFCONFIG) -> Path:
    """`base` with the assignments in `text` replacing any of the same names."""
    names = {line.split("=", 1)[0] + "=" for line in text.splitlines()}
    kept = "".join(line + "\n" for line in base.splitlines() if line.split("=", 1)[0] + "=" not in names)
    path = tmp_path / "test.config"
    path.write_text(kept + text)
    return path


def without(line_prefix: str) -> str:
    return "".join(line + "\n" for line in DEFCONFIG.splitlines() if not line.startswith(line_prefix))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compressor_2", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


BAD_CONFIGS: list[tuple[str, str, str]] = [
    # (case id, config text appended to a base, symbol the message must name)
    ("population sentinel", "CONFIG_POPULATION_SIZE=-1\n", "CONFIG_POPULATION_SIZE"),
    ("ngen sentinel", "CONFIG_NGEN=-1\n", "CONFIG_NGEN"),
    ("cxpb sentinel", 'CONFIG_CXPB=""\n', "CONFIG_CXPB"),
    ("mutpb sentinel", 'CONFIG_MUTPB=""\n', "CONFIG_MUTPB"),
    ("elitism sentinel", "CONFIG_ELITISM_SIZE=-1\n", "CONFIG_ELITISM_SIZE"),
    ("selection sentinel", 'CONFIG_SELECTION=""\n', "CONFIG_SELECTION"),
    ("lambda_s sentinel", 'CONFIG_LAMBDA_SHORTNESS=""\n', "CONFIG_LAMBDA_SHORTNESS"),
    ("lambda_c sentinel", 'CONFIG_LAMBDA_CORRECTNESS=""\n', "CONFIG_LAMBDA_CORRECTNESS"),
    ("initial deltas sentinel", 'CONFIG_INITIAL_DELTAS_PATH=""\n', "CONFIG_INITIAL_DELTAS_PATH"),
    ("lambda above 1", 'CONFIG_LAMBDA_SHORTNESS="1.5"\n', "CONFIG_LAMBDA_SHORTNESS"),
    ("lambda negative", 'CONFIG_LAMBDA_CORRECTNESS="-0.1"\n', "CONFIG_LAMBDA_CORRECTNESS"),
    ("both lambdas zero", 'CONFIG_LAMBDA_SHORTNESS="0"\nCONFIG_LAMBDA_CORRECTNESS="0"\n',
     "CONFIG_LAMBDA_SHORTNESS"),
    ("cxpb above 1", 'CONFIG_CXPB="1.01"\n', "CONFIG_CXPB"),
    ("mutpb negative", 'CONFIG_MUTPB="-0.5"\n', "CONFIG_MUTPB"),
    ("non-numeric float", 'CONFIG_CXPB="often"\n', "CONFIG_CXPB"),
    ("nan float", 'CONFIG_MUTPB="nan"\n', "CONFIG_MUTPB"),
    ("inf float", 'CONFIG_SHORTNESS_SCALE="inf"\n', "CONFIG_SHORTNESS_SCALE"),
    ("elitism equals population", "CONFIG_ELITISM_SIZE=8\n", "CONFIG_ELITISM_SIZE"),
    ("elitism negative", "CONFIG_ELITISM_SIZE=-2\n", "CONFIG_ELITISM_SIZE"),
    ("ngen zero", "CONFIG_NGEN=0\n", "CONFIG_NGEN"),
    ("tournament size 1", "CONFIG_TOURNAMENT_SIZE=1\n", "CONFIG_TOURNAMENT_SIZE"),
    ("tournament above population", "CONFIG_TOURNAMENT_SIZE=9\n", "CONFIG_TOURNAMENT_SIZE"),
    ("tournament missing", "CONFIG_TOURNAMENT_SIZE=-1\n", "CONFIG_TOURNAMENT_SIZE"),
    ("truncation top-k missing", 'CONFIG_SELECTION="truncation"\n', "CONFIG_TRUNCATION_TOP_K"),
    ("truncation top-k 1", 'CONFIG_SELECTION="truncation"\nCONFIG_TRUNCATION_TOP_K=1\n',
     "CONFIG_TRUNCATION_TOP_K"),
    ("truncation top-k above population",
     'CONFIG_SELECTION="truncation"\nCONFIG_TRUNCATION_TOP_K=9\n', "CONFIG_TRUNCATION_TOP_K"),
    ("unknown selection", 'CONFIG_SELECTION="roulette"\n', "CONFIG_SELECTION"),
    ("llm selection without fallback", 'CONFIG_SELECTION="llm"\n', "CONFIG_SELECTION_FALLBACK"),
    ("llm fallback unknown", 'CONFIG_SELECTION="llm"\nCONFIG_SELECTION_FALLBACK="llm"\n', "CONFIG_SELECTION_FALLBACK"),
    ("llm fallback without its size", 'CONFIG_SELECTION="llm"\nCONFIG_SELECTION_FALLBACK="truncation"\n',
     "CONFIG_TRUNCATION_TOP_K"),
    ("fallback without llm selection", 'CONFIG_SELECTION_FALLBACK="tournament"\n', "CONFIG_SELECTION_FALLBACK"),
    ("unknown mutation scope", 'CONFIG_MUTATION_SCOPE="everything"\n', "CONFIG_MUTATION_SCOPE"),
    ("negative wall budget", 'CONFIG_MAX_WALL_MINUTES="-1"\n', "CONFIG_MAX_WALL_MINUTES"),
    ("negative metric budget", "CONFIG_MAX_METRIC_CALLS=-5\n", "CONFIG_MAX_METRIC_CALLS"),
    ("bad int", "CONFIG_POPULATION_SIZE=six\n", "CONFIG_POPULATION_SIZE"),
    ("int out of range", "CONFIG_MAX_NEW_TOKENS=0\n", "CONFIG_MAX_NEW_TOKENS"),
    ("misspelled name", "CONFIG_POPULATON_SIZE=8\n", "CONFIG_POPULATON_SIZE"),
    ("dependency unmet", 'CONFIG_SGLANG_COMMAND="python -m sglang.launch_server --tp 2"\n',
     "CONFIG_SGLANG_COMMAND"),
    ("two choices y", "CONFIG_ENGINE_TRANSFORMERS=y\nCONFIG_ENGINE_SGLANG=y\n", "CONFIG_ENGINE_"),
    ("unquoted string", "CONFIG_SELECTION=tournament\n", "CONFIG_SELECTION"),
    ("set twice", "CONFIG_NGEN=3\nCONFIG_NGEN=4\n", "CONFIG_NGEN"),
    ("bad pool indices", 'CONFIG_FINANCEBENCH_POOL_INDICES="1-"\n', "CONFIG_FINANCEBENCH_POOL_INDICES"),
    ("bad url", 'CONFIG_ENGINE_SGLANG=y\nCONFIG_SGLANG_URLS="localhost:30000"\n', "CONFIG_SGLANG_URLS"),
    ("unknown request path", 'CONFIG_ENGINE_SGLANG=y\nCONFIG_SGLANG_API="openai"\n', "CONFIG_SGLANG_API"),
    # kconfiglib ends a line at "\n" only: the form feed and what follows are the value it reads.
    ("a form feed inside a bool", "CONFIG_COMPARE_SIMPLE=n\x0cjunk\n", "CONFIG_COMPARE_SIMPLE"),
    ("viability above 1", 'CONFIG_STRATEGY_ARCHIVE=y\nCONFIG_ARCHIVE_MIN_CORRECTNESS="1.5"\n',
     "CONFIG_ARCHIVE_MIN_CORRECTNESS"),
]


@pytest.mark.parametrize(("case", "text", "symbol"), BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_names_symbol(tmp_path: Path, case: str, text: str, symbol: str) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert symbol in message, f"{case}: {message}"
    assert "\n" not in message


def test_removed_line_falls_back_to_sentinel(tmp_path: Path) -> None:
    path = write_config(tmp_path, "", base=without("CONFIG_NGEN"))
    with pytest.raises(ConfigError, match="CONFIG_NGEN is not set"):
        load_config(path)


def test_missing_file_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make defconfig"):
        load_config(tmp_path / "nope.config")


def test_good_config_loads_typed_values(tmp_path: Path) -> None:
    path = write_config(tmp_path, (
        'CONFIG_LAMBDA_SHORTNESS="0.3"\nCONFIG_LAMBDA_CORRECTNESS="0.9"\n'
        "CONFIG_ENGINE_SGLANG=y\n"
        'CONFIG_SGLANG_URLS="http://127.0.0.1:30000/, http://127.0.0.1:30001"\n'
        'CONFIG_SELECTION="truncation"\nCONFIG_TRUNCATION_TOP_K=3\nCONFIG_TOURNAMENT_SIZE=-1\n'
        'CONFIG_FINANCEBENCH_POOL_INDICES="0,3,5-9"\nCONFIG_JUDGE_HYBRID=y\n'
        "CONFIG_REFLECTOR_OPENAI=y\n"
    ))
    config = load_config(path)
    assert config.ga.population_size == 8 and isinstance(config.ga.population_size, int)
    assert config.ga.cxpb == 0.5 and isinstance(config.ga.cxpb, float)
    assert config.lambda_shortness == pytest.approx(0.25)
    assert config.lambda_correctness == pytest.approx(0.75)
    assert config.engine == "sglang"
    assert config.sglang_urls == ("http://127.0.0.1:30000", "http://127.0.0.1:30001")
    assert config.sglang_allow_remote is False and config.sglang_api == "auto"
    assert config.ga.selection == "truncation" and config.ga.truncation_top_k == 3
    assert config.ga.tournament_size is None
    assert config.judge == "hybrid" and config.judge_api_key_env == "OPENAI_API_KEY"
    assert config.reflector == "openai" and config.reflector_model == "gpt-4o"
    assert config.pool_indices == "0,3,5-9"
    assert config.initial_deltas_path == Path("outputs/clusters/initial_deltas.json")
    assert config.prompt_template_path is None


def test_defconfig_is_the_offline_default() -> None:
    config = load_config(REPO / "defconfig")
    assert (config.engine, config.reflector, config.judge) == ("transformers", "local", "numeric")
    # Options whose dependency is off still carry their typed Kconfig default.
    assert config.sglang_port == 30000 and config.reflector_timeout == 120.0


def test_cli_check_config_prints_settings() -> None:
    result = run_cli("check-config", "--config", "defconfig")
    assert result.returncode == 0, result.stderr
    assert "population_size" in result.stdout and "= 8" in result.stdout


def test_cli_bad_config_one_line_exit_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, 'CONFIG_MUTPB="nan"\n')
    result = run_cli("check-config", "--config", str(path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "CONFIG_MUTPB" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_debug_shows_traceback(tmp_path: Path) -> None:
    path = write_config(tmp_path, 'CONFIG_MUTPB="nan"\n')
    result = run_cli("check-config", "--config", str(path), "--debug")
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_cli_usage_error_exit_2() -> None:
    result = run_cli("check-config", "--bogus")
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr


@pytest.mark.parametrize("command", ["check-config", "build-clusters", "generate-processor",
                                     "evaluate", "evolve", "show"])
def test_every_command_has_help(command: str) -> None:
    result = run_cli(command, "--help")
    assert result.returncode == 0 and "--config" in result.stdout


def test_real_setup_config_loads() -> None:
    config = load_config(REPO / "configs" / "sglang-financebench.config")
    assert (config.engine, config.reflector, config.judge) == ("sglang", "openai", "hybrid")
    assert config.sglang_urls == () and config.sglang_allow_remote is False
    assert config.lambda_correctness == pytest.approx(0.6)



def test_the_top_level_help_describes_the_tool() -> None:
    result = run_cli("--help")
    assert result.returncode == 0 and "evolve per-cluster logit steering deltas" in result.stdout
    assert "one parser, one line per error" not in result.stdout


def test_config_defaults_to_dot_config_in_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / ".config").write_text((REPO / "defconfig").read_text())
    result = subprocess.run([sys.executable, "-m", "compressor_2", "check-config"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and result.stdout.startswith(".config: OK")
    missing = subprocess.run([sys.executable, "-m", "compressor_2", "check-config"], capture_output=True,
                             text=True, cwd=tmp_path / "..", timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert missing.returncode == 2 and "config file '.config' not found" in missing.stderr


def test_the_descriptions_default_to_the_cluster_directory_and_an_explicit_path_is_kept(tmp_path: Path) -> None:
    """Issue AA, item 5: CONFIG_CLUSTER_DESCRIPTIONS_PATH empty (its default) means
    cluster_descriptions.json inside CONFIG_CLUSTER_DIR, wherever that directory is."""
    moved = load_config(write_config(tmp_path, f'CONFIG_CLUSTER_DIR="{tmp_path / "elsewhere"}"\n'
                                               'CONFIG_CLUSTER_DESCRIPTIONS_PATH=""\n'))
    assert moved.cluster_descriptions_path == tmp_path / "elsewhere" / "cluster_descriptions.json"
    assert load_config(write_config(tmp_path, "")).cluster_descriptions_path == Path(
        "outputs/clusters/cluster_descriptions.json")
    given = load_config(write_config(tmp_path, f'CONFIG_CLUSTER_DIR="{tmp_path / "elsewhere"}"\n'
                                               f'CONFIG_CLUSTER_DESCRIPTIONS_PATH="{tmp_path / "mine.json"}"\n'))
    assert given.cluster_descriptions_path == tmp_path / "mine.json"
