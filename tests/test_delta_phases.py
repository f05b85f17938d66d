"""Issue AC, item 3, the search side: CONFIG_DELTA_PHASES makes a genome of P delta vectors,
one per answer phase, flat and phase-major. Its deltas files ({"phases": [...]}, a plain
map being the same vector in every phase) round trip and are refused in one line naming
the file; the run identity refuses a resume across a change of phases and writes nothing;
a one-phase run records and writes what it always did; both reflectors propose on
(phase, cluster) ids; and every strategy runs a two-phase evolution end to end, resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from compressor_2.cli import main
from compressor_2.clusters.tokens import AnswerTokens
from compressor_2.common import ConfigError
from compressor_2.deltas import (
    by_phase, canonical_ids, deltas_document, gene_ids, load_deltas, phase_count, split_gene, to_dict, to_list,
    visiting_order,
)
from compressor_2.fitness import Record
from compressor_2.reflector.base import MutationRequest, Reply, Usage, VectorRequest
from compressor_2.reflector.local import LocalProposer
from compressor_2.reflector.prompts import mutation_messages, vector_messages, vector_schema
from compressor_2.reflector.validation import ValidatingReflector, parse_vector
from compressor_2.resume.identity import changes, run_identity
from compressor_2.strategies.archive.ops import batch_target, issues_of
from compressor_2.findings.simpler import simpler_options
from tests.test_evolution_support import config_for, query, read_json, refused_resume, write_config

CLUSTERS = ["0", "1", "2", "10"]
DESCRIPTIONS = {"0": {"description": "EOS"}, "1": {"description": "numbers"}, "2": {"description": "words"}}


# -- the genome's ids and its deltas file ---------------------------------------------------

def test_genome_ids_are_the_cluster_ids_for_one_phase_and_phase_major_pairs_for_more():
    assert gene_ids(CLUSTERS, 1) == CLUSTERS
    genes = gene_ids(CLUSTERS, 2)
    assert genes == ["0:0", "0:1", "0:2", "0:10", "1:0", "1:1", "1:2", "1:10"]
    assert canonical_ids(reversed(genes)) == genes and canonical_ids(["10", "2", "0"]) == ["0", "2", "10"]
    assert [split_gene(g) for g in ("3", "2:10")] == [(0, "3"), (2, "10")]
    assert [phase_count(gene_ids(CLUSTERS, p)) for p in (1, 2, 3)] == [1, 2, 3]
    # Round robins visit a cluster's phases back to back; one phase keeps the canonical order.
    assert visiting_order(genes) == ["0:0", "1:0", "0:1", "1:1", "0:2", "1:2", "0:10", "1:10"]
    assert visiting_order(CLUSTERS) == CLUSTERS
    genome = to_dict([float(i) for i in range(8)], genes)
    assert to_list(genome) == [float(i) for i in range(8)]  # the flat P*K tuple an engine gets
    assert by_phase(genome) == [{"0": 0.0, "1": 1.0, "2": 2.0, "10": 3.0}, {"0": 4.0, "1": 5.0, "2": 6.0, "10": 7.0}]


def write(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_a_deltas_file_of_phases_round_trips(tmp_path):
    for phases in (2, 3):
        genome = to_dict([0.5 * i - 2 for i in range(4 * phases)], gene_ids(CLUSTERS, phases))
        document = deltas_document(genome)
        assert list(document) == ["phases"] and len(document["phases"]) == phases
        path = write(tmp_path / f"deltas_{phases}.json", document)
        assert load_deltas(path, CLUSTERS, phases) == genome
        assert load_deltas(path, CLUSTERS, None) == genome  # as many phases as the file holds


def test_one_phase_is_the_plain_map_and_a_plain_map_is_the_same_vector_in_every_phase(tmp_path):
    plain = {"0": 1.0, "1": -2.0, "2": 0.0, "10": 3.5}
    assert deltas_document(plain) == plain  # a one-phase genome never writes "phases"
    path = write(tmp_path / "plain.json", plain)
    assert load_deltas(path, CLUSTERS) == plain == load_deltas(path, CLUSTERS, None)
    assert to_list(load_deltas(path, CLUSTERS, 3)) == to_list(plain) * 3


@pytest.mark.parametrize("document, phases, message", [
    ({"phases": [{"0": 0, "1": 0, "2": 0, "10": 0}] * 2}, 1,
     "holds deltas for 2 answer phases, but CONFIG_DELTA_PHASES is 1: set it to 2, or give a plain "
     "{cluster id: float} map"),
    ({"phases": [{"0": 0, "1": 0, "2": 0, "10": 0}] * 2}, 3,
     "holds deltas for 2 answer phases, but CONFIG_DELTA_PHASES is 3: set it to 2, or give deltas for 3 phases"),
    ({"phases": [{"0": 0, "1": 0, "2": 0, "10": 0}]}, 2, "not a list of 2 to 3 JSON objects"),
    ({"phases": [{"0": 0, "1": 0, "2": 0, "10": 0}] * 4}, None, "not a list of 2 to 3 JSON objects"),
    ({"phases": {"0": 0}}, 2, "not a list of 2 to 3 JSON objects"),
    ({"phases": [{"0": 0, "1": 0, "2": 0, "10": 0}] * 2, "0": 1}, 2, 'holds "phases" and other keys (0)'),
    ({"phases": [{"0": 0, "1": 0, "2": 0, "10": 0}, {"0": 0, "1": 0, "2": 0}]}, 2,
     "phase 1: cluster id(s) 10 missing"),
    ({"phases": [{"0": 0, "1": 0, "2": 0, "10": 0}, {"0": 31, "1": 0, "2": 0, "10": 0}]}, 2,
     "phase 1: delta of cluster 0 is 31, outside [-30, 30]"),
    ({"phases": [{"0": 0, "1": "x", "2": 0, "10": 0}, {"0": 0, "1": 0, "2": 0, "10": 0}]}, 2,
     "phase 0: delta of cluster 1 is 'x', not a finite number"),
])
def test_a_deltas_file_of_other_phases_is_refused_in_one_line_naming_it(tmp_path, document, phases, message):
    path = write(tmp_path / "deltas.json", document)
    with pytest.raises(ConfigError) as refused:
        load_deltas(path, CLUSTERS, phases)
    text = str(refused.value)
    assert str(path) in text and message in text and "\n" not in text, text


# -- the run identity -----------------------------------------------------------------------

def identity(tmp_path: Path, shared: Path, model: Path, **symbols: str) -> dict[str, str]:
    from compressor_2.resume.identity import RunInputs

    config = config_for(tmp_path, shared, model, **symbols)
    return run_identity(config, RunInputs("digest", (), None, "the model"))


def test_a_one_phase_run_records_the_identity_it_always_did(tmp_path, shared, tiny_model_dir):
    today = identity(tmp_path, shared, tiny_model_dir, DELTA_PHASES=None)
    assert identity(tmp_path, shared, tiny_model_dir, DELTA_PHASES="1") == today
    assert not any("DELTA_PHASES" in name for name in today)
    assert changes(today, today) == ([], [])


@pytest.mark.parametrize("before, after", [("1", "2"), ("2", "1"), ("2", "3")])
def test_a_change_of_phases_is_a_changed_objective(tmp_path, shared, tiny_model_dir, before, after):
    refused, allowed = changes(identity(tmp_path, shared, tiny_model_dir, DELTA_PHASES=before),
                               identity(tmp_path, shared, tiny_model_dir, DELTA_PHASES=after))
    assert refused == [f"CONFIG_DELTA_PHASES: {before} when the run started, {after} now"] and allowed == []


def test_a_phase_count_out_of_range_is_refused(tmp_path, shared, tiny_model_dir):
    for value in ("0", "4"):
        with pytest.raises(ConfigError, match="DELTA_PHASES"):
            config_for(tmp_path, shared, tiny_model_dir, DELTA_PHASES=value)


@pytest.mark.slow
def test_a_resume_with_other_phases_is_refused_in_one_line_writing_nothing(tmp_path, shared, tiny_model_dir,
                                                                           uninterrupted, capsys):
    changed = refused_resume(tmp_path, shared, tiny_model_dir, uninterrupted, capsys, DELTA_PHASES="2")
    assert changed == ["  CONFIG_DELTA_PHASES: 1 when the run started, 2 now"], changed


@pytest.mark.slow
def test_a_one_phase_run_writes_a_plain_deltas_best(uninterrupted):
    best = read_json(uninterrupted / "deltas_best.json")
    assert "phases" not in best and all(isinstance(v, float) for v in best.values())
    assert canonical_ids(best) == list(best)


# -- the reflectors and the strategies' helpers on (phase, cluster) ids ---------------------

@pytest.fixture(scope="module")
def tokens(tiny_model_dir: Path) -> AnswerTokens:
    """Cluster 0: EOS; 1: tokens with a digit; 2: every other token."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    clusters = np.array([1 if any(ch.isdigit() for ch in tok) else 2 for tok in vocab], dtype=np.int64)
    clusters[tokenizer.eos_token_id] = 0
    return AnswerTokens(tokenizer, clusters, 3)


