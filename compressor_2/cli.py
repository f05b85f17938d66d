"""`python -m compressor_2 COMMAND --config PATH`: one parser, one line per error.

Exit codes: 0 success, 2 usage or config error, 1 run failure, 130 interrupted.
`--debug` shows the traceback instead of the one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from compressor_2.common import ConfigError, RunError, ScrubFilter, scrub, stop_on_first_signal, stopping
from compressor_2.config import load_config
from compressor_2.model import check_model_path

if TYPE_CHECKING:
    from compressor_2.commands.files import Files

DESCRIPTION = ("compressor_2: evolve per-cluster logit steering deltas so that an LLM answers briefly "
               "without answering worse. Configure with `make menuconfig` (writes .config), then run "
               "`evolve`; `show` reads a run, `evaluate` checks deltas on other questions, "
               "`generate-processor` writes the SGLang processor to deploy, `export` picks the candidate for the "
               "correctness you can give up, `report` writes report.html.")
DEFAULT_CONFIG = Path(".config")
EXPORT_FORMATS = ("processor", "logit-bias")  # what `export --format` writes beside the deltas


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Files, argparse.Namespace], None]  # handed the table of the command's files


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def _check_config(files: Files, args: argparse.Namespace) -> None:
    print(f"{args.config}: OK")
    print(files.config.summary())


def _build_clusters_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache is fresh")


def _build_clusters(files: Files, args: argparse.Namespace) -> None:
    from compressor_2.clusters.builder import build_clusters

    files.check_cluster_outputs()
    build_clusters(files.config, force=args.force, paths=files.artifacts)


def _generate_processor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deltas", type=Path, required=True, help="delta JSON {cluster id: float}")
    parser.add_argument("--out", type=Path, required=True, help="where to write the processor module")
    parser.add_argument("--force", action="store_true",
                        help="use deltas recorded for other clusters than the current ones")


def _generate_processor(files: Files, args: argparse.Namespace) -> None:
    from compressor_2.steering.generate import generate_processor

    files.check_output(args.out, "generate-processor --out", kind="Python module", example="processor.py")
    generate_processor(files.config, deltas_path=args.deltas, out=args.out, force=args.force, paths=files.artifacts)


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deltas", type=Path, default=None,
                        help="delta JSON to evaluate (default: all zeros, the unsteered baseline)")
    parser.add_argument("--data", type=Path, default=None,
                        help="FinanceBench-shaped JSONL to evaluate on (default: CONFIG_FINANCEBENCH_JSONL_PATH), "
                        "e.g. held-out questions")
    parser.add_argument("--indices", default=None,
                        help="'all' or indices/ranges such as '0,3,5-9' (default: the training pool)")
    parser.add_argument("--out", type=Path, default=None, help="write per-example records as JSON here "
                        "(default: CONFIG_OUTPUT_DIR/evaluation_<deltas file name or baseline>.json)")
    parser.add_argument("--force", action="store_true",
                        help="use deltas recorded for other clusters than the current ones")


def _evaluate(files: Files, args: argparse.Namespace) -> None:
    from compressor_2.commands.evaluate import run_evaluate

    config = files.config
    if args.data is not None:
        config = dataclasses.replace(config, financebench_jsonl_path=args.data)
    run_evaluate(config, deltas_path=args.deltas, indices=args.indices, out=args.out, force=args.force, files=files)


def _evolve(files: Files, args: argparse.Namespace) -> None:
    del args
    from compressor_2.commands.evolve import evolve

    evolve(files.config, files)


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidate", type=int, nargs="?", default=None, metavar="CANDIDATE_ID",
                        help="show this candidate and its answers (default: the run summary and the best's lineage)")
    parser.add_argument("--front", action="store_true",
                        help="print the tokens-versus-correctness front as a table (id, tokens, correctness, "
                        "fitness, held-out results)")


def _show(files: Files, args: argparse.Namespace) -> None:
    from compressor_2.commands.show import run_show

    run_show(files.config, args.candidate, front=args.front)


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--max-correctness-drop", type=float, default=None, metavar="D",
                       help="the front candidate with the fewest held-out tokens whose held-out correctness drop "
                       "against the unsteered baseline is at most D (a fraction: 0.01 is one point) at the "
                       "--confidence upper bound; without a held-out check, the shortest whose training "
                       "correctness is at most D below the baseline's (unvalidated)")
    which.add_argument("--candidate", type=int, default=None, metavar="ID", help="this candidate")
    parser.add_argument("--out", type=Path, default=None,
                        help="the deltas JSON to write; the processor goes beside it (default: "
                        "CONFIG_OUTPUT_DIR/deltas_candidate_<id>.json and processor_candidate_<id>.py)")
    parser.add_argument("--format", choices=EXPORT_FORMATS, default="processor",
                        help="what goes beside the deltas JSON: processor (default), the SGLang processor module; "
                        "logit-bias, the deltas expanded through the cluster map as the logit_bias object of an "
                        "OpenAI-compatible request (llama.cpp, vLLM, SGLang), logit_bias_<name>.json, with the "
                        "cluster map's digest in its .clusters.json sidecar")
    parser.add_argument("--force", action="store_true",
                        help="write the processor or map even when the run's clusters are not the current ones")
    parser.add_argument("--confidence", type=float, default=0.95, metavar="C",
                        help="the confidence of the intervals export chooses by and prints (default 0.95)")


def _export(files: Files, args: argparse.Namespace) -> None:
    from compressor_2.commands.export import run_export

    run_export(files, args.max_correctness_drop, args.candidate, args.out, force=args.force,
               confidence=args.confidence, export_format=args.format)


def _report(files: Files, args: argparse.Namespace) -> None:
    del args
    from compressor_2.commands.report import run_report

    run_report(files)


# The commands that read CONFIG_MODEL_PATH: each checks first what can be said of it cheaply.
MODEL_READERS = frozenset({"check-config", "build-clusters", "generate-processor", "evaluate", "evolve"})

COMMANDS: tuple[Command, ...] = (
    Command("check-config", "validate a config and print the resolved settings", _no_arguments, _check_config),
    Command("build-clusters", "cluster the model's vocabulary (cached)", _build_clusters_arguments, _build_clusters),
    Command("generate-processor", "write a standalone SGLang logit processor with baked-in deltas",
            _generate_processor_arguments, _generate_processor),
    Command("evaluate", "evaluate one delta vector on FinanceBench-shaped questions",
            _evaluate_arguments, _evaluate),
    Command("evolve", "evolve steering deltas with CONFIG_STRATEGY (resumes when state exists)",
            _no_arguments, _evolve),
    Command("show", "print a run's summary, or one candidate with its answers (read only)",
            _show_arguments, _show),
    Command("export", "write the deltas and processor of the shortest candidate within a correctness drop",
            _export_arguments, _export),
    Command("report", "write report.html, the run on one self-contained page (reads the run only)",
            _no_arguments, _report),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m compressor_2", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        cmd = sub.add_parser(command.name, help=command.help, description=command.help)
        cmd.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                         help="the config written by make menuconfig (default: .config in the current "
                         "directory); relative paths in it resolve against the current directory")
        cmd.add_argument("--debug", action="store_true", help="show tracebacks")
        command.add_arguments(cmd)
        cmd.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Our own progress lines (server starts, restarts) at INFO; libraries (httpx logs every
    # request at INFO) only from WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(ScrubFilter())
    logging.getLogger("compressor_2").setLevel(logging.DEBUG if args.debug else logging.INFO)
    # SIGTERM takes Ctrl+C's path, so servers are stopped and state is saved either way; once
    # one of them arrived, both stay ignored until the process has exited.
    with stop_on_first_signal(restore=False):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        from compressor_2.commands.files import Files

        # Made once, here: every file the command reads or writes, by role; an input a
        # cluster build writes in another role is refused as it is made.
        options = {f"{args.command} {option}": getattr(args, option[2:], None) for option in ("--deltas", "--data")}
        files = Files.of(config, options)
        if args.command in MODEL_READERS:
            check_model_path(config.model_path)
        args.run(files, args)
    except ConfigError as exc:
        return _fail(args, exc, 2)
    except RunError as exc:
        return _fail(args, exc, 1)
    except KeyboardInterrupt:
        return _interrupted(args)
    except BrokenPipeError:
        # The reader went away (`... | head`): not an error worth a message.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - stays open until exit
        return 0
    except Exception as exc:  # noqa: BLE001 - the one-line promise covers surprises too
        if stopping():
            return _interrupted(args, exc)
        return _fail(args, exc, 1, prefix=f"{type(exc).__name__}: ")
    return 0


def _interrupted(args: argparse.Namespace, exc: BaseException | None = None) -> int:
    """`exc`: what a Ctrl+C turned into where it landed (an import, say)."""
    if args.debug and exc is not None:
        print(scrub("".join(traceback.format_exception(exc))), file=sys.stderr, end="")
    print("interrupted", file=sys.stderr)
    return 130


def _fail(args: argparse.Namespace, exc: BaseException, code: int, prefix: str = "") -> int:
    if args.debug:
        print(scrub("".join(traceback.format_exception(exc))), file=sys.stderr, end="")
    else:
        first = scrub(str(exc)).strip().splitlines()
        print(f"error: {prefix}{first[0] if first else type(exc).__name__}", file=sys.stderr)
        for line in getattr(exc, "details", ()):
            print(f"  {scrub(line)}", file=sys.stderr)
    return code
