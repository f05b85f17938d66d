"""Hand-set delta vectors in the phased space on a real model (issue AC, item 6, the cheap way).

Answers the held-out questions with `python -m compressor_2 evaluate` once per arm: a prompt
(plain, or instructed: CONFIG_INSTRUCTION_IN_SEARCH=y puts CONFIG_COMPARE_INSTRUCTION, "Answer
with the figure only." in the preset, in every prompt), CONFIG_DELTA_PHASES (2: before / after
the first complete figure; 3: the after phase split at the first line break after a figure),
the clusters (the preset's k-means ones, or CONFIG_ROLE_CLUSTERS=y) and one hand-set delta per
(phase, cluster) it moves, every other delta 0. Each arm is paired (95% CIs, exact McNemar p:
findings/confidence.py) against the model as it is (plain, no deltas) and, on the instructed
prompt, against the instruction alone; its tokens are set against the stop oracle's cut of its
prompt (findings/stop_oracle.py: each baseline answer cut at its shortest prefix the numeric
judge accepts), and the issue's two targets are checked: instruction + steering <= 25.0 tokens
with correctness not significantly below the instruction alone's, or steering alone <= 31.3
tokens with correctness not significantly below the model as it is.

Answers files are shared with benchmarks/bench_stop_oracle.py (the same --work folder and
names): an arm whose file exists is read, not answered again (delete it to redo it). One pass
of 200 SmolLM2 answers costs 2 to 4 minutes of CPU on one thread; --jobs answers arms side by side.

    .venv/bin/python benchmarks/bench_phase_vectors.py --jobs 2 --json docs/real-model/phase_vectors.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stop_oracle import (REPO, answering_arguments, read_answers, seed_embeddings,  # noqa: E402
                               shown, slug, variant, write_table)

from compressor_2.clusters.roles import ROLES, role_ids  # noqa: E402
from compressor_2.config import load_config  # noqa: E402
from compressor_2.findings import share_reached, stop_oracle, summarise  # noqa: E402
from compressor_2.findings.confidence import Paired, compare, does_as_well, identical  # noqa: E402

EOS = "0"  # the end-of-sequence cluster, in every cluster set
ROLE_NAMES = dict(zip(role_ids(), (role.name for role in ROLES)))  # the role clusters' ids (clusters/roles.py)
LINE_BREAKS, SENTENCE_ENDS = (next(cid for cid, name in ROLE_NAMES.items() if name == n)
                              for n in ("line breaks", "sentence ends"))
INSTRUCTED_TARGET = 25.0  # issue AC's target for instruction + steering, tokens
STEERING_TARGET = 31.3  # issue AC's target for steering alone: the instruction alone's tokens


@dataclass(frozen=True)
class Arm:
    prompt: str  # "plain" or "instructed"
    phases: int
    roles: bool
    deltas: tuple[tuple[int, str, float], ...]  # (phase, cluster id, delta); none: the model as it is

    @property
    def name(self) -> str:
        moved = ", ".join(f"{'EOS' if cid == EOS else ROLE_NAMES.get(cid, cid) if self.roles else cid} {value:+g} "
                          f"in phase {phase}" for phase, cid, value in self.deltas)
        clusters = ", role clusters" if self.roles else ""
        return f"{self.prompt}: as it is" if not self.deltas else f"{self.prompt} (P={self.phases}{clusters}): {moved}"

    @property
    def key(self) -> str:
        return self.prompt if not self.deltas else slug(f"{self.prompt} P{self.phases}{' roles' if self.roles else ''} "
                                                        + " ".join(f"{p} {c} {v:+g}" for p, c, v in self.deltas))


def arms() -> list[Arm]:
    """The baselines first (plain, then instructed), then the hand-set vectors."""
    plan = [Arm("plain", 1, False, ()), Arm("instructed", 1, False, ())]
    for prompt in ("instructed", "plain"):
        plan += [Arm(prompt, 2, False, ((1, EOS, value),)) for value in (2.0, 4.0, 6.0)]
        plan += [Arm(prompt, 3, False, ((2, EOS, value),)) for value in (4.0,)]
        plan += [Arm(prompt, 2, True, ((1, LINE_BREAKS, -4.0),)), Arm(prompt, 2, True, ((1, SENTENCE_ENDS, -4.0),)),
                 Arm(prompt, 2, True, ((1, LINE_BREAKS, -4.0), (1, EOS, 4.0)))]
    # the stopping rule at its extreme: an end almost as soon as the first figure is complete
    return plan + [Arm(prompt, 2, False, ((1, EOS, 10.0),)) for prompt in ("instructed", "plain")]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    answering_arguments(parser)
    parser.add_argument("--jobs", type=int, default=1, help="arms answered side by side")
    parser.add_argument("--only-answered", action="store_true", help="measure the arms already answered, answer none")
    parser.add_argument("--only", default="", metavar="KEY,...",
                        help="answer only the arms of these keys (the baselines always), e.g. "
                             "instructed_P2_roles_1_2_m4_1_0_p4 for a second question set")
    parser.add_argument("--json", type=Path, default=None, help="write the table as JSON here")
    return parser.parse_args(argv)


def arm_config(arm: Arm, args: argparse.Namespace) -> Path:
    work = args.work
    symbols = {"INSTRUCTION_IN_SEARCH": "y" if arm.prompt == "instructed" else "n"}
    if arm.phases > 1:
        symbols["DELTA_PHASES"] = str(arm.phases)
    if arm.roles:
        symbols.update({"ROLE_CLUSTERS": "y", "CLUSTER_DIR": f'"{work / "role_clusters"}"',
                        "CLUSTER_DESCRIPTIONS_PATH": f'"{work / "role_clusters" / "cluster_descriptions.json"}"',
                        "INITIAL_DELTAS_PATH": f'"{work / "role_clusters" / "initial_deltas.json"}"'})
    name = arm.prompt if arm.phases == 1 and not arm.roles else f"{arm.prompt}_p{arm.phases}{'_roles' if arm.roles else ''}"
    path = variant(args.config, work / f"{name}.config", symbols)
    if arm.roles:
        seed_embeddings(load_config(args.config), load_config(path))
    return path


def answers_file(arm: Arm, args: argparse.Namespace) -> Path:
    return args.work / f"answers_{arm.key}_{args.indices}.json"


def answer(arm: Arm, args: argparse.Namespace) -> Path:
    """The arm's answers file, made by `evaluate` when absent."""
    out = answers_file(arm, args)
    if out.exists():
        return out
    config_path = arm_config(arm, args)
    command = ["nice", sys.executable, "-m", "compressor_2", "evaluate", "--config", str(config_path), "--data",
               str(args.data), "--indices", args.indices, "--out", str(out)]
    if arm.deltas:
        from compressor_2.clusters.builder import build_clusters

        ids = build_clusters(load_config(config_path)).cluster_ids
        phases = [{cid: 0.0 for cid in ids} for _ in range(arm.phases)]
        for phase, cid, value in arm.deltas:
            phases[phase][cid] = value
        deltas = args.work / f"deltas_{arm.key}.json"
        deltas.write_text(json.dumps({"phases": phases}), encoding="utf-8")
        command += ["--deltas", str(deltas)]
    print(f"answering: {arm.name}", flush=True)
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return out