def records() -> list[Record]:
    return [Record("q0", "Q?", "The answer is 42, I hope this helps", "42", 12, True, "ok"),
            Record("q1", "Q?", "Revenue was 1,577 million", "5,363", 9, False, "wrong")]


GENES = gene_ids(["0", "1", "2"], 2)


def test_the_local_reflector_moves_a_phase_and_cluster_pair_deterministically(tokens):
    reflector = ValidatingReflector(LocalProposer(tokens, initial_step=1.0, seed=7), DESCRIPTIONS, 100)
    deltas = dict.fromkeys(GENES, 0.0)
    request = MutationRequest(3, 1, "1:0", deltas, "", 0.5, records())
    first, again = reflector.mutate(request), reflector.mutate(request)
    assert first.delta == again.delta and first.scratchpad == again.scratchpad
    assert 0.8 <= first.delta <= 1.25  # EOS goes up in phase 1 too: no answer is cut short
    assert "g3: moved cluster 1:0 up from 0.0000" in first.scratchpad
    # The lineage's memory is per pair: the next move reads this one's outcome.
    later = reflector.mutate(MutationRequest(4, 1, "1:2", {**deltas, "1:0": first.delta}, first.scratchpad,
                                             0.6, records()))
    assert "g4: moving cluster 1:0 up paid off" in later.scratchpad
    other = reflector.mutate(MutationRequest(3, 1, "0:0", deltas, "", 0.5, records()))
    assert "moved cluster 0:0" in other.scratchpad


