"""The stop oracle on a real model, and hand-set deltas against it (issue AC, items 1 and 2).

Answers the held-out questions with `python -m compressor_2 evaluate` once per arm (an arm: a
config variant and a delta vector), then reads every arm's answers through
compressor_2/findings/stop_oracle.py: each answer cut at its shortest prefix the numeric judge
accepts. Prints, per arm, its mean tokens and correctness paired against the model as it is
(95% CIs, exact McNemar p: findings/confidence.py), the oracle's tokens and correctness, the
share of the oracle's cut the arm reaches, and where the cut tokens stand (before the first
figure, in the figures' span, after the last) with their commonest clusters and tokens.

Arms:
- `plain`, `instructed`: the model as it is, and with CONFIG_INSTRUCTION_IN_SEARCH=y (every
  prompt carries CONFIG_COMPARE_INSTRUCTION, "Answer with the figure only." in the preset);
- with `--roles`: the config with CONFIG_ROLE_CLUSTERS=y (its own cluster directory), the
  model as it is there (the same answers: all deltas 0), and one hand-set delta on one role
  cluster at a time (`--role-deltas`, -2 and +2 by default), plus EOS +2 for reference;
  `--instructed`: the same on the instructed prompt.

An arm whose answers file exists is read, not answered again (delete it to redo it). One pass
of 200 SmolLM2 answers costs 1 to 2 minutes of CPU on one thread.

    .venv/bin/python benchmarks/bench_stop_oracle.py                      # plain and instructed
    .venv/bin/python benchmarks/bench_stop_oracle.py --roles --json docs/real-model/roles.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from compressor_2.archive import Answer  # noqa: E402 - after the path is set
from compressor_2.common import atomic_write_json  # noqa: E402
from compressor_2.config import Config, load_config  # noqa: E402
from compressor_2.data import Example  # noqa: E402
from compressor_2.findings import share_reached, stop_oracle, summarise, summary_text  # noqa: E402
from compressor_2.findings.confidence import Paired, compare, identical  # noqa: E402

PRESET = REPO / "configs" / "smollm2.config"
HELDOUT = REPO / "compressor_2" / "demo" / "data" / "heldout.jsonl"
EOS_REFERENCE = 2.0  # the EOS delta every --roles table holds for reference (docs/real-model.md measured it)


@dataclass(frozen=True)
class ArmSpec:
    name: str
    config: Path
    deltas: dict[str, float] | None  # None: all zero
    key: str = ""  # names its answers file (default: from the name); all-zero arms of one prompt share one


def answering_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark answering with the preset shares: the config, the
    questions and where its answers go (bench_phase_vectors.py's too)."""
    parser.add_argument("--config", type=Path, default=PRESET, help="the base config (default: the SmolLM2 preset)")
    parser.add_argument("--data", type=Path, default=HELDOUT, help="the questions (default: the demo's held-out)")
    parser.add_argument("--indices", default="all", help="which questions ('all' or ranges such as 0-99)")
    parser.add_argument("--work", type=Path, default=REPO / "outputs" / "stop_oracle",
                        help="where configs, deltas and answers go")


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    answering_arguments(parser)
    parser.add_argument("--roles", action="store_true", help="the role clusters' arms instead of plain/instructed")
    parser.add_argument("--role-deltas", default="-2,2", help="the hand-set deltas tried on each role (--roles)")
    parser.add_argument("--instructed", action="store_true",
                        help="--roles on the instructed prompt (CONFIG_INSTRUCTION_IN_SEARCH=y)")
    parser.add_argument("--skip", default="", help="arms --roles leaves out, by name: 'markup +2,sentence ends -2'")
    parser.add_argument("--json", type=Path, default=None, help="write the table as JSON here")
    return parser.parse_args(argv)


def variant(base: Path, path: Path, symbols: dict[str, str]) -> Path:
    """`base` with `symbols` (NAME -> value, without CONFIG_) set, written to `path`."""
    lines = []
    for line in base.read_text(encoding="utf-8").splitlines():
        name = line.split("=", 1)[0].removeprefix("# ").split(" is not set", 1)[0].removeprefix("CONFIG_")
        lines.append(line if name not in symbols else f"CONFIG_{name}={symbols[name]}")
    missing = [n for n in symbols if not any(line.startswith(f"CONFIG_{n}=") for line in lines)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines + [f"CONFIG_{n}={symbols[n]}" for n in missing]) + "\n", encoding="utf-8")
    return path


