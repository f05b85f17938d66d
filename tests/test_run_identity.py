"""Issue S, item 1: a resume never mixes two objectives.

The table (`ROWS`) has one row per Kconfig symbol, the list read from Kconfig with
kconfiglib: a config and the same config with that symbol changed. The identities of the
two are compared as a resume compares them, and the change must be refused unless
docs/runs.md lists the symbol among those a rerun may change, and then accepted with a
line saying what it means. A new Kconfig symbol fails the table until it has a row (and a
place in `compressor_2/resume/identity.py`'s `SETTINGS`). The end-to-end rows below run the
real CLI: a run interrupted, changed and resumed.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import kconfiglib
import numpy as np
import pytest

from compressor_2.cli import main
from compressor_2.clusters.builder import build_clusters
from compressor_2.clusters.clusterset import ArtifactPaths, cluster_map_digest, read_cluster_set
from compressor_2.config import KCONFIG_PATH, Config, load_config
from compressor_2.data.financebench import examples_from_config
from compressor_2.resume.identity import SETTINGS, RunInputs, changes, model_identity, run_identity
from tests.conftest import REPO
from tests.test_evolution_support import DEFAULT_NGEN, ROWS as DATA_ROWS, config_for, read_json, write_config

pytestmark = pytest.mark.slow


@functools.cache
def kconfig() -> kconfiglib.Kconfig:
    return kconfiglib.Kconfig(str(KCONFIG_PATH), warn_to_stderr=False)


def kconfig_symbols() -> frozenset[str]:
    return frozenset(sym.name for sym in kconfig().unique_defined_syms)


def expand(pattern: str) -> set[str]:
    """A setting's symbol, or for `PREFIX_*` the entries of the choice whose symbols start so."""
    if not pattern.endswith("*"):
        return {pattern}
    return {sym.name for sym in kconfig().unique_defined_syms
            if sym.choice is not None and sym.name.startswith(pattern[:-1])}


def setting_of(symbol: str) -> str:
    """The name of the one setting that reads `symbol`."""
    [name] = [s.name for s in SETTINGS if any(symbol in expand(p) for p in s.symbols)]
    return name


@functools.cache
def documented_may_change() -> frozenset[str]:
    """The symbols docs/runs.md's table "What a rerun may change" lists."""
    text = (REPO / "docs" / "runs.md").read_text(encoding="utf-8")
    table = text.split("### What a rerun may change", 1)[1].split("\n\n")[2]
    names = {name for row in table.splitlines()[2:] for name in re.findall(r"`CONFIG_([A-Z0-9_]+\*?)`",
                                                                              row.split("|")[1])}
    return frozenset(s for name in names for s in expand(name))


def test_every_kconfig_symbol_is_classified_once_and_the_docs_list_what_may_change():
    symbols = kconfig_symbols()
    read = [s for setting in SETTINGS for pattern in setting.symbols for s in expand(pattern)]
    assert sorted(set(symbols) - set(read)) == [], "classify these in compressor_2/resume/identity.py SETTINGS"
    assert sorted(set(read) - symbols) == [] and len(read) == len(set(read))
    may_change = {s for setting in SETTINGS if setting.may_change for p in setting.symbols
                  for s in expand(p)}
    assert may_change == documented_may_change()


# -- the table: one row per Kconfig symbol -------------------------------------------------------