def test_the_local_full_vector_move_moves_eos_in_every_phase(tokens):
    reflector = ValidatingReflector(LocalProposer(tokens, initial_step=1.0, seed=7), DESCRIPTIONS, 100)
    result = reflector.mutate_vector(VectorRequest(2, 0, dict.fromkeys(GENES, 0.0), "", 0.5, records()))
    assert result.changed and set(result.deltas) == set(GENES)
    moved = {g for g, v in result.deltas.items() if v != 0.0}
    assert {"0:0", "1:0"} <= moved and len(moved) == 4  # EOS in both phases and the two strongest others


def test_the_openai_prompts_show_the_deltas_by_phase_and_the_reply_takes_the_larger_genome():
    deltas = to_dict([0.0, 1.0, 0.0, 0.0, -1.0, 2.0], GENES)
    [_, user] = mutation_messages(MutationRequest(1, 0, "1:2", deltas, "", 0.5, records()), DESCRIPTIONS, 100)
    text = user["content"]
    assert "## Answer phases" in text and '"1:0" is cluster 0 in phase 1' in text
    assert "- phase 1: after the first figure" in text
    shown = json.loads(text.split("## Current delta vector\n")[1].split("\n\n## ")[0])
    assert shown == {"phase 0": {"0:0": 0.0, "0:1": 1.0, "0:2": 0.0}, "phase 1": {"1:0": 0.0, "1:1": -1.0, "1:2": 2.0}}
    assert "## Target cluster to mutate (must change)\n1:2\n" in text
    [_, vector_user] = vector_messages(VectorRequest(1, 0, deltas, "", 0.5, records()), DESCRIPTIONS, 100)
    assert "## Answer phases" in vector_user["content"]
    assert vector_schema(GENES)["properties"]["deltas"]["required"] == GENES
    reply = json.dumps({"deltas": {g: 0.5 for g in GENES}, "summary": "s"})
    assert parse_vector(Reply(reply, Usage()), deltas) == (dict.fromkeys(GENES, 0.5), "s")
    # One phase: the seeds' prompts, verbatim.
    plain = {"0": 0.0, "1": 1.0, "2": 0.0}
    [_, one] = mutation_messages(MutationRequest(1, 0, "2", plain, "", 0.5, records()), DESCRIPTIONS, 100)
    assert "phase" not in one["content"] and json.dumps(plain, indent=2) in one["content"]