def measure(args: argparse.Namespace, plan: list[Arm], files: list[Path]) -> list[dict[str, Any]]:
    from compressor_2.clusters.clusterset import load_cluster_set
    from compressor_2.clusters.tokens import AnswerTokens
    from compressor_2.judges import make_judge

    config = load_config(arm_config(plan[0], args))
    judge = make_judge(config)
    clusters = load_cluster_set(config)
    tokens = AnswerTokens.from_config(config, clusters)  # the same tokenizer for every arm
    baselines: dict[str, tuple[Any, list[tuple[int, bool]]]] = {}
    rows = []
    for arm, path in zip(plan, files):
        examples, answers = read_answers(path)
        pairs = [(a.tokens, a.is_correct) for a in answers]
        if not arm.deltas:
            baselines[arm.prompt] = (summarise(stop_oracle(examples, answers, tokens, judge), clusters.token_clusters,
                                               tokens.display), pairs)
        as_is = identical(pairs) if not arm.deltas and arm.prompt == "plain" else compare(baselines["plain"][1], pairs)
        row: dict[str, Any] = {"arm": arm.name, "prompt": arm.prompt, "phases": arm.phases, "role_clusters": arm.roles,
                               "deltas": [list(d) for d in arm.deltas], "tokens": as_is.tokens,
                               "correctness": as_is.correctness, "against_as_is": dataclasses.asdict(as_is)}
        lines = [f"{arm.name}: against the model as it is: {shown(as_is)}"]
        if arm.prompt == "instructed":
            alone = identical(pairs) if not arm.deltas else compare(baselines["instructed"][1], pairs)
            row["against_instruction"] = dataclasses.asdict(alone)
            lines.append(f"    against the instruction alone: {shown(alone)}")
        oracle = baselines[arm.prompt][0]
        share = share_reached(oracle.mean_tokens, as_is.tokens, oracle.oracle_tokens)
        row.update({"oracle": {"baseline_tokens": oracle.mean_tokens, "oracle_tokens": oracle.oracle_tokens},
                    "share_of_oracle_cut": share, "target_met": target_met(arm, row)})
        lines.append(f"    {oracle.mean_tokens:.1f} -> {oracle.oracle_tokens:.1f} tokens under the {arm.prompt} oracle: "
                     f"{'-' if share is None else f'{100 * share:.0f}%'} of its cut; target met: {row['target_met']}")
        print("\n".join(lines), flush=True)
        rows.append(row)
    return rows