GA: dict[str, str | None] = {}
ARCHIVE = {"STRATEGY_ARCHIVE": "y"}
GEPA = {"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "100"}
RANDOM = {"STRATEGY_RANDOM": "y"}
CMAES = {"STRATEGY_CMAES": "y"}
SGLANG = {"ENGINE_SGLANG": "y", "TRANSFORMERS_DEVICE": None}
LOGIT_BIAS = {"ENGINE_LOGIT_BIAS": "y", "TRANSFORMERS_DEVICE": None}
OPENAI = {"REFLECTOR_OPENAI": "y"}
LLM_JUDGE = {"JUDGE_LLM": "y"}
TRUNCATION = {"SELECTION": '"truncation"', "TRUNCATION_TOP_K": "2", "TOURNAMENT_SIZE": "-1"}
LLM_SELECTION = {"SELECTION": '"llm"', "SELECTION_FALLBACK": '"tournament"'}


@dataclass(frozen=True)
class Others:
    """Input files with other contents than the shared ones, and a copy of the same."""

    work: Path
    shared: Path

    def data(self) -> str:
        path = self.work / "other.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in DATA_ROWS[:2]))
        return f'"{path}"'

    def template(self) -> str:
        path = self.work / "template.txt"
        path.write_text("{evidence}\n\nQ: {question}\nA:")
        return f'"{path}"'

    def initial_deltas(self) -> str:
        original = read_json(self.shared / "clusters" / "initial_deltas.json")
        path = self.work / "initial.json"
        path.write_text(json.dumps({cid: 0.5 for cid in original}))
        return f'"{path}"'

    def cluster_dir(self) -> str:
        """A copy of the clusters with two tokens swapped between clusters."""
        copy = self.work / "clusters"
        shutil.copytree(self.shared / "clusters", copy, dirs_exist_ok=True)
        token_clusters = np.load(copy / "token_clusters.npy")
        first = int(np.flatnonzero(token_clusters != token_clusters[-1])[-1])
        token_clusters[[first, -1]] = token_clusters[[-1, first]]
        np.save(copy / "token_clusters.npy", token_clusters)
        return f'"{copy}"'

    def descriptions(self) -> str:
        described = read_json(self.shared / "clusters" / "cluster_descriptions.json")
        path = self.work / "descriptions.json"
        path.write_text(json.dumps({**described, "99": next(iter(described.values()))}))
        return f'"{path}"'


def rows(o: Others) -> dict[str, tuple[dict[str, str | None], dict[str, str | None]]]:
    """Kconfig symbol -> (a config, the symbols that change it); None removes a line."""
    strategy_options = {
        **{f"ARCHIVE_{k}": (ARCHIVE, {f"ARCHIVE_{k}": v}) for k, v in {
            "ITERATIONS": "20", "PARENTS_PER_ITERATION": "3", "REPLACE": "n", "SHARPNESS": '"5"',
            "MIDPOINT": '"p80"', "NOVELTY_WEIGHT": '"2"', "ISSUE_BATCH": "4",
            "ISSUE_WEIGHTS": '"cut_short=1,wrong=1,padded=1,refusal=1"', "GENERATORS": '"cluster,vector"',
            "GENERATION_CONCURRENCY": "2", "ASSESSMENT_CONCURRENCY": "8", "FEEDBACK_SCOPE": '"neighborhood"',
            "FEEDBACK_DEPTH": "2", "POSTCHECK_EXAMPLES": "2", "POSTCHECK_MARGIN": '"0.5"',
            "DELTA_LIMIT": '"20"', "MIN_CORRECTNESS": '"0.5"'}.items()},
        **{f"GEPA_{k}": (GEPA, {f"GEPA_{k}": v}) for k, v in {
            "VALSET_SIZE": "10", "VALSET_INDICES": '"0-1"', "MINIBATCH_SIZE": "2",
            "CANDIDATE_SELECTOR": '"current_best"', "EPSILON": '"0.2"', "SKIP_PERFECT": "n",
            "COMPONENT_SELECTOR": '"all"', "USE_MERGE": "n", "MAX_MERGE_INVOCATIONS": "3", "MERGE_EPS": '"1e-3"',
            "MERGE_SUBSAMPLE": "3", "VAL_OVERLAP_FLOOR": "3"}.items()},
        **{f"RANDOM_{k}": (RANDOM, {f"RANDOM_{k}": v}) for k, v in {
            "DISTRIBUTION": '"uniform"', "SCALE": '"1.0"', "BATCH_SIZE": "4", "BATCHES": "20"}.items()},
        **{f"CMAES_{k}": (CMAES, {f"CMAES_{k}": v}) for k, v in {
            "SIGMA": '"0.5"', "POPULATION": "6", "GENERATIONS": "20"}.items()},
    }
    sglang = {f"SGLANG_{k}": (SGLANG, {f"SGLANG_{k}": v}) for k, v in {
        "COMMAND": '"python -m sglang.launch_server --mem-fraction-static 0.8"', "URLS": '"http://127.0.0.1:30001"',
        "PORT": "30001", "ALLOW_REMOTE": "y", "STARTUP_TIMEOUT": "60", "POLL_INTERVAL": '"1"',
        "REQUEST_TIMEOUT": "60", "MAX_RESTARTS": "1", "STOP_GRACE": "5", "ALLOW_OTHER_MODEL": "y", "API": '"completions"',
        "DETERMINISTIC": "n"}.items()}
    logit_bias = {f"LOGIT_BIAS_{k}": (LOGIT_BIAS, {f"LOGIT_BIAS_{k}": v}) for k, v in {
        "URL": '"http://127.0.0.1:8081"', "REQUEST_TIMEOUT": "60"}.items()}
    reflector = {f"REFLECTOR_{k}": (OPENAI, {f"REFLECTOR_{k}": v}) for k, v in {
        "MODEL": '"gpt-4o-mini"', "BASE_URL": '"http://127.0.0.1:8000/v1"', "API_KEY_ENV": '"OTHER_KEY"',
        "TIMEOUT": "60", "MAX_RETRIES": "1", "MAX_CONSECUTIVE_FAILURES": "2"}.items()}
    judge = {f"JUDGE_{k}": (LLM_JUDGE, {f"JUDGE_{k}": v}) for k, v in {
        "MODEL": '"gpt-4o"', "BASE_URL": '"http://127.0.0.1:8000/v1"', "API_KEY_ENV": '"OTHER_KEY"',
        "TIMEOUT": "60", "MAX_CONSECUTIVE_FAILURES": "2"}.items()}
    plain = {k: (GA, {k: v}) for k, v in {
        "OUTPUT_DIR": f'"{o.work / "elsewhere"}"', "CLUSTER_DIR": o.cluster_dir(),
        "CLUSTER_DESCRIPTIONS_PATH": o.descriptions(), "INITIAL_DELTAS_PATH": o.initial_deltas(),
        "FINANCEBENCH_JSONL_PATH": o.data(), "FINANCEBENCH_POOL_INDICES": '"0-1"',
        "PROMPT_TEMPLATE_PATH": o.template(), "EVIDENCE_MAX_CHARS": "10", "MODEL_PATH": '"/elsewhere/model"',
        "MAX_NEW_TOKENS": "9", "TEMPERATURE": '"0.7"', "TRANSFORMERS_BATCH_SIZE": "4",
        "TRANSFORMERS_DEVICE": '"auto"', "TRANSFORMERS_THREADS": "2", "TRANSFORMERS_PROMPT_CACHE_MB": "0",
        "EVAL_CONCURRENCY": "8",
        "LAMBDA_SHORTNESS": '"0.7"', "LAMBDA_CORRECTNESS": '"0.3"', "SHORTNESS_SCALE": '"20"',
        "CORRECTNESS_TOLERANCE": '"0.02"', "REFLECTOR_CONCURRENCY": "2", "REFLECTOR_ANSWER_MAX_CHARS": "300",
        "LOCAL_REFLECTOR_STEP": '"0.5"', "REFLECTOR_PADDING_EVIDENCE": "y", "MAX_METRIC_CALLS": "50", "MAX_REFLECTOR_TOKENS": "1000",
        "MAX_WALL_MINUTES": '"5"', "MAX_IDLE_STEPS": "7", "SEED": "1", "POPULATION_SIZE": "6", "NGEN": "5", "CXPB": '"0.4"',
        "MUTPB": '"0.7"', "ELITISM_SIZE": "2", "TOURNAMENT_SIZE": "3", "MUTATION_SCOPE": '"vector"',
        "EMBEDDING_MODEL": '"other-model"', "PCA_COMPONENTS": "4", "NUM_CLUSTERS": "4", "EMBED_BATCH_SIZE": "64",
        "CLUSTER_SEED": "1", "DELTA_PHASES": "2", "ROLE_CLUSTERS": "y"}.items()}
    holdout = {"HOLDOUT_DATA": o.data()}  # a held-out set to change from: no check records no setting
    checks = {"HOLDOUT_DATA": (holdout, {"HOLDOUT_DATA": f'"{o.work / "elsewhere.jsonl"}"'}),
              "HOLDOUT_INDICES": (holdout, {"HOLDOUT_INDICES": '"0"'}),
              "COMPARE_SIMPLE": (GA, {"COMPARE_SIMPLE": "y"}),
              "COMPARE_INSTRUCTION": ({"COMPARE_SIMPLE": "y"}, {"COMPARE_INSTRUCTION": '"Answer briefly."'}),
              "INSTRUCTION_IN_SEARCH": ({"COMPARE_SIMPLE": "y", "COMPARE_INSTRUCTION": '"Answer briefly."'},
                                        {"INSTRUCTION_IN_SEARCH": "y"})}
    choices = {
        "ENGINE_TRANSFORMERS": (SGLANG, {"ENGINE_SGLANG": None, "ENGINE_TRANSFORMERS": "y"}),
        "ENGINE_SGLANG": (GA, SGLANG),
        "ENGINE_LOGIT_BIAS": (GA, LOGIT_BIAS),
        "JUDGE_NUMERIC": (LLM_JUDGE, {"JUDGE_LLM": None, "JUDGE_NUMERIC": "y"}),
        "JUDGE_LLM": (GA, LLM_JUDGE),
        "JUDGE_HYBRID": (GA, {"JUDGE_HYBRID": "y"}),
        "BEST_FITTEST": ({"BEST_SHORTEST": "y"}, {"BEST_SHORTEST": None, "BEST_FITTEST": "y"}),
        "BEST_SHORTEST": (GA, {"BEST_SHORTEST": "y"}),
        "REFLECTOR_LOCAL": (OPENAI, {"REFLECTOR_OPENAI": None, "REFLECTOR_LOCAL": "y"}),
        "REFLECTOR_OPENAI": (GA, OPENAI),
        "STRATEGY_GA": (ARCHIVE, {"STRATEGY_ARCHIVE": None, "STRATEGY_GA": "y"}),
        "STRATEGY_ARCHIVE": (GA, ARCHIVE), "STRATEGY_GEPA": (GA, GEPA), "STRATEGY_RANDOM": (GA, RANDOM),
        "STRATEGY_CMAES": (GA, CMAES),
        "SELECTION": (GA, TRUNCATION),
        "TRUNCATION_TOP_K": (TRUNCATION, {"TRUNCATION_TOP_K": "3"}),
        "SELECTION_FALLBACK": (LLM_SELECTION, {"SELECTION_FALLBACK": '"truncation"', **TRUNCATION,
                                               "SELECTION": '"llm"'}),
    }
    return {**strategy_options, **sglang, **logit_bias, **reflector, **judge, **plain, **checks, **choices}


def config_of(work: Path, shared: Path, model: Path, symbols: dict[str, str | None]) -> Config:
    path = write_config(work, shared, model, **{k: v for k, v in symbols.items() if v is not None})
    dropped = {f"CONFIG_{k}=" for k, v in symbols.items() if v is None}
    path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                            if not line.startswith(tuple(dropped))))
    return load_config(path)