def plan(args: argparse.Namespace) -> list[ArmSpec]:
    work = args.work
    if not args.roles:
        return [ArmSpec("plain", variant(args.config, work / "plain.config", {}), None),
                ArmSpec("instructed", variant(args.config, work / "instructed.config",
                                              {"INSTRUCTION_IN_SEARCH": "y"}), None)]
    prompt = "instructed" if args.instructed else "plain"
    roles = variant(args.config, work / f"roles_{prompt}.config", {
        "INSTRUCTION_IN_SEARCH": "y" if args.instructed else "n",
        "ROLE_CLUSTERS": "y", "CLUSTER_DIR": f'"{work / "role_clusters"}"',
        "CLUSTER_DESCRIPTIONS_PATH": f'"{work / "role_clusters" / "cluster_descriptions.json"}"',
        "INITIAL_DELTAS_PATH": f'"{work / "role_clusters" / "initial_deltas.json"}"'})
    from compressor_2.clusters.roles import ROLES, role_ids

    seed_embeddings(load_config(args.config), load_config(roles))
    ids = role_ids(len(ROLES))
    prefix = "instructed " if args.instructed else ""
    arms = [ArmSpec(f"{prompt}: as it is", roles, None, key=prompt)]
    for value in (float(v) for v in args.role_deltas.split(",")):
        arms += [ArmSpec(f"{prompt}: {role.name} {value:+g}", roles, {cid: value},
                         key=slug(f"{prefix}{role.name} {value:+g}")) for role, cid in zip(ROLES, ids)]
        if value == EOS_REFERENCE:
            arms.append(ArmSpec(f"{prompt}: EOS {value:+g}", roles, {"0": value}, key=slug(f"{prefix}EOS {value:+g}")))
    if EOS_REFERENCE not in {float(v) for v in args.role_deltas.split(",")}:
        arms.append(ArmSpec(f"{prompt}: EOS {EOS_REFERENCE:+g}", roles, {"0": EOS_REFERENCE},
                            key=slug(f"{prefix}EOS {EOS_REFERENCE:+g}")))
    skipped = {f"{prompt}: {name.strip()}" for name in args.skip.split(",") if name.strip()}
    return [arm for arm in arms if arm.name not in skipped]


def seed_embeddings(base: Config, roles: Config) -> None:
    """The roles' cluster directory starts from the base's token embeddings (the same
    vocabulary and embedding model: the build checks their embeddings key and reuses them),
    which spares minutes of embedding."""
    from compressor_2.clusters.layout import EMBEDDINGS_FILE, EMBEDDINGS_KEY_FILE

    roles.cluster_dir.mkdir(parents=True, exist_ok=True)
    for name in (EMBEDDINGS_FILE, EMBEDDINGS_KEY_FILE):
        if (base.cluster_dir / name).is_file() and not (roles.cluster_dir / name).exists():
            shutil.copyfile(base.cluster_dir / name, roles.cluster_dir / name)


def slug(name: str) -> str:
    """A file name's part for `name`: signs spelt (m2, p2), anything else not alphanumeric "_"."""
    return "".join(c if c.isalnum() else "_" for c in name.replace("-", "m").replace("+", "p"))


def answer(arm: ArmSpec, args: argparse.Namespace) -> Path:
    """The arm's answers file, made by `evaluate` when absent."""
    name = arm.key or slug(arm.name)
    out = args.work / f"answers_{name}_{args.indices}.json"
    if out.exists():
        return out
    command = [sys.executable, "-m", "compressor_2", "evaluate", "--config", str(arm.config), "--data",
               str(args.data), "--indices", args.indices, "--out", str(out)]
    if arm.deltas is not None:
        config = load_config(arm.config)
        from compressor_2.clusters.builder import build_clusters

        ids = build_clusters(config).cluster_ids
        deltas = args.work / f"deltas_{name}.json"
        deltas.write_text(json.dumps({cid: arm.deltas.get(cid, 0.0) for cid in ids}), encoding="utf-8")
        command += ["--deltas", str(deltas)]
    print(f"answering: {arm.name}", flush=True)
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return out