def test_the_archive_issues_name_a_phase_and_the_eos_bias_alone_is_in_every_phase(tokens, tmp_path, shared,
                                                                                    tiny_model_dir):
    found = issues_of(records(), {"q0": 1, "q1": 5}, lambda r: [0, 0, 4], GENES)
    assert [(i.type, i.cluster) for i in found] == [("padded", "1:2"), ("wrong", "0:1")]
    assert batch_target([], GENES) == "1:0" and batch_target([]) == "0"
    config = config_for(tmp_path, shared, tiny_model_dir, COMPARE_SIMPLE="y", DELTA_PHASES="2")
    assert simpler_options(config, GENES, tokens).eos_indices == (0, 3)
    assert simpler_options(config, ["0", "1", "2"], tokens).eos_indices == (0,)


# -- two-phase evolutions, end to end -------------------------------------------------------

TWO_PHASES = {"DELTA_PHASES": "2", "NGEN": "2"}
STRATEGIES = {
    "ga": {},
    "random": {"STRATEGY_RANDOM": "y", "RANDOM_BATCHES": "2", "RANDOM_BATCH_SIZE": "2"},
    "cmaes": {"STRATEGY_CMAES": "y", "CMAES_GENERATIONS": "2", "CMAES_POPULATION": "2"},
    "archive": {"STRATEGY_ARCHIVE": "y", "ARCHIVE_ITERATIONS": "2", "ARCHIVE_PARENTS_PER_ITERATION": "1"},
    "gepa": {"STRATEGY_GEPA": "y", "MAX_METRIC_CALLS": "30", "GEPA_VALSET_SIZE": "2", "GEPA_MINIBATCH_SIZE": "1",
             "GEPA_VAL_OVERLAP_FLOOR": "1", "GEPA_MERGE_SUBSAMPLE": "2"},
}


def two_phase_best(out: Path, clusters: list[str]) -> dict[str, object]:
    best = read_json(out / "deltas_best.json")
    assert list(best) == ["phases"] and [list(m) for m in best["phases"]] == [clusters, clusters], best
    return best


@pytest.mark.slow
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_evolves_two_phases(strategy, tmp_path, shared, tiny_model_dir):
    from compressor_2.commands.evolve import evolve

    config = config_for(tmp_path, shared, tiny_model_dir, **TWO_PHASES, **STRATEGIES[strategy])
    evolve(config)
    clusters = list(read_json(shared / "clusters" / "cluster_descriptions.json"))
    two_phase_best(config.output_dir, canonical_ids(clusters))
    assert (config.output_dir / "processor_best.py").is_file()


@pytest.mark.slow
def test_a_two_phase_random_search_resumed_ends_as_an_uninterrupted_one(tmp_path, shared, tiny_model_dir):
    from tests.test_evolution_support import whole_and_resumed

    symbols = {**TWO_PHASES, **STRATEGIES["random"]}
    whole, split = whole_and_resumed(tmp_path, shared, tiny_model_dir, symbols, {"RANDOM_BATCHES": "1"})
    assert read_json(whole / "deltas_best.json") == read_json(split / "deltas_best.json")
    assert read_json(whole / "random_state.json") == read_json(split / "random_state.json")
    genomes = query(split, "SELECT deltas FROM candidates")
    assert len(genomes) == 5 and all(len(json.loads(g)) == 2 * len(read_json(shared / "clusters" /
                                                                            "cluster_descriptions.json"))
                                     for (g,) in genomes)