def inputs_of(config: Config) -> RunInputs:
    """What a start reads from the config's paths, without building anything."""
    clusters = read_cluster_set(ArtifactPaths.from_config(config), "")
    return RunInputs(cluster_map_digest(clusters), tuple(examples_from_config(config)),
                     json.loads(config.initial_deltas_path.read_text(encoding="utf-8")), model_identity(config))


@pytest.fixture(scope="module")
def table(tmp_path_factory, shared, tiny_model_dir):
    work = tmp_path_factory.mktemp("identity_table")
    build_clusters(config_for(work, shared, tiny_model_dir))
    return work, rows(Others(work, shared))


@pytest.fixture(scope="module")
def symbols_tested(table) -> set[str]:
    return set(table[1])


def test_the_table_has_a_row_for_every_kconfig_symbol(symbols_tested):
    assert sorted(kconfig_symbols() - symbols_tested) == [], "add a row to tests/test_run_identity.py"
    assert sorted(symbols_tested - kconfig_symbols()) == []


@pytest.mark.parametrize("symbol", sorted(kconfig_symbols()))
def test_a_changed_setting_is_refused_unless_the_docs_say_it_may_change(symbol, table, shared, tiny_model_dir):
    work, all_rows = table
    if symbol not in all_rows:
        pytest.fail(f"no row for CONFIG_{symbol}: classify it in compressor_2/resume/identity.py and add a row here")
    base, change = all_rows[symbol]
    before = config_of(work, shared, tiny_model_dir, base)
    after = config_of(work, shared, tiny_model_dir, {**base, **change})
    refused, allowed = changes(run_identity(before, inputs_of(before)), run_identity(after, inputs_of(after)))
    name = setting_of(symbol)
    if symbol in documented_may_change():
        assert refused == [] and [line for line in allowed if line.startswith(f"{name}: ")], (refused, allowed)
    else:
        assert [line for line in refused if line.startswith(f"{name}: ")], (refused, allowed)


