"""Shared set-up for the evolution tests (no tests here): a tiny training set in the
FinanceBench shape and a `.config` for the tiny model, its clusters built once per session."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from compressor_2.config import Config, load_config

ROWS = [
    {"financebench_id": "fb-a", "question": "What was revenue in FY2018?", "answer": "$1,577 million",
     "evidence": [{"evidence_text_full_page": "Revenue was $1,577 million in FY2018."}]},
    {"financebench_id": "fb-b", "question": "Did capital expenditure exceed $2,000 million?", "answer": "No",
     "evidence": [{"evidence_text_full_page": "Capital expenditure was $1,200 million."}]},
    {"financebench_id": "fb-c", "question": "What was net income?", "answer": "5,363 million",
     "evidence": [{"evidence_text_full_page": "Net income was 5,363 million dollars."}]},
]

DEFAULT_NGEN = 4
GA_DEFAULTS = {
    "POPULATION_SIZE": "4", "NGEN": str(DEFAULT_NGEN), "CXPB": '"0.5"', "MUTPB": '"0.8"', "ELITISM_SIZE": "1",
    "SELECTION": '"tournament"', "TOURNAMENT_SIZE": "2",
}


def write_config(work: Path, shared: Path, model_dir: Path, **overrides: str | None) -> Path:
    """A .config in `work` (output dir `work/out`) whose cluster artifacts live in `shared`,
    so every test of a session reuses one cluster build. `overrides` are raw Kconfig
    values by symbol name without CONFIG_, e.g. NGEN="4", CXPB='"0"'; None leaves a symbol out."""
    data = shared / "train.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    symbols = {
        "OUTPUT_DIR": f'"{work / "out"}"',
        "CLUSTER_DIR": f'"{shared / "clusters"}"',
        "CLUSTER_DESCRIPTIONS_PATH": f'"{shared / "clusters" / "cluster_descriptions.json"}"',
        "INITIAL_DELTAS_PATH": f'"{shared / "clusters" / "initial_deltas.json"}"',
        "FINANCEBENCH_JSONL_PATH": f'"{data}"',
        "MODEL_PATH": f'"{model_dir}"',
        "MAX_NEW_TOKENS": "8",
        "TRANSFORMERS_DEVICE": '"cpu"',
        "NUM_CLUSTERS": "3",
        "PCA_COMPONENTS": "8",
        "LAMBDA_SHORTNESS": '"0.5"',
        "LAMBDA_CORRECTNESS": '"0.5"',
        "SHORTNESS_SCALE": '"10"',
        # The simpler tools have their own tests (test_simpler.py): off here, every other run
        # ends as it did without them.
        "COMPARE_SIMPLE": "n",
        **GA_DEFAULTS,
        **overrides,
    }
    path = work / "test.config"
    path.write_text("".join(f"CONFIG_{name}={value}\n" for name, value in symbols.items() if value is not None))
    return path


def config_for(work: Path, shared: Path, model_dir: Path, **overrides: str | None) -> Config:
    return load_config(write_config(work, shared, model_dir, **overrides))


def shared_dir(tmp_path_factory) -> Path:
    """One folder per test session for the training file and the cluster artifacts."""
    path = tmp_path_factory.getbasetemp() / "evolution_shared"
    path.mkdir(exist_ok=True)
    return path


def whole_and_resumed(tmp_path: Path, shared: Path, model_dir: Path, symbols: dict[str, str],
                      first_leg: dict[str, str]) -> tuple[Path, Path]:
    """The output dirs of one run with `symbols` made at once, and of the same run made in
    two legs: first with `first_leg` overriding `symbols` (fewer steps, a smaller budget),
    then resumed with `symbols`."""
    from compressor_2.commands.evolve import evolve

    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir()
    split.mkdir()
    evolve(config_for(whole, shared, model_dir, **symbols))
    evolve(config_for(split, shared, model_dir, **{**symbols, **first_leg}))
    evolve(config_for(split, shared, model_dir, **symbols))
    return whole / "out", split / "out"


def interrupted(work: Path, shared: Path, model_dir: Path, symbols: dict[str, str], step: int,
                monkeypatch, at: tuple[object, str, Callable[..., bool]] | None = None) -> None:
    """A run with `symbols` in `work` that Ctrl+C stops inside step `step`. The interrupt is
    raised by a local mutation call of that step, or by the call `at` names: (class,
    method, whether these arguments interrupt)."""
    import pytest

    from compressor_2.commands.evolve import evolve
    from compressor_2.reflector.local import LocalProposer

    owner, name, fires = at or (LocalProposer, "mutation", lambda _self, request, *_: request.generation == step)
    original = getattr(owner, name)

    def interrupt(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the patched method's signature
        if fires(*args, **kwargs):
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupt)
    with pytest.raises(KeyboardInterrupt):
        evolve(config_for(work, shared, model_dir, **symbols))
    monkeypatch.setattr(owner, name, original)


def interrupted_then_resumed(work: Path, shared: Path, model_dir: Path, symbols: dict[str, str], step: int,
                             monkeypatch, at: tuple[object, str, Callable[..., bool]] | None = None) -> None:
    """`interrupted`, then the same command rerun to its end."""
    from compressor_2.commands.evolve import evolve

    interrupted(work, shared, model_dir, symbols, step, monkeypatch, at)
    evolve(config_for(work, shared, model_dir, **symbols))


def query(out: Path, sql: str) -> list[tuple]:
    """Rows of a run's archive (`out` is its output directory)."""
    import sqlite3

    with sqlite3.connect(out / "run.sqlite") as db:
        return db.execute(sql).fetchall()


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def default_run(tmp_path_factory, shared: Path, model_dir: Path) -> Path:
    """The output dir of one uninterrupted 4-generation run with GA_DEFAULTS, made once per
    session and shared by the test modules (which only read it)."""
    from compressor_2.commands.evolve import evolve

    work = tmp_path_factory.getbasetemp() / "default_run"
    if not (work / "done").exists():
        work.mkdir(exist_ok=True)
        evolve(config_for(work, shared, model_dir, NGEN=str(DEFAULT_NGEN)))
        (work / "done").touch()
    return work / "out"


def files_of(out: Path) -> dict[str, bytes]:
    """Every file under `out`, by relative path, with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def refused_resume(tmp_path: Path, shared: Path, model_dir: Path, finished: Path, capsys, **symbols: str) -> list[str]:
    """A copy of the finished run `finished` resumed with `symbols`: refused (exit 2), every
    file as it was; returns the lines naming the changed settings."""
    import shutil

    from compressor_2.cli import main

    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = files_of(out)
    config = write_config(tmp_path, shared, model_dir, **symbols)
    capsys.readouterr()
    assert main(["evolve", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"error: '{out / 'run.sqlite'}' holds a run started with other settings"), err
    assert files_of(out) == before
    return err[1:-1]