def target_met(arm: Arm, row: dict[str, Any]) -> bool | None:
    """Issue AC's targets: instruction + steering <= 25.0 tokens, not significantly less
    correct than the instruction alone; steering alone <= 31.3 tokens, not significantly less
    correct than the model as it is. None for the baselines."""
    if not arm.deltas:
        return None
    if arm.prompt == "instructed":
        return row["tokens"] <= INSTRUCTED_TARGET and does_as_well(Paired(**row["against_instruction"]))
    return row["tokens"] <= STEERING_TARGET and does_as_well(Paired(**row["against_as_is"]))


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as docs/real-model.md's markdown table."""
    def against(p: dict[str, Any] | None) -> str:
        return "" if p is None else (f"{p['tokens_change']:+.1f} ({p['tokens_low']:+.1f} to {p['tokens_high']:+.1f}), "
                                     f"{100 * p['difference']:+.1f} points ({100 * p['low']:+.1f} to "
                                     f"{100 * p['high']:+.1f}, p={p['p_value']:.2g})")

    lines = ["| arm | tokens | correct | against the model as it is | against the instruction alone "
             "| share of the oracle's cut | target met |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        share = row["share_of_oracle_cut"]
        met = {None: "", True: "yes", False: "no"}[row["target_met"]]
        lines.append(f"| {row['arm']} | {row['tokens']:.1f} | {100 * row['correctness']:.1f}% "
                     f"| {against(row['against_as_is'])} | {against(row.get('against_instruction'))} "
                     f"| {'' if share is None else f'{100 * share:.0f}%'} | {met} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    plan = arms()
    if args.only_answered:
        plan = [arm for arm in plan if answers_file(arm, args).exists()]
    if args.only:
        wanted = [k.strip() for k in args.only.split(",") if k.strip()]
        plan = [arm for arm in plan if not arm.deltas or arm.key in wanted]
    for arm in plan:  # configs and cluster sets first, so that parallel answers never build them twice
        arm_config(arm, args)
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        files = list(pool.map(lambda arm: answer(arm, args), plan))
    rows = measure(args, plan, files)
    print("\n".join(table(rows)))
    write_table(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