def read_answers(path: Path) -> tuple[list[Example], list[Answer]]:
    records = json.loads(path.read_text(encoding="utf-8"))["records"]
    return ([Example(r["id"], r["question"], r["gold"], "") for r in records],
            [Answer(r["answer"], r["tokens"], r["is_correct"], r["reasoning"]) for r in records])


def measure(config: Config, arms: list[ArmSpec], files: list[Path]) -> list[dict[str, Any]]:
    from compressor_2.clusters.clusterset import load_cluster_set
    from compressor_2.clusters.tokens import AnswerTokens
    from compressor_2.judges import make_judge

    judge = make_judge(config)
    rows, reference = [], None
    for arm, path in zip(arms, files):
        arm_config = load_config(arm.config)
        clusters = load_cluster_set(arm_config)
        tokens = AnswerTokens.from_config(arm_config, clusters)
        examples, answers = read_answers(path)
        cuts = stop_oracle(examples, answers, tokens, judge)
        summary = summarise(cuts, clusters.token_clusters, tokens.display)
        pairs = [(a.tokens, a.is_correct) for a in answers]
        reference = reference or (summary, pairs)
        paired = identical(pairs) if reference[1] is pairs else compare(reference[1], pairs)
        share = share_reached(reference[0].mean_tokens, summary.mean_tokens, reference[0].oracle_tokens)
        rows.append({"arm": arm.name, "deltas": arm.deltas or {}, "oracle": summary.as_json(),
                     "against_first": dataclasses.asdict(paired), "share_of_first_oracle_cut": share,
                     "clusters": {cid: clusters.descriptions[cid]["description"][:120] for cid, _ in
                                  summary.top_clusters if cid in clusters.descriptions},
                     "by_role": by_role(tokens, answers, cuts)})
        print(f"{arm.name}: {summary_text(summary)}")
        print(f"    by role (removed / kept of the accepted answers): {rows[-1]['by_role']}")
        print(f"    against {arms[0].name}: {shown(paired)}"
              f"{'' if share is None else f'; {100 * share:.0f}% of its oracle cut'}", flush=True)
    return rows


def by_role(tokens: Any, answers: list[Answer], cuts: list[Any]) -> dict[str, dict[str, int]]:
    """What the oracle removes and what it keeps of the answers it accepts, per role of
    clusters/roles.py (the rule on each token's text, whatever the clusters were built
    with), numbers (cluster 1's rule) and the rest."""
    from compressor_2.clusters.roles import ROLES, role_of
    from compressor_2.clusters.special import is_number_token

    def kind(token: int) -> str:
        text = tokens.tokenizer.decode([token])
        role = role_of(text)
        return "numbers" if is_number_token(text) else "other" if role is None else ROLES[role].name

    counts: dict[str, dict[str, int]] = {"removed": {}, "kept": {}}
    for a, cut in zip(answers, cuts):
        if not cut.correct:
            continue
        ids = tokens.ids(a.answer).tolist()
        for part, chosen in (("kept", ids[:len(ids) - len(cut.removed)]), ("removed", list(cut.removed))):
            for token in chosen:
                counts[part][kind(token)] = counts[part].get(kind(token), 0) + 1
    return counts


def shown(p: Paired) -> str:
    return (f"{p.tokens:.1f} tokens ({p.tokens_change:+.1f}, {p.tokens_low:+.1f} to {p.tokens_high:+.1f}), "
            f"{100 * p.correctness:.1f}% ({100 * p.difference:+.1f} points, {100 * p.low:+.1f} to {100 * p.high:+.1f}, "
            f"McNemar p={p.p_value:.3g})")


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    arms = plan(args)
    files = [answer(arm, args) for arm in arms]
    rows = measure(load_config(arms[0].config), arms, files)
    write_table(args, rows)
    return 0


def write_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The arms' rows as JSON at --json (when given), the questions named relative to the repository."""
    if args.json is None:
        return
    data = args.data.relative_to(REPO) if args.data.is_relative_to(REPO) else args.data
    atomic_write_json(args.json, {"data": str(data), "indices": args.indices, "arms": rows})
    print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.exit(main())