@pytest.mark.parametrize("symbol", ["FINANCEBENCH_JSONL_PATH", "CLUSTER_DIR", "INITIAL_DELTAS_PATH"])
def test_a_path_moved_with_the_same_contents_is_the_same_setting(symbol, tmp_path, shared, tiny_model_dir, table):
    build_clusters(config_for(tmp_path, shared, tiny_model_dir))
    original = {"FINANCEBENCH_JSONL_PATH": shared / "train.jsonl", "CLUSTER_DIR": shared / "clusters",
                "INITIAL_DELTAS_PATH": shared / "clusters" / "initial_deltas.json"}[symbol]
    copy = tmp_path / "moved"
    (shutil.copytree if original.is_dir() else shutil.copyfile)(original, copy)
    before = config_of(tmp_path, shared, tiny_model_dir, GA)
    after = config_of(tmp_path, shared, tiny_model_dir, {symbol: f'"{copy}"'})
    assert changes(run_identity(before, inputs_of(before)), run_identity(after, inputs_of(after))) == ([], [])


# -- end to end, through the CLI -----------------------------------------------------------------

def run_cli(argv: list[str], capsys) -> tuple[int, list[str], str]:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def answers(out: Path) -> int:
    with closing(sqlite3.connect(out / "run.sqlite")) as db:
        return int(db.execute("SELECT count(*) FROM evaluations").fetchone()[0])


