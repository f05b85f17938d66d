"""Clusters by role (CONFIG_ROLE_CLUSTERS, compressor_2/clusters/roles.py): the rule, a build on a
tokenizer the test makes, the build digest, and a resume with other roles refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from compressor_2.cli import main
from compressor_2.clusters.builder import build_clusters
from compressor_2.clusters.clusterset import ArtifactPaths, config_inputs, load_cluster_set, read_build_record
from compressor_2.clusters.roles import FIRST_ROLE_ID, ROLES, cluster_count, role_ids, role_of
from compressor_2.common import ConfigError
from tests.cluster_helpers import cluster_config
from tests.test_evolution_support import DEFAULT_NGEN, write_config

LINE_BREAKS, MARKUP, SENTENCE_ENDS, CLAUSE = range(len(ROLES))
# Each role's examples as docs/clusters.md lists them, and tokens in no role.
EXPECTED = {
    LINE_BREAKS: ["\n", "\n\n", " \n", "\r\n", ".\n", ":\n\n", "**\n", "\n   "],
    MARKUP: ["**", "###", "|", "---", "•", "**:", "__", "`", " **", "–", "==", "|-"],
    SENTENCE_ENDS: [".", "...", "?", "!", ".)", '."', " .", "…", ").", ".,"],
    CLAUSE: [",", ":", ";", "(", ")", '"', "'", " (", "),", "”", "’"],
    None: ["the", " the", "\nThe", "1", " $", "$", " ", "  ", "", "©", "°", "A.", "\n1"],
}
# Numbers by cluster 1's rule, which a build applies first; alone, the role rule would take them.
NUMBERS = ["%", "-", "*", "+", "=", "\n-"]


@pytest.mark.parametrize(("text", "role"), [(t, r) for r, texts in EXPECTED.items() for t in texts])
def test_each_token_text_falls_in_its_documented_role(text: str, role: int | None) -> None:
    assert role_of(text) == role


def test_numbers_pass_a_role_rule_but_a_build_gives_them_cluster_1_first() -> None:
    assert [role_of(t) for t in NUMBERS] == [CLAUSE, MARKUP, MARKUP, MARKUP, MARKUP, LINE_BREAKS]


def test_the_role_ids_follow_the_numbers_and_come_before_k_means() -> None:
    assert role_ids() == ["2", "3", "4", "5"] and FIRST_ROLE_ID == 2
    assert [r.name for r in ROLES] == ["line breaks", "markup", "sentence ends", "clause punctuation"]


WORDS = ["revenue", "margin", "profit", "assets", "income", "costs", "cash", "debt", "equity", "growth",
         "the", "was", "and", "of", "in", "to", "a", "is", "for", "on"]
VOCAB = ["<|endoftext|>", "<pad>", "1", "2", "$", *NUMBERS, " "] + WORDS + [
    t for role in (LINE_BREAKS, MARKUP, SENTENCE_ENDS, CLAUSE) for t in EXPECTED[role]]


def make_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer with exactly VOCAB: one token per listed text."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({text: i for i, text in enumerate(VOCAB)}, unk_token="<pad>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<pad>").save_pretrained(
        directory)
    return directory


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """The made tokenizer's clusters with roles and without, in two folders."""
    work = tmp_path_factory.mktemp("roles")
    model = make_tokenizer(work / "tokenizer")
    for name, flag in (("with", True), ("without", False)):
        (work / name).mkdir()
        build_clusters(cluster_config(work / name, model, ROLE_CLUSTERS=flag, NUM_CLUSTERS=3, PCA_COMPONENTS=4))
    return work, model


def test_a_build_with_roles_puts_each_listed_token_in_its_role_and_the_rest_in_k_means(built, capsys) -> None:
    work, model = built
    config = cluster_config(work / "with", model, ROLE_CLUSTERS=True, NUM_CLUSTERS=3, PCA_COMPONENTS=4)
    clusters = load_cluster_set(config)
    assert clusters.cluster_ids == tuple(str(i) for i in range(cluster_count(config))) and cluster_count(config) == 9
    where = {text: int(clusters.token_clusters[i]) for i, text in enumerate(VOCAB)}
    for role in (LINE_BREAKS, MARKUP, SENTENCE_ENDS, CLAUSE):
        assert {t: where[t] for t in EXPECTED[role]} == {t: FIRST_ROLE_ID + role for t in EXPECTED[role]}
    assert where["<|endoftext|>"] == 0 and {where[t] for t in ("1", "2", "$", *NUMBERS)} == {1}
    assert {where[t] for t in [*WORDS, " "]} <= {6, 7, 8}  # k-means, after the roles
    for role in (LINE_BREAKS, MARKUP, SENTENCE_ENDS, CLAUSE):
        entry = clusters.descriptions[str(FIRST_ROLE_ID + role)]
        assert entry["description"] == ROLES[role].description and entry["size"] == len(EXPECTED[role])
        assert entry["tokens"] == EXPECTED[role]
    assert clusters.descriptions["6"]["description"].startswith("k-means cluster of")


def test_without_roles_the_build_is_todays(built) -> None:
    work, model = built
    config = cluster_config(work / "without", model, ROLE_CLUSTERS=False, NUM_CLUSTERS=3, PCA_COMPONENTS=4)
    # The build digest's inputs are what they were before the option: nothing records it.
    assert set(config_inputs(config)) == {"format", "rules", "embedding_model", "pca_components", "num_clusters",
                                          "seed"}
    clusters = load_cluster_set(config)
    assert clusters.cluster_ids == ("0", "1", "2", "3", "4")
    assert set(np.unique(clusters.token_clusters[2:])) <= {1, 2, 3, 4}
    record = read_build_record(ArtifactPaths.from_config(config))
    assert record is not None and "roles" not in record["inputs"]


def test_a_set_built_with_other_roles_is_refused_and_rebuilt_by_name(built) -> None:
    work, model = built
    with_roles = cluster_config(work / "with", model, name="other.config", ROLE_CLUSTERS=False, NUM_CLUSTERS=3,
                                PCA_COMPONENTS=4)
    with pytest.raises(ConfigError, match="CONFIG_ROLE_CLUSTERS is n but the clusters were built with "
                                          r"'y \(role rules 1\)'"):
        load_cluster_set(with_roles)
    without = cluster_config(work / "without", model, name="other.config", ROLE_CLUSTERS=True, NUM_CLUSTERS=3,
                             PCA_COMPONENTS=4)
    with pytest.raises(ConfigError, match=r"CONFIG_ROLE_CLUSTERS is 'y \(role rules 1\)' but the clusters were "
                                          "built with n"):
        load_cluster_set(without)


def test_a_resume_with_other_roles_is_refused_in_one_line_writing_nothing(tmp_path, shared, tiny_model_dir,
                                                                          uninterrupted, capsys) -> None:
    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    record = (shared / "clusters" / "fingerprint.json").read_bytes()
    config = write_config(tmp_path, shared, tiny_model_dir, NGEN=str(DEFAULT_NGEN + 1), ROLE_CLUSTERS="y")
    capsys.readouterr()
    assert main(["evolve", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"error: '{out / 'run.sqlite'}' holds a run started with other settings")
    assert err[1:-1] == ["  CONFIG_ROLE_CLUSTERS: n when the run started, y now"]
    after = {p.relative_to(tmp_path): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and (shared / "clusters" / "fingerprint.json").read_bytes() == record
    assert json.loads(record)["inputs"].get("roles") is None
