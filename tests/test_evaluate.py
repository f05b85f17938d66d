"""`python -m compressor_2 evaluate` end to end: tiny model, real clusters, numeric judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compressor_2.cli import main
from tests.cluster_helpers import cluster_config
from tests.conftest import REPO

QUESTIONS = [
    ("fb_0", "What was revenue in FY2018?", "$1,577 million", "Revenue was $1,577 million.", "metrics-generated"),
    ("fb_1", "Did capex exceed $2,000 million?", "No", "Capex was $1,200 million.", "domain-relevant"),
    ("fb_2", "What was net income?", "$5,363 million", "Net income was 5,363 million.", "metrics-generated"),
]
MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def workspace(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("evaluate")
    lines = [
        json.dumps({"financebench_id": i, "question": q, "answer": a,
                    "evidence": [{"evidence_text_full_page": page}], "question_type": kind})
        for i, q, a, page, kind in QUESTIONS
    ]
    (folder / "questions.jsonl").write_text("\n".join(lines) + "\n")
    cluster_config(
        folder, tiny_model_dir, name="eval.config", NUM_CLUSTERS=2, PCA_COMPONENTS=4,
        OUTPUT_DIR=str(folder / "run"), FINANCEBENCH_JSONL_PATH=str(folder / "questions.jsonl"),
        MAX_NEW_TOKENS=MAX_NEW_TOKENS, TRANSFORMERS_BATCH_SIZE=2, TRANSFORMERS_DEVICE="cpu",
    )
    return folder


def cluster_ids(workspace: Path) -> list[str]:
    return list(json.loads((workspace / "clusters" / "cluster_descriptions.json").read_text()))


@pytest.mark.slow
def test_evaluate_baseline_in_a_subprocess(workspace):
    out = workspace / "baseline.json"
    result = subprocess.run(
        [sys.executable, "-m", "compressor_2", "evaluate", "--config", str(workspace / "eval.config"),
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr

    report = json.loads(out.read_text())
    assert set(report) == {"model_path", "engine", "deltas", "summary", "by_question_type", "records"}
    assert report["deltas"] == {cid: 0.0 for cid in cluster_ids(workspace)}
    records = report["records"]
    assert [(r["id"], r["question_type"], r["gold"]) for r in records] == [(q[0], q[4], q[2]) for q in QUESTIONS]
    assert all(set(r) == {"id", "question_type", "question", "answer", "gold", "tokens", "is_correct",
                          "reasoning"} for r in records)
    assert all(1 <= r["tokens"] <= MAX_NEW_TOKENS and r["reasoning"] for r in records)
    summary = report["summary"]
    mean = sum(r["tokens"] for r in records) / 3
    correctness = sum(r["is_correct"] for r in records) / 3
    assert summary["mean_tokens"] == pytest.approx(mean)
    assert summary["correctness"] == pytest.approx(correctness)
    assert summary["shortness"] == pytest.approx(1 / (1 + mean / 100))  # defconfig's scale
    assert summary["fitness"] == pytest.approx(0.5 * summary["shortness"] + 0.5 * correctness)
    assert report["by_question_type"]["metrics-generated"]["examples"] == 2
    assert report["by_question_type"]["domain-relevant"]["examples"] == 1

    assert f"mean tokens  {mean:.1f}" in result.stdout
    assert f"fitness      {summary['fitness']:.3f}" in result.stdout
    assert "by question type:" in result.stdout and "domain-relevant" in result.stdout
    assert "evaluate: 100%" in result.stderr  # the progress bar


def test_evaluate_steered_subset_writes_to_the_output_dir(workspace, capsys):
    main(["build-clusters", "--config", str(workspace / "eval.config")])
    deltas = {cid: 0.0 for cid in cluster_ids(workspace)} | {"0": 30.0}  # cluster 0: EOS, at the bound
    (workspace / "stop.json").write_text(json.dumps(deltas))

    code = main(["evaluate", "--config", str(workspace / "eval.config"),
                 "--deltas", str(workspace / "stop.json"), "--indices", "0,2"])
    assert code == 0, capsys.readouterr().err

    report = json.loads((workspace / "run" / "evaluation_stop.json").read_text())
    assert report["deltas"] == deltas
    assert [(r["id"], r["tokens"], r["answer"]) for r in report["records"]] == [("fb_0", 1, ""), ("fb_2", 1, "")]
    assert report["summary"]["mean_tokens"] == 1.0
    assert list(report["by_question_type"]) == ["metrics-generated"]
    assert "mean tokens  1.0" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "message"), [
    ('{"0": 1.0}', "cluster id(s) 1, 2, 3 missing"),
    ('{"0": 0, "1": 0, "2": 0, "3": "big"}', "delta of cluster 3 is 'big', not a finite number"),
    ("not json", "is not valid JSON"),
])
def test_bad_deltas_file_exits_2_with_one_line(workspace, capsys, content, message):
    main(["build-clusters", "--config", str(workspace / "eval.config")])
    capsys.readouterr()
    bad = workspace / "bad.json"
    bad.write_text(content)

    code = main(["evaluate", "--config", str(workspace / "eval.config"), "--deltas", str(bad)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and str(bad) in err and message in err


def test_index_out_of_range_exits_2(workspace, capsys):
    code = main(["evaluate", "--config", str(workspace / "eval.config"), "--indices", "0-3"])
    err = capsys.readouterr().err
    assert code == 2 and "index 3 is out of range" in err
