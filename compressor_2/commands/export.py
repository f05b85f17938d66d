"""`python -m compressor_2 export`: the candidate to deploy for the correctness you can give up.

`--max-correctness-drop D` chooses on what the search did not fit: once the held-out check
ran, the front candidate with the fewest held-out tokens whose held-out drop against the
unsteered baseline has an upper bound (at `--confidence`, paired: findings/confidence.py) of at
most D. Without a held-out check, the shortest candidate on the training front whose
correctness is at most D below the baseline's, and the message says that this choice is
unvalidated. `--candidate ID` takes that one. Its deltas (with their sidecar, the
cluster map digest) and its SGLang processor are written to `--out` (a deltas JSON path; the
processor beside it), by default beside deltas_best.json as
deltas_candidate_<id>.json and processor_candidate_<id>.py. With `--format logit-bias` the
processor's place is taken by logit_bias_candidate_<id>.json: the deltas expanded through the
cluster map as the `logit_bias` object of an OpenAI-compatible request, with the cluster map's
digest in its sidecar (steering/logit_bias.py). The run archive is read only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compressor_2.archive import ARCHIVE_FILE, Candidate, RunArchive
from compressor_2.clusters.clusterset import ClusterSet
from compressor_2.commands.files import Files
from compressor_2.common import ConfigError, atomic_write_json
from compressor_2.deltas import deltas_document, sidecar_path, recorded_map_digest, write_sidecar
from compressor_2.run import DELTAS_BEST
from compressor_2.steering.generate import generate_processor
from compressor_2.steering.logit_bias import export_logit_bias, refuse_phases
from compressor_2.findings import (
    HELDOUT,
    LEVEL,
    Arm,
    Claims,
    Paired,
    Point,
    Standing,
    affordable,
    affordable_bound,
    correctness_claim,
    measured,
    pareto_front,
    refuse_lost,
    standing,
    tokens_claim,
)


def run_export(files: Files, max_drop: float | None, candidate_id: int | None, out: Path | None,
               force: bool = False, confidence: float = LEVEL, export_format: str = "processor") -> None:
    config = files.config
    if not 0 < confidence < 1:
        raise ConfigError(f"export --confidence {confidence:g} must be in (0, 1), e.g. 0.95")
    archive = RunArchive.open_read_only(config.output_dir / ARCHIVE_FILE)
    try:
        candidate, why = choose(archive, max_drop, candidate_id, Claims.of_config(config, archive, confidence))
    finally:
        archive.close()
    assert candidate.id is not None
    deltas_path = out if out is not None else config.output_dir / f"deltas_candidate_{candidate.id}.json"
    name = deltas_path.stem.removeprefix('deltas_')
    companion = (deltas_path.with_name(f"logit_bias_{name}.json") if export_format == "logit-bias"
                 else deltas_path.with_name(f"processor_{name}.py"))
    outputs = [(deltas_path, "deltas JSON file"), (sidecar_path(deltas_path), "deltas JSON file"),
               (companion, "processor module")]
    if export_format == "logit-bias":
        refuse_phases(candidate.deltas, f"candidate #{candidate.id}")
        outputs[2:] = [(companion, "logit_bias JSON file"), (sidecar_path(companion), "logit_bias JSON file")]
    for path, kind in outputs:
        files.check_output(path, "export --out", kind=kind, example="deltas_fast.json")
    map_digest = run_map_digest(files)  # read before anything is written: a broken sidecar writes nothing
    clusters = _current_clusters(files, map_digest, force) if export_format == "logit-bias" else None
    print(why)
    atomic_write_json(deltas_path, deltas_document(candidate.deltas))
    write_sidecar(deltas_path, map_digest)
    if clusters is not None:
        print(export_logit_bias(clusters, deltas_path, companion, force))
    else:
        # The processor is checked against the current clusters: deltas evolved on others are
        # refused (unless --force) rather than deployed to steer the wrong tokens.
        generate_processor(config, deltas_path=deltas_path, out=companion, force=force, paths=files.artifacts)
    print(f"wrote {deltas_path} (its clusters recorded in {sidecar_path(deltas_path).name})")


def _current_clusters(files: Files, map_digest: str, force: bool) -> ClusterSet:
    """The clusters the map is expanded through, refused before anything is written (unless
    `force`) when they are not those the run evolved on: the same ids would bias other tokens."""
    from compressor_2.clusters.clusterset import cluster_map_digest, load_cluster_set

    clusters = load_cluster_set(files.config, files.artifacts)
    current = cluster_map_digest(clusters)
    if map_digest != current and not force:
        raise ConfigError(f"the run's deltas were made for clusters {map_digest[:12]}, but the current clusters are "
                          f"{current[:12]}: expanded through them, the map would bias other tokens. Build the "
                          "clusters the run evolved on, or pass --force")
    return clusters


def choose(archive: RunArchive, max_drop: float | None, candidate_id: int | None,
           claims: Claims) -> tuple[Candidate, str]:
    """The candidate to export and one line on why it was chosen."""
    now = standing(archive)
    # It reads the held-out check's answers (the training front is chosen on recorded points).
    refuse_lost(claims, [m for m in measured(now, None) if m.split == HELDOUT])
    points = {p.id: p for p in now.points}
    if candidate_id is not None:
        candidate = archive.candidate(candidate_id)
        if candidate is None:
            raise ConfigError(f"export --candidate {candidate_id}: no such candidate in '{archive.path}' "
                              f"(it holds ids 1..{archive.last_candidate_id()})")
        point = points.get(candidate_id)
        held = _held_out(claims, now, candidate_id)
        return candidate, f"candidate #{candidate_id}" + (f": {_describe(point)} on the training pool" if point else
                                                         " (not assessed on the whole pool)") + (
            f"; held out ({held.questions} questions): {tokens_claim(held)}, {correctness_claim(held)}" if held else "")
    assert max_drop is not None
    if not 0 <= max_drop <= 1:
        raise ConfigError(f"export --max-correctness-drop {max_drop:g} must be a fraction in [0, 1] "
                          "(0.01: one point of correctness)")
    baseline = now.baseline
    if baseline is None:
        raise ConfigError(f"'{archive.path}' has no unsteered baseline yet (the all-zero deltas, measured when "
                          "the run starts or stops): rerun evolve, or export with --candidate ID")
    checked = [(p, claim) for p, _ in now.front() if (claim := _held_out(claims, now, p.id)) is not None]
    chosen_id, why = _by_held_out(checked, max_drop, claims.level) if checked else _by_training(now, max_drop)
    candidate = archive.candidate(chosen_id)
    assert candidate is not None
    return candidate, why


def _held_out(claims: Claims, now: Standing, candidate_id: int) -> Paired | None:
    """The candidate against the baseline on the held-out questions, once checked there."""
    if now.zeros is None or now.genome(candidate_id) not in now.heldout:
        return None
    return claims.paired(Arm(now.zeros), Arm(now.genome(candidate_id)), HELDOUT)


def _by_held_out(checked: Sequence[tuple[Point, Paired]], max_drop: float, level: float) -> tuple[int, str]:
    chosen = affordable_bound([(p, claim.tokens, claim.drop_bound) for p, claim in checked], max_drop)
    if chosen is None:
        p, claim = min(checked, key=lambda c: (c[1].drop_bound, c[1].tokens, c[0].id))
        raise ConfigError(
            f"export --max-correctness-drop {max_drop:g}: no front candidate's held-out correctness drop is at most "
            f"{max_drop:g} at {level:.0%} confidence (the smallest upper bound is {100 * claim.drop_bound:.1f} points, "
            f"#{p.id}'s, on {claim.questions} questions): allow a larger drop, lower --confidence, check more "
            "held-out questions, or export with --candidate ID")
    claim = next(c for p, c in checked if p.id == chosen.id)
    return chosen.id, (
        f"candidate #{chosen.id}, the shortest held out of the front's candidates whose held-out correctness drop "
        f"is at most {max_drop:g} at {level:.0%} confidence (upper bound {100 * claim.drop_bound:.1f} points); "
        f"held out ({claim.questions} questions): {tokens_claim(claim)}, {correctness_claim(claim)}; on the training pool: "
        f"{_describe(chosen)}")


def _by_training(now: Standing, max_drop: float) -> tuple[int, str]:
    assert now.baseline is not None
    front = pareto_front(now.points)
    chosen = affordable(front, now.baseline.correctness, max_drop)
    if chosen is None:
        raise ConfigError(no_candidate_line(front, now.baseline, max_drop))
    best = now.best
    return chosen.id, (
        f"candidate #{chosen.id}, the shortest on the front within {max_drop:g} of the baseline's correctness on "
        f"the training pool: {_describe(chosen)}, the baseline {_describe(now.baseline)}"
        + (f", the best by fitness (#{best.id}) {_describe(best)}" if best is not None else "")
        + ". Unvalidated: the run has no held-out check (CONFIG_HOLDOUT_DATA), so this rests on the questions "
          "the search fitted")


def no_candidate_line(front: Sequence[Point], baseline: Point, max_drop: float) -> str:
    most = max(front, key=lambda p: (p.correctness, -p.tokens), default=None)
    return (f"export --max-correctness-drop {max_drop:g}: no candidate on the front is within {max_drop:g} of the "
            f"baseline's correctness ({100 * baseline.correctness:.1f}%)"
            + (f" (the most correct is #{most.id} at {100 * most.correctness:.1f}%)" if most is not None else "")
            + ": allow a larger drop, or export with --candidate ID")


def _describe(p: Point) -> str:
    return f"{p.tokens:.1f} tokens at {100 * p.correctness:.1f}% correct"


def run_map_digest(files: Files) -> str:
    """The clusters the run evolved on, as deltas_best.json's sidecar records them, else
    the current clusters'."""
    from compressor_2.clusters.clusterset import cluster_map_digest, load_cluster_set

    recorded = recorded_map_digest(files.config.output_dir / DELTAS_BEST, "rerun evolve, which rewrites it")
    return recorded if recorded is not None else cluster_map_digest(load_cluster_set(files.config, files.artifacts))