def test_an_interrupted_run_resumed_with_another_objective_is_refused_and_with_a_budget_raised_goes_on(
        tmp_path, shared, tiny_model_dir, monkeypatch, capsys):
    from compressor_2.commands.evolve import evolve
    from compressor_2.reflector.local import LocalProposer

    original = LocalProposer.mutation

    def interrupt(self, request, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if request.generation == 1:
            raise KeyboardInterrupt
        return original(self, request, *args, **kwargs)

    monkeypatch.setattr(LocalProposer, "mutation", interrupt)
    with pytest.raises(KeyboardInterrupt):
        evolve(config_for(tmp_path, shared, tiny_model_dir, NGEN="2"))
    monkeypatch.setattr(LocalProposer, "mutation", original)
    out = tmp_path / "out"
    state, stored = (out / "evolution_state.json").read_bytes(), answers(out)

    changed = write_config(tmp_path, shared, tiny_model_dir, NGEN="2", LAMBDA_SHORTNESS='"0.7"',
                           LAMBDA_CORRECTNESS='"0.3"', SEED="3", ELITISM_SIZE="2")
    code, err, _ = run_cli(["evolve", "--config", str(changed)], capsys)
    assert code == 2, err
    assert err[0].startswith(f"error: '{out / 'run.sqlite'}' holds a run started with other settings")
    assert err[1:] == [
        "  CONFIG_LAMBDA_SHORTNESS (normalised): 0.5 when the run started, 0.7 now",
        "  CONFIG_LAMBDA_CORRECTNESS (normalised): 0.5 when the run started, 0.3 now",
        "  CONFIG_SEED: 0 when the run started, 3 now",
        "  CONFIG_ELITISM_SIZE: 1 when the run started, 2 now",
        f"  Set them back to resume this run; to start a fresh run with the new settings, choose another "
        f"CONFIG_OUTPUT_DIR (or move '{out}' away).",
    ]
    assert (out / "evolution_state.json").read_bytes() == state and answers(out) == stored

    allowed = write_config(tmp_path, shared, tiny_model_dir, NGEN="3", REFLECTOR_CONCURRENCY="2",
                           MAX_METRIC_CALLS="1000")
    code, err, printed = run_cli(["evolve", "--config", str(allowed)], capsys)
    assert code == 0, err
    assert "changed since the last start: CONFIG_NGEN: 2 -> 3: raised, the run goes on" in printed
    assert "changed since the last start: CONFIG_REFLECTOR_CONCURRENCY: 4 -> 2" in printed
    assert read_json(out / "evolution_state.json")["generation"] == 3


def test_a_changed_strategy_is_one_of_the_settings_refused(tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    shutil.copytree(uninterrupted, tmp_path / "out")
    config = write_config(tmp_path, shared, tiny_model_dir, STRATEGY_RANDOM="y")
    code, err, _ = run_cli(["evolve", "--config", str(config)], capsys)
    assert code == 2 and err[1:-1] == ["  CONFIG_STRATEGY_*: ga when the run started, random now"], err


def test_lowering_the_generations_below_those_run_stops_and_keeps_the_history(tmp_path, shared, tiny_model_dir,
                                                                             uninterrupted, capsys):
    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    history = (out / "history.json").read_bytes()
    config = write_config(tmp_path, shared, tiny_model_dir, NGEN="2")
    code, err, printed = run_cli(["evolve", "--config", str(config)], capsys)
    assert code == 0, err
    assert f"all {DEFAULT_NGEN} generations have run" in printed
    assert (out / "history.json").read_bytes() == history


def without_identity(out: Path) -> None:
    """The archive as a compressor_2 that recorded no identity left it."""
    with closing(sqlite3.connect(out / "run.sqlite")) as db, db:
        db.execute("DELETE FROM meta WHERE key = 'identity'")


def test_a_run_started_before_identities_were_recorded_resumes_and_is_compared_from_then_on(
        tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    without_identity(out)
    resumed = write_config(tmp_path, shared, tiny_model_dir, NGEN=str(DEFAULT_NGEN + 1))
    code, err, printed = run_cli(["evolve", "--config", str(resumed)], capsys)
    assert code == 0, err
    assert "did not record its settings; this config's are recorded now" in printed
    changed = write_config(tmp_path, shared, tiny_model_dir, NGEN=str(DEFAULT_NGEN + 2), SHORTNESS_SCALE='"20"')
    code, err, _ = run_cli(["evolve", "--config", str(changed)], capsys)
    assert code == 2 and err[1] == "  CONFIG_SHORTNESS_SCALE: 10.0 when the run started, 20.0 now", err


def test_a_run_started_before_identities_were_recorded_is_refused_when_what_it_recorded_changed(
        tmp_path, shared, tiny_model_dir, uninterrupted, capsys):
    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    without_identity(out)
    stored = answers(out)
    changed = write_config(tmp_path, shared, tiny_model_dir, NGEN=str(DEFAULT_NGEN + 1), MAX_NEW_TOKENS="9")
    code, err, _ = run_cli(["evolve", "--config", str(changed)], capsys)
    assert code == 2, err
    assert err[1].startswith("  the model, engine, clusters, CONFIG_MAX_NEW_TOKENS, CONFIG_TEMPERATURE, judge or "
                             "tolerance (recorded as one answer context): changed"), err
    assert answers(out) == stored
