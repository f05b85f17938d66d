"""`python -m compressor_2 evaluate`: one delta vector on chosen questions, scored like fitness.

This is how a user checks an evolved vector on questions outside the training pool,
or measures the unsteered baseline (the default: all deltas 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from compressor_2.common import atomic_write_json
from compressor_2.config import Config
from compressor_2.data import Example
from compressor_2.deltas import check_map_digest, deltas_document, gene_ids, load_deltas, to_dict, to_list
from compressor_2.fitness import Evaluation, Evaluator

if TYPE_CHECKING:
    from compressor_2.commands.files import Files


def run_evaluate(config: Config, deltas_path: Path | None, indices: str | None,
                 out: Path | None, files: Files, force: bool = False) -> None:
    """`config`: the command's, with `--data` as its training data; `files`: the table of the
    command's files, made from the config as loaded and the command line."""
    from compressor_2.clusters.builder import build_clusters
    from compressor_2.clusters.clusterset import cluster_map_digest
    from compressor_2.data import examples_from_config
    from compressor_2.engines import check_model, make_engine
    from compressor_2.judges import make_judge

    # Every input is checked before the model loads: a typo should cost seconds.
    option = "evaluate --out"
    if out is None:
        files.check_output_dir()
        # Named after the deltas so a baseline and a best vector never overwrite each other.
        out = config.output_dir / f"evaluation_{deltas_path.stem if deltas_path else 'baseline'}.json"
        option = "evaluate's report"
    files.check_output(out, option, kind="JSON file", example="evaluation.json")
    files.check_cluster_outputs()
    examples = examples_from_config(config, indices)
    check_model(config, {e.id: e.prompt for e in examples})
    clusters = build_clusters(config, paths=files.artifacts)
    # The genome the engine steers with: CONFIG_DELTA_PHASES vectors (a plain file in each).
    ids = gene_ids(clusters.cluster_ids, config.delta_phases)
    if deltas_path is not None:
        check_map_digest(deltas_path, cluster_map_digest(clusters), force)
    deltas = (to_list(load_deltas(deltas_path, clusters.cluster_ids, config.delta_phases)) if deltas_path is not None
              else [0.0] * len(ids))
    judge = make_judge(config)
    engine = make_engine(config, clusters, {e.id: e.prompt for e in examples})
    try:
        evaluator = Evaluator(engine, judge, examples, config.lambda_shortness,
                              config.lambda_correctness, config.shortness_scale)
        with tqdm(total=len(examples), desc="evaluate", unit="answer") as bar:
            [evaluation] = evaluator.evaluate([deltas], progress=bar.update)
    finally:
        engine.close()

    kinds = breakdown(examples, evaluation)
    print(format_summary(evaluation, kinds))
    atomic_write_json(out, report(config, ids, evaluation, examples, kinds))
    print(f"records written to {out}")


def breakdown(examples: Sequence[Example], evaluation: Evaluation) -> dict[str, dict[str, float]]:
    """Mean tokens and correctness per question_type; empty when no example has one."""
    if all(ex.question_type is None for ex in examples):
        return {}
    groups: dict[str, list[Any]] = {}
    for ex, record in zip(examples, evaluation.records):
        groups.setdefault(ex.question_type or "(none)", []).append(record)
    return {
        kind: {
            "examples": len(records),
            "mean_tokens": sum(r.tokens for r in records) / len(records),
            "correctness": sum(r.is_correct for r in records) / len(records),
        }
        for kind, records in sorted(groups.items())
    }


def format_summary(evaluation: Evaluation, kinds: dict[str, dict[str, float]]) -> str:
    n = len(evaluation.records)
    correct = sum(r.is_correct for r in evaluation.records)
    lines = [
        f"examples     {n}",
        f"mean tokens  {evaluation.mean_tokens:.1f}",
        f"correctness  {evaluation.correctness:.3f} ({correct}/{n})",
        f"shortness    {evaluation.shortness:.3f}",
        f"fitness      {evaluation.fitness:.3f}",
    ]
    if kinds:
        width = max(len(k) for k in kinds)
        lines.append("by question type:")
        lines += [
            f"  {kind.ljust(width)}  n={int(s['examples']):<4} mean tokens {s['mean_tokens']:7.1f}"
            f"  correctness {s['correctness']:.3f}"
            for kind, s in kinds.items()
        ]
    return "\n".join(lines)


def report(config: Config, ids: Sequence[str], evaluation: Evaluation,
           examples: Sequence[Example], kinds: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {
        "model_path": config.model_path,
        "engine": config.engine,
        "deltas": deltas_document(to_dict(evaluation.deltas, ids)),
        "summary": {
            "examples": len(evaluation.records),
            "mean_tokens": evaluation.mean_tokens,
            "correctness": evaluation.correctness,
            "shortness": evaluation.shortness,
            "fitness": evaluation.fitness,
            "lambda_shortness": config.lambda_shortness,
            "lambda_correctness": config.lambda_correctness,
            "shortness_scale": config.shortness_scale,
        },
        "by_question_type": kinds,
        "records": [
            {
                "id": r.id, "question_type": ex.question_type, "question": r.question,
                "answer": r.answer, "gold": r.gold, "tokens": r.tokens,
                "is_correct": r.is_correct, "reasoning": r.reasoning,
            }
            for ex, r in zip(examples, evaluation.records)
        ],
    }
