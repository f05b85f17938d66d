"""`evolve` end to end on the real stack: the transformers engine on a tiny random GPT-2,
clusters built with MiniLM, the numeric judge, the local reflector."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

from compressor_2.archive import RunArchive
from compressor_2.commands.evolve import evolve
from compressor_2.common.errors import ConfigError
from compressor_2.deltas import load_deltas
from tests.fakes.openai_server import FakeOpenAIServer, chat_completion
from tests.test_evolution_support import DEFAULT_NGEN, config_for, read_json

pytestmark = pytest.mark.slow

STATE_KEYS = {"generation", "population", "best_individual", "best_fitness", "rr_idx", "rng", "last_candidate_id"}
PNG = b"\x89PNG\r\n\x1a\n"


def run_evolve(tmp_path: Path, shared: Path, model: Path, **overrides: str) -> Path:
    config = config_for(tmp_path, shared, model, **overrides)
    evolve(config)
    return config.output_dir


def tree_of(out: Path) -> nx.DiGraph:
    return nx.node_link_graph(read_json(out / "tree.json"), edges="edges")


def test_a_run_writes_every_output(uninterrupted: Path, shared: Path):
    """The shared run: population 4, elitism 1, 4 generations, CXPB 0.5, MUTPB 0.8, tournament of 2."""
    out = uninterrupted
    state = read_json(out / "evolution_state.json")
    assert set(state) == STATE_KEYS
    ids = sorted(read_json(shared / "clusters" / "cluster_descriptions.json"), key=int)
    assert state["generation"] == DEFAULT_NGEN and len(state["population"]) == 4
    for member in state["population"] + [state["best_individual"]]:
        assert list(member["deltas"]) == ids and isinstance(member["scratchpad"], str)
        assert 1 <= member["candidate_id"] <= state["last_candidate_id"]
    assert load_deltas(out / "deltas_best.json", ids) == state["best_individual"]["deltas"]
    assert "class" in (out / "processor_best.py").read_text()
    for png in ("fitness_vs_generation.png", "evolution_lengths.png", "evolution_tree.png"):
        assert (out / png).read_bytes().startswith(PNG)
    history = read_json(out / "history.json")
    assert [h["generation"] for h in history] == list(range(DEFAULT_NGEN + 1))
    assert state["best_fitness"] == max(h["best_ever_fitness"] for h in history) == history[-1]["best_ever_fitness"]
    # The local reflector's first move raises EOS, which shortens the random model's answers.
    assert state["best_fitness"] > history[0]["best_fitness"]
    assert history[-1]["mean_tokens"] < history[0]["mean_tokens"]


def test_the_counts_of_seed_section_1(uninterrupted: Path):
    history = read_json(uninterrupted / "history.json")
    tree = tree_of(uninterrupted)
    for h in history[:-1]:
        g = h["generation"]
        assert h["children"] == 3 and h["parents"] == 6 and h["crossovers"] + h["clones"] == 3
        # Every child is evaluated once, and once more when a mutation changed it.
        first_evaluation = 4 if g == 0 else 0
        assert h["evaluations_run"] + h["cache_hits"] == first_evaluation + h["children"] + h["mutations"]
        pre = [n for n, d in tree.nodes(data=True) if d["generation"] == g and d["stage"] == "pre"]
        mut = [n for n, d in tree.nodes(data=True) if d["generation"] == g and d["stage"] == "mut"]
        assert sorted(pre) == [f"g{g}_child{j}_pre" for j in range(3)]
        assert len(mut) == h["mutations"]
        assert h["reflector_calls"] >= h["crossovers"] + h["mutations"] + h["mutations_skipped"]
    prompts = uninterrupted / "reflector_prompts"
    assert len(list(prompts.glob("gen_*_merge_*_attempt1.txt"))) == sum(h["crossovers"] for h in history)
    mutate_calls = sum(h["mutations"] + h["mutations_skipped"] for h in history)
    assert len(list(prompts.glob("gen_*_mutation_*_attempt1.txt"))) == mutate_calls
    # The round robin advanced once per mutate call.
    n_clusters = len(read_json(uninterrupted / "evolution_state.json")["population"][0]["deltas"])
    assert read_json(uninterrupted / "evolution_state.json")["rr_idx"] == mutate_calls % n_clusters


def test_tree_node_ids_and_edges(uninterrupted: Path):
    tree = tree_of(uninterrupted)
    history = read_json(uninterrupted / "history.json")
    for g in range(DEFAULT_NGEN):
        pops = {f"g{g}_pop{i}" for i in range(4)}
        assert pops <= set(tree)
        for j in range(3):
            pre = f"g{g}_child{j}_pre"
            parents = [u for u, _, d in tree.in_edges(pre, data=True)]
            assert all(tree.edges[u, pre]["kind"] == "parent" for u in parents)
            assert 1 <= len(parents) <= 2 and set(parents) <= pops
            mut = f"g{g}_child{j}_mut"
            if mut in tree:
                assert list(tree.in_edges(mut)) == [(pre, mut)] and tree.edges[pre, mut]["kind"] == "mutation"
            final = mut if mut in tree else pre
            # Child j takes place 1 + j of the next population (the elite is place 0).
            assert list(tree.successors(final)) == [f"g{g + 1}_pop{1 + j}"]
            assert tree.edges[final, f"g{g + 1}_pop{1 + j}"]["kind"] == "carry"
        (elite,) = list(tree.predecessors(f"g{g + 1}_pop0"))
        assert elite in pops
        assert tree.nodes[elite]["fitness"] == history[g]["best_fitness"]
    assert all(d["kind"] in {"parent", "mutation", "carry"} for _, _, d in tree.edges(data=True))


def test_clones_are_served_from_the_cache(tmp_path, shared, tiny_model_dir):
    out = run_evolve(tmp_path, shared, tiny_model_dir, NGEN="2", CXPB='"0"', MUTPB='"0"')
    history = read_json(out / "history.json")
    # Four identical initial genomes: one generation run; every child is a cached clone.
    assert (history[0]["evaluations_run"], history[0]["cache_hits"]) == (1, 3 + 3)
    assert (history[1]["evaluations_run"], history[1]["cache_hits"]) == (0, 3)
    assert all(h["clones"] == h["children"] for h in history[:-1])
    assert not (out / "reflector_prompts").exists()
    state = read_json(out / "evolution_state.json")
    assert all(m["scratchpad"] == "" and set(m["deltas"].values()) == {0.0} for m in state["population"])


def test_mutated_children_are_evaluated_twice(tmp_path, shared, tiny_model_dir):
    out = run_evolve(tmp_path, shared, tiny_model_dir, NGEN="2", CXPB='"0"', MUTPB='"1"',
                     SELECTION='"truncation"', TRUNCATION_TOP_K="2", TOURNAMENT_SIZE="-1")
    history = read_json(out / "history.json")
    for h in history[:-1]:
        assert h["mutations"] + h["mutations_skipped"] == h["children"] == 3
        first_evaluation = 4 if h["generation"] == 0 else 0
        assert h["evaluations_run"] + h["cache_hits"] == first_evaluation + 3 + h["mutations"]
    assert sum(h["mutations"] for h in history) > 0


def test_a_rerun_after_the_last_generation_changes_nothing(uninterrupted: Path, shared, tiny_model_dir, capsys):
    before = (uninterrupted / "evolution_state.json").read_bytes()
    evolve(config_for(uninterrupted.parent, shared, tiny_model_dir))
    out = capsys.readouterr().out
    assert f"all {DEFAULT_NGEN} generations have run" in out
    best = read_json(uninterrupted / "evolution_state.json")["best_individual"]["candidate_id"]
    assert "best fitness" in out and f"(candidate {best})" in out and "nothing evaluated" not in out
    assert (uninterrupted / "evolution_state.json").read_bytes() == before


def test_an_unreadable_state_is_an_error_not_a_fresh_start(tmp_path, shared, tiny_model_dir):
    config = config_for(tmp_path, shared, tiny_model_dir)
    RunArchive.open(config.output_dir / "run.sqlite").close()
    (config.output_dir / "evolution_state.json").write_text('{"generation": 1, "population": [')
    with pytest.raises(ConfigError, match="evolution_state.json' cannot be read"):
        evolve(config)
    assert (config.output_dir / "evolution_state.json").read_text() == '{"generation": 1, "population": ['
    assert not (config.output_dir / "history.json").exists()


def test_a_run_with_the_openai_reflector_writes_no_key(tmp_path, shared, tiny_model_dir, monkeypatch):
    key = "sk-evolve-SECRET-777"
    monkeypatch.setenv("C2_TEST_REFLECTOR_KEY", key)
    calls = []

    def answer(body: dict) -> tuple[int, object]:
        calls.append(body)
        if "delta" in body["response_format"]["json_schema"]["schema"]["properties"]:
            return 200, chat_completion(json.dumps({"delta": 0.25 * len(calls), "scratchpad": f"note {len(calls)}"}),
                                        prompt_tokens=100, completion_tokens=10)
        return 200, chat_completion('{"scratchpad": "merged"}', prompt_tokens=50, completion_tokens=5)

    with FakeOpenAIServer(answer) as server:
        out = run_evolve(tmp_path, shared, tiny_model_dir, NGEN="2", REFLECTOR_OPENAI="y",
                         REFLECTOR_BASE_URL=f'"{server.base_url}"', REFLECTOR_MODEL='"fake-reflector"',
                         REFLECTOR_API_KEY_ENV='"C2_TEST_REFLECTOR_KEY"', REFLECTOR_MAX_RETRIES="0")
    history = read_json(out / "history.json")
    assert sum(h["reflector_calls"] for h in history) == len(calls) > 0
    assert sum(h["reflector_prompt_tokens"] for h in history) == sum(
        100 if "delta" in c["response_format"]["json_schema"]["schema"]["properties"] else 50 for c in calls)
    assert all(c["model"] == "fake-reflector" for c in calls)
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(list((out / "reflector_prompts").iterdir())) == len(calls)
    for path in written:
        assert key.encode() not in path.read_bytes(), path


def test_a_run_killed_after_its_last_state_finishes_its_outputs_on_rerun(tmp_path, shared, tiny_model_dir,
                                                                          uninterrupted):
    """kill -9 between the last state save and the last plots: the rerun adds the stop
    reason and draws the plots and the tree again."""
    import shutil

    work = tmp_path / "copy"
    shutil.copytree(uninterrupted.parent, work)
    out = work / "out"
    history = read_json(out / "history.json")
    del history[-1]["stop_reason"]
    (out / "history.json").write_text(json.dumps(history))
    for png in ("fitness_vs_generation.png", "evolution_lengths.png", "evolution_tree.png"):
        (out / png).unlink()
    evolve(config_for(work, shared, tiny_model_dir))
    assert read_json(out / "history.json")[-1]["stop_reason"] == f"all {DEFAULT_NGEN} generations ran"
    for png in ("fitness_vs_generation.png", "evolution_lengths.png", "evolution_tree.png"):
        assert (out / png).read_bytes().startswith(PNG)


@pytest.mark.slow
def test_a_run_prints_no_spurious_attention_mask_warning(tmp_path, shared, tiny_model_dir):
    """One GA generation as a user runs it, in its own process (transformers warns once per
    process). With TRANSFORMERS_BATCH_SIZE=3 each batch of the mutated children is one
    question for 3 genomes: no padding, so transformers drops the all-ones mask, and the
    rows stop at different steps, as in the demo's `make run`; the engine passes the mask,
    so transformers' "We strongly recommend passing in an `attention_mask`" is spurious."""
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.test_evolution_support import write_config

    config = write_config(tmp_path, shared, tiny_model_dir, NGEN="1", TRANSFORMERS_BATCH_SIZE="3")
    done = subprocess.run([sys.executable, "-m", "compressor_2", "evolve", "--config", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith("done: all 1 generations ran")
    assert "attention_mask" not in done.stderr