@pytest.mark.slow
def test_a_two_phase_ga_run_resumed_ends_as_an_uninterrupted_one_and_its_files_read_back(
        tmp_path, shared, tiny_model_dir, capsys):
    from tests.test_evolution_support import whole_and_resumed

    whole, split = whole_and_resumed(tmp_path, shared, tiny_model_dir, TWO_PHASES, {"NGEN": "1"})
    assert read_json(whole / "deltas_best.json") == read_json(split / "deltas_best.json")
    assert read_json(whole / "evolution_state.json") == read_json(split / "evolution_state.json")
    clusters = canonical_ids(read_json(shared / "clusters" / "cluster_descriptions.json"))
    best = two_phase_best(split, clusters)
    # The round robin reaches EOS in phase 1 second: a cluster's phases back to back.
    notes = [scratchpad for (scratchpad,) in query(split, "SELECT scratchpad FROM candidates")]
    assert any("moved cluster 1:0" in note for note in notes), notes
    # Every reader takes the file: evaluate --deltas, generate-processor, export, show.
    config = write_config(tmp_path / "split", shared, tiny_model_dir, **TWO_PHASES)
    report = tmp_path / "evaluation.json"
    assert main(["evaluate", "--config", str(config), "--deltas", str(split / "deltas_best.json"),
                 "--out", str(report)]) == 0
    assert read_json(report)["deltas"] == best
    assert main(["show", "--config", str(config), "1"]) == 0
    assert "deltas, phase 1: " in capsys.readouterr().out
    assert main(["export", "--config", str(config), "--max-correctness-drop", "1", "--out",
                 str(tmp_path / "deltas_export.json")]) == 0
    assert list(read_json(tmp_path / "deltas_export.json")) == ["phases"]
    assert (tmp_path / "processor_export.py").is_file()
    capsys.readouterr()
    one_phase = write_config(tmp_path, shared, tiny_model_dir)
    assert main(["evaluate", "--config", str(one_phase), "--deltas", str(split / "deltas_best.json")]) == 2
    assert "holds deltas for 2 answer phases, but CONFIG_DELTA_PHASES is 1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_two_phase_run_with_the_openai_reflector_reads_and_proposes_every_pair(tmp_path, shared, tiny_model_dir,
                                                                                  monkeypatch):
    from compressor_2.commands.evolve import evolve
    from tests.fakes.openai_server import FakeOpenAIServer, chat_completion

    monkeypatch.setenv("C2_TEST_REFLECTOR_KEY", "sk-phases")
    asked: list[list[str]] = []

    def answer(body: dict) -> tuple[int, object]:
        fmt, user = body["response_format"]["json_schema"], body["messages"][1]["content"]
        if fmt["name"] != "reflector_vector":
            return 200, chat_completion('{"scratchpad": "merged"}')
        shown = json.loads(user.split("(baseline to adjust from)\n")[1].split("\n\n## Evolving")[0])
        assert list(shown) == ["phase 0", "phase 1"] and "## Answer phases" in user
        current = {gene: value for phase in shown.values() for gene, value in phase.items()}
        asked.append(fmt["schema"]["properties"]["deltas"]["required"])
        # EOS up after the first figure only: what the search could not say with one vector.
        return 200, chat_completion(json.dumps({"deltas": {**current, "1:0": current["1:0"] + 1.0}, "summary": "s"}))

    with FakeOpenAIServer(answer) as server:
        config = config_for(tmp_path, shared, tiny_model_dir, **TWO_PHASES, REFLECTOR_OPENAI="y",
                            REFLECTOR_BASE_URL=f'"{server.base_url}"', REFLECTOR_API_KEY_ENV='"C2_TEST_REFLECTOR_KEY"',
                            REFLECTOR_MAX_RETRIES="0", MUTPB='"1"', MUTATION_SCOPE='"vector"')
        evolve(config)
    clusters = canonical_ids(read_json(shared / "clusters" / "cluster_descriptions.json"))
    assert asked and all(ids == gene_ids(clusters, 2) for ids in asked)
    states = read_json(config.output_dir / "evolution_state.json")["population"]
    assert any(m["deltas"]["1:0"] > 0 and m["deltas"]["0:0"] == 0 for m in states)
