"""Issue K, item 3: deltas are never applied to clusters they were not evolved on. The
clusters have their own seed; every deltas_best.json records its cluster map in a
sidecar that `evaluate` and `generate-processor` check; a copied cluster directory is
still recognised."""

from __future__ import annotations

import json
import shutil

import pytest

from compressor_2.cli import main
from compressor_2.clusters.builder import build_clusters
from compressor_2.commands.evolve import evolve
from tests.test_evolution_support import config_for, read_json, write_config

pytestmark = pytest.mark.slow


def test_another_evolution_seed_keeps_the_clusters(tmp_path, shared, tiny_model_dir, capsys):
    first = build_clusters(config_for(tmp_path, shared, tiny_model_dir))
    capsys.readouterr()
    again = build_clusters(config_for(tmp_path, shared, tiny_model_dir, SEED="7"))
    assert "clusters up to date" in capsys.readouterr().out
    assert again.build_digest == first.build_digest


def test_deltas_for_other_clusters_are_refused_unless_forced(tmp_path, shared, tiny_model_dir, capsys):
    config = config_for(tmp_path, shared, tiny_model_dir, NGEN="1")
    evolve(config)
    best = config.output_dir / "deltas_best.json"
    sidecar = config.output_dir / "deltas_best.clusters.json"
    assert set(read_json(sidecar)) == {"cluster_map"} and all(k.isdigit() for k in read_json(best))

    same = str(tmp_path / "test.config")
    out = tmp_path / "p.py"
    assert main(["generate-processor", "--config", same, "--deltas", str(best), "--out", str(out)]) == 0

    # Other clusters under the same ids: a cluster directory built with another seed.
    other_dir = tmp_path / "other_clusters"
    other = write_config(tmp_path, shared, tiny_model_dir, CLUSTER_SEED="3", CLUSTER_DIR=f'"{other_dir}"',
                         CLUSTER_DESCRIPTIONS_PATH=f'"{other_dir / "cluster_descriptions.json"}"',
                         INITIAL_DELTAS_PATH=f'"{other_dir / "initial_deltas.json"}"')
    assert main(["build-clusters", "--config", str(other)]) == 0
    capsys.readouterr()
    for command in (["evaluate", "--deltas", str(best)],
                    ["generate-processor", "--deltas", str(best), "--out", str(out)]):
        assert main([command[0], "--config", str(other), *command[1:]]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "was made for clusters" in err[0] and "--force" in err[0]
    assert main(["generate-processor", "--config", str(other), "--deltas", str(best), "--out", str(out),
                 "--force"]) == 0


def test_a_copied_cluster_directory_is_recognised(tmp_path, shared, tiny_model_dir, capsys):
    build_clusters(config_for(tmp_path, shared, tiny_model_dir))
    copy = tmp_path / "copied_clusters"
    shutil.copytree(shared / "clusters", copy)
    capsys.readouterr()
    config = config_for(tmp_path, shared, tiny_model_dir, CLUSTER_DIR=f'"{copy}"',
                        CLUSTER_DESCRIPTIONS_PATH=f'"{copy / "cluster_descriptions.json"}"',
                        INITIAL_DELTAS_PATH=f'"{copy / "initial_deltas.json"}"')
    build_clusters(config)
    out = capsys.readouterr().out
    assert "clusters up to date" in out and "modified" not in out
    assert json.loads((copy / "fingerprint.json").read_text())["fingerprint"] == json.loads(
        (shared / "clusters" / "fingerprint.json").read_text())["fingerprint"]


def test_a_run_on_other_clusters_does_not_rebuild_a_directory_in_use(tmp_path, shared, tiny_model_dir):
    import subprocess
    import sys

    from compressor_2.common.errors import RunError

    config = config_for(tmp_path, shared, tiny_model_dir)
    build_clusters(config)
    lock = shared / "clusters" / ".lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); time.sleep(60)", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = (shared / "clusters" / "fingerprint.json").read_bytes()
        build_clusters(config)  # the same clusters: shared with the other run
        with pytest.raises(RunError, match="is in use by another run on other clusters .*CONFIG_CLUSTER_SEED"):
            build_clusters(config_for(tmp_path, shared, tiny_model_dir, CLUSTER_SEED="9"))
        assert (shared / "clusters" / "fingerprint.json").read_bytes() == before
    finally:
        holder.kill()
        holder.wait()


def test_initial_deltas_from_another_cluster_build_are_refused(tmp_path, shared, tiny_model_dir, capsys):
    """Issue P, item 7: build-clusters gives the all-zero initial deltas it writes the same
    sidecar (its cluster map digest) as deltas_best.json, and `evolve` refuses initial deltas made for
    other clusters (here: the same ids, from a build with another CLUSTER_SEED) before any
    work, as `evaluate` and `generate-processor` refuse such deltas."""
    from compressor_2.clusters.clusterset import cluster_map_digest

    mine = build_clusters(config_for(tmp_path, shared, tiny_model_dir))
    initial = shared / "clusters" / "initial_deltas.json"
    assert read_json(shared / "clusters" / "initial_deltas.clusters.json") == {"cluster_map": cluster_map_digest(mine)}

    other_dir = tmp_path / "other_clusters"
    other = write_config(tmp_path, shared, tiny_model_dir, CLUSTER_SEED="3", CLUSTER_DIR=f'"{other_dir}"',
                         CLUSTER_DESCRIPTIONS_PATH=f'"{other_dir / "cluster_descriptions.json"}"',
                         INITIAL_DELTAS_PATH=f'"{initial}"', NGEN="1")
    capsys.readouterr()
    assert main(["evolve", "--config", str(other)]) == 2
    # The other build's own progress comes first; then one line.
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and f"'{initial}' was made for clusters {cluster_map_digest(mine)[:12]}" in err[0], err
    assert "initial_deltas.clusters.json' to start from these deltas anyway" in err[0]
    assert not (tmp_path / "out" / "run.sqlite").exists()


def test_descriptions_left_at_their_default_follow_a_moved_cluster_directory(tmp_path, shared, tiny_model_dir):
    """Issue AA, item 5: a user who moves CONFIG_CLUSTER_DIR and leaves
    CONFIG_CLUSTER_DESCRIPTIONS_PATH at its default (empty) builds the descriptions inside
    the new directory, rather than being refused another build's file."""
    moved = tmp_path / "moved_clusters"
    config = write_config(tmp_path, shared, tiny_model_dir, CLUSTER_DIR=f'"{moved}"', CLUSTER_DESCRIPTIONS_PATH=None,
                          INITIAL_DELTAS_PATH=f'"{moved / "initial_deltas.json"}"')
    assert main(["build-clusters", "--config", str(config)]) == 0
    assert set(read_json(moved / "cluster_descriptions.json")) == set(read_json(moved / "initial_deltas.json"))
