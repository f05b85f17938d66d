"""A run's identity: the settings that define what it optimises and how it scores, recorded
in the run archive at its start and compared when it resumes.

Every Kconfig symbol is classified once: either it is part of the identity, and a resume
with another value is refused (one line per changed setting, old and new value), or it may
change across a resume, and `may_change` says what that means for the run. The shared
settings are classified here; a strategy's options by its own module (`IDENTITY`, a tuple
of `Option`s, found through the strategy registry); `SETTINGS` is all of them. A path is
compared by what it holds (the training pool's example ids and prompt digests, the
clusters' digest, the initial deltas, the model's files), so a file moved elsewhere
unchanged is the same setting, and weights changed in place are not. The options of the
run's strategy are part of it; another strategy's options are not used, and not compared.

A run started by a compressor_2 that recorded no identity gets this config's recorded at
its next start (after the strategy and the answer context it did record are compared):
it is resumed, never refused for what it could not have recorded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from compressor_2.archive import RunArchive
from compressor_2.common import ConfigError, say
from compressor_2.config import Config, registry
from compressor_2.data import Example
from compressor_2.fitness import example_key
from compressor_2.model import model_digest, served_models

IDENTITY_KEY = "identity"  # in the archive's meta table
SETTING_DIGEST_CHARS = 16
SHORT_VALUE = 120  # characters: longer values are recorded as a digest
IN_SEARCH = "CONFIG_INSTRUCTION_IN_SEARCH (y: the instruction it adds)"  # its setting's name; "n" when off


@dataclass(frozen=True)
class RunInputs:
    """What the config's input paths hold, as this start read them; None for what is not
    read yet (the clusters and the initial deltas before the clusters are built)."""

    clusters: str | None  # cluster_map_digest
    examples: Sequence[Example]  # the training pool
    initial_deltas: Mapping[str, float] | None
    model: str  # model_identity: read once a start, as it may hash a large model's files


Value = Callable[[Config, RunInputs], object]  # None: the setting does not apply to this config


@dataclass(frozen=True)
class Setting:
    name: str  # as the user knows it: CONFIG_X, CONFIG_ENGINE_* for a choice, or what a path holds
    symbols: tuple[str, ...]  # the Kconfig symbols it reads; "STRATEGY_*" stands for a choice's entries
    value: Value
    may_change: str = ""  # what a change across a resume means; "" = refused
    # Recorded only away from its default, so a run at the default records what runs did
    # before the setting existed: a record without it stands for `absent`.
    absent: str | None = None


@dataclass(frozen=True)
class Option:
    """One option of a strategy as the run identity records it: its Kconfig symbol, its
    value read from the strategy's options, and what a change across a resume means ("":
    refused). A strategy module declares its own in `IDENTITY`."""

    symbol: str
    value: Callable[[Any], object]
    may_change: str = ""


def compared(prefix: str, *fields: str) -> tuple[Option, ...]:
    """Options a resume compares: each field of the strategy's options, as CONFIG_<PREFIX><FIELD>."""
    return tuple(Option(f"{prefix}{field.upper()}", attrgetter(field)) for field in fields)


def _option(strategy: str, option: Option) -> Setting:
    """A strategy's own option: compared only in a run of that strategy."""
    return Setting(f"CONFIG_{option.symbol}", (option.symbol,),
                   lambda c, _: option.value(c.strategy_options[strategy]) if c.strategy == strategy else None,
                   option.may_change)


def _pool(inputs: RunInputs) -> str:
    keys = [example_key(ex) for ex in inputs.examples]
    return f"{len(keys)} examples, digest {_digest(keys)}"


def _initial(inputs: RunInputs) -> str | None:
    if inputs.initial_deltas is None:
        return None
    text = json.dumps(dict(inputs.initial_deltas))
    return text if len(text) <= SHORT_VALUE else f"{len(inputs.initial_deltas)} deltas, digest {_digest(text)}"


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:SETTING_DIGEST_CHARS]


def model_identity(config: Config) -> str:
    """The model by what it holds: a local directory's digest (model/digest.py), a hub id as
    itself; for attached SGLang servers what their /model_info reports, the path's digest
    when that path is on this machine too (so the same model launched or attached is the
    same setting). A server that cannot be asked yet is described by CONFIG_MODEL_PATH: its
    engine start refuses it before any work."""
    if config.engine == "sglang" and config.sglang_urls:
        served = served_models(config.sglang_urls)
        if served:
            return "; ".join(sorted({_served(path, version) for path, version in set(served)}))
    return model_digest(config.model_path) or config.model_path


def _served(path: str, version: str | None) -> str:
    described = model_digest(path) or path
    return described if version in (None, "default") else f"{described}, weight version {version}"


STEPS = ("raised, the run goes on to the new count; lowered to the steps already run or fewer, it stops at once "
         "and keeps everything")
BUDGET = ("a budget: raised (or 0, unlimited), the run goes on where it stopped; lowered below what was spent, it "
          "stops at once")
REFLECTOR = ("the reflector proposes from the next step on with the new setting; scores are not affected (a "
             "replayed step may propose otherwise than the interrupted one would have)")
SPEED = ("how the same model runs: speed and memory; answers already in the archive are reused (another device "
         "or batch can change a new answer where two tokens tie to the last bit)")
JUDGE_ENDPOINT = "where the judge model is reached (the judge model itself is compared)"
JUDGE_BOUND = "how long a judge that gives no verdict is waited for: verdicts are not affected"
CONCURRENCY = "how many calls run at once: speed only"
OTHER_MODEL = ("which server may serve: one whose model path is spelled otherwise than CONFIG_MODEL_PATH (the "
               "model itself is compared, by what it holds)")
OTHER_SERVER = ("which server answers: it must serve CONFIG_MODEL_PATH's model with its tokenizer (checked on every "
                "answer); answers already in the archive are reused, and one running other arithmetic (another "
                "quantisation or engine) can answer a new request otherwise where greedy answers part")
MODEL_SETTING = "the model (a digest of its weights and tokenizer files)"
COMPARE = ("which simpler tools are measured after the search; the search never reads them: the next run measures "
           "the new set, reusing cached answers")
HOLDOUT = ("which questions the held-out check measures after the search; the search never reads them: the next "
           "check measures the new set, reusing cached answers of questions both sets hold")

SHARED_SETTINGS: tuple[Setting, ...] = (
    # What is optimised and how it is scored.
    Setting("CONFIG_STRATEGY_*", ("STRATEGY_*",), lambda c, _: c.strategy),
    Setting("CONFIG_LAMBDA_SHORTNESS (normalised)", ("LAMBDA_SHORTNESS",), lambda c, _: c.lambda_shortness),
    Setting("CONFIG_LAMBDA_CORRECTNESS (normalised)", ("LAMBDA_CORRECTNESS",), lambda c, _: c.lambda_correctness),
    Setting("CONFIG_SHORTNESS_SCALE", ("SHORTNESS_SCALE",), lambda c, _: c.shortness_scale),
    # Which candidate is the best: recorded only when it is not the fittest, so that earlier records stay.
    Setting("CONFIG_BEST_*", ("BEST_*",),
            lambda c, _: c.best_rule if c.best_rule != "fittest" else None, absent="fittest"),
    Setting("the training pool (example ids and prompt digests)", ("FINANCEBENCH_JSONL_PATH", "PROMPT_TEMPLATE_PATH"),
            lambda _, i: _pool(i)),
    Setting("CONFIG_FINANCEBENCH_POOL_INDICES", ("FINANCEBENCH_POOL_INDICES",), lambda c, _: c.pool_indices),
    Setting("CONFIG_EVIDENCE_MAX_CHARS", ("EVIDENCE_MAX_CHARS",), lambda c, _: c.evidence_max_chars),
    Setting("CONFIG_ENGINE_*", ("ENGINE_*",), lambda c, _: c.engine),
    Setting(MODEL_SETTING, ("MODEL_PATH",), lambda _, i: i.model),
    Setting("CONFIG_MAX_NEW_TOKENS", ("MAX_NEW_TOKENS",), lambda c, _: c.max_new_tokens),
    Setting("CONFIG_TEMPERATURE", ("TEMPERATURE",), lambda c, _: c.temperature),
    # Whether a cached answer is the genome's one answer or one draw among its batches'.
    Setting("CONFIG_SGLANG_DETERMINISTIC", ("SGLANG_DETERMINISTIC",),
            lambda c, _: c.sglang_deterministic if c.engine == "sglang" else None),
    Setting("CONFIG_JUDGE_*", ("JUDGE_*",), lambda c, _: c.judge),
    Setting("CONFIG_CORRECTNESS_TOLERANCE", ("CORRECTNESS_TOLERANCE",), lambda c, _: c.correctness_tolerance),
    Setting("CONFIG_JUDGE_MODEL", ("JUDGE_MODEL",), lambda c, _: c.judge_model if c.judge != "numeric" else None),
    Setting("the clusters (digest of the token -> cluster map)", ("CLUSTER_DIR", "CLUSTER_DESCRIPTIONS_PATH"),
            lambda _, i: i.clusters[:SETTING_DIGEST_CHARS] if i.clusters is not None else None),
    Setting("CONFIG_EMBEDDING_MODEL", ("EMBEDDING_MODEL",), lambda c, _: c.embedding_model),
    Setting("CONFIG_PCA_COMPONENTS", ("PCA_COMPONENTS",), lambda c, _: c.pca_components),
    Setting("CONFIG_NUM_CLUSTERS", ("NUM_CLUSTERS",), lambda c, _: c.num_clusters),
    Setting("CONFIG_CLUSTER_SEED", ("CLUSTER_SEED",), lambda c, _: c.cluster_seed),
    Setting("CONFIG_ROLE_CLUSTERS", ("ROLE_CLUSTERS",), lambda c, _: c.role_clusters),
    Setting("the initial deltas (what CONFIG_INITIAL_DELTAS_PATH holds)", ("INITIAL_DELTAS_PATH",),
            lambda _, i: _initial(i)),
    Setting("CONFIG_SEED", ("SEED",), lambda c, _: c.seed),
    # The genome's shape: P delta vectors, one per answer phase.
    Setting("CONFIG_DELTA_PHASES", ("DELTA_PHASES",), lambda c, _: c.delta_phases if c.delta_phases > 1 else None,
            absent="1"),
    # What every prompt of the search carries: the instruction's text while it is y.
    Setting(IN_SEARCH, ("INSTRUCTION_IN_SEARCH",),
            lambda c, _: c.compare_instruction if c.instruction_in_search else False),
)
MAY_CHANGE: tuple[Setting, ...] = (
    Setting("CONFIG_OUTPUT_DIR", ("OUTPUT_DIR",), lambda c, _: str(c.output_dir),
            "another directory is another run: the rerun starts afresh there, and this one stays as it is"),
    Setting("CONFIG_MAX_METRIC_CALLS", ("MAX_METRIC_CALLS",), lambda c, _: c.max_metric_calls, BUDGET),
    Setting("CONFIG_MAX_REFLECTOR_TOKENS", ("MAX_REFLECTOR_TOKENS",), lambda c, _: c.max_reflector_tokens, BUDGET),
    Setting("CONFIG_MAX_WALL_MINUTES", ("MAX_WALL_MINUTES",), lambda c, _: c.max_wall_minutes, BUDGET),
    Setting("CONFIG_MAX_IDLE_STEPS", ("MAX_IDLE_STEPS",), lambda c, _: c.max_idle_steps,
            "how many steps in a row that made nothing new end the run; the count restarts at every start"),
    Setting("CONFIG_REFLECTOR_*", ("REFLECTOR_LOCAL", "REFLECTOR_OPENAI"), lambda c, _: c.reflector, REFLECTOR),
    *(Setting(f"CONFIG_{name.upper()}", (name.upper(),), lambda c, _, n=name: getattr(c, n), REFLECTOR)
      for name in ("reflector_model", "reflector_base_url", "reflector_api_key_env", "reflector_timeout",
                   "reflector_max_retries", "reflector_max_consecutive_failures", "reflector_answer_max_chars",
                   "local_reflector_step")),
    Setting("CONFIG_REFLECTOR_PADDING_EVIDENCE", ("REFLECTOR_PADDING_EVIDENCE",),
            lambda c, _: True if c.reflector_padding_evidence else None, REFLECTOR, absent="False"),
    Setting("CONFIG_REFLECTOR_CONCURRENCY", ("REFLECTOR_CONCURRENCY",), lambda c, _: c.reflector_concurrency,
            CONCURRENCY),
    Setting("CONFIG_JUDGE_BASE_URL", ("JUDGE_BASE_URL",), lambda c, _: c.judge_base_url, JUDGE_ENDPOINT),
    Setting("CONFIG_JUDGE_API_KEY_ENV", ("JUDGE_API_KEY_ENV",), lambda c, _: c.judge_api_key_env, JUDGE_ENDPOINT),
    *(Setting(f"CONFIG_{name.upper()}", (name.upper(),), lambda c, _, n=name: getattr(c, n), JUDGE_BOUND)
      for name in ("judge_timeout", "judge_max_consecutive_failures")),
    *(Setting(f"CONFIG_{name.upper()}", (name.upper(),), lambda c, _, n=name: getattr(c, n), SPEED)
      for name in ("transformers_batch_size", "transformers_device", "transformers_threads",
                   "transformers_prompt_cache_mb", "eval_concurrency",
                   "sglang_command", "sglang_urls", "sglang_port", "sglang_allow_remote", "sglang_startup_timeout",
                   "sglang_poll_interval", "sglang_request_timeout", "sglang_max_restarts", "sglang_stop_grace",
                   "logit_bias_request_timeout")),
    Setting("CONFIG_LOGIT_BIAS_URL", ("LOGIT_BIAS_URL",), lambda c, _: c.logit_bias_url, OTHER_SERVER),
    Setting("CONFIG_SGLANG_API", ("SGLANG_API",), lambda c, _: c.sglang_api,
            "which request path reaches the servers: both give the same answers for the same prompt, deltas and "
            "server (every completions answer's prompt ids are checked), so cached answers stay valid"),
    Setting("CONFIG_SGLANG_ALLOW_OTHER_MODEL", ("SGLANG_ALLOW_OTHER_MODEL",),
            lambda c, _: c.sglang_allow_other_model, OTHER_MODEL),
    Setting("CONFIG_HOLDOUT_DATA", ("HOLDOUT_DATA",), lambda c, _: c.holdout_data, HOLDOUT),
    Setting("CONFIG_HOLDOUT_INDICES", ("HOLDOUT_INDICES",), lambda c, _: c.holdout_indices, HOLDOUT),
    Setting("CONFIG_COMPARE_SIMPLE", ("COMPARE_SIMPLE",), lambda c, _: c.compare_simple, COMPARE),
    Setting("CONFIG_COMPARE_INSTRUCTION", ("COMPARE_INSTRUCTION",), lambda c, _: c.compare_instruction, COMPARE),
    Setting("CONFIG_EMBED_BATCH_SIZE", ("EMBED_BATCH_SIZE",), lambda c, _: c.embed_batch_size,
            "tokens per embedding batch of a cluster build: speed only, not an input of the clusters"),
)


def settings(strategy: str) -> tuple[Setting, ...]:
    """The settings of a run of `strategy`: the shared ones, and its options as its module
    declares them."""
    return (*SHARED_SETTINGS, *(_option(strategy, option) for option in registry.identity(strategy)), *MAY_CHANGE)


def every_setting() -> tuple[Setting, ...]:
    """The shared settings and every strategy's options: each Kconfig symbol's one place."""
    options = [_option(name, option) for name in registry.strategy_names() for option in registry.identity(name)]
    return (*SHARED_SETTINGS, *options, *MAY_CHANGE)


def __getattr__(name: str) -> object:
    """`SETTINGS`: `every_setting()`, read from the strategy modules when first asked."""
    if name == "SETTINGS":
        return every_setting()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_identity(config: Config, inputs: RunInputs) -> dict[str, str]:
    """Every setting's value under `config`, as recorded text (None: not used by this run)."""
    return {s.name: text for s in settings(config.strategy) if (text := _text(s.value(config, inputs))) is not None}


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "y" if value else "n"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return ",".join(f"{item[0]}={item[1]!r}" if isinstance(item, tuple) else str(item) for item in value)
    return str(value)


def changes(recorded: Mapping[str, str], current: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(refused, allowed): a line per setting whose value differs, refused ones with the old
    and the new value, allowed ones with what the change means. A setting the record lacks
    (a compressor_2 that did not know it started the run) is taken as it is now, unless the
    setting says what its absence stands for (`absent`); one this config does not use
    depends on one that changed (another strategy, judge or selection), whose line says so."""
    refused, allowed = [], []
    for s in every_setting():
        old, new = recorded.get(s.name, s.absent), current.get(s.name, s.absent)
        if old is None or new is None or old == new:
            continue
        if s.may_change:
            allowed.append(f"{s.name}: {old} -> {new}: {s.may_change}")
        else:
            refused.append(f"{s.name}: {old} when the run started, {new} now")
    return refused, allowed


def check_identity(archive: RunArchive, config: Config, inputs: RunInputs, context: str) -> dict[str, str]:
    """On a resume, compares the run's identity with the one recorded: refuses any refused
    change (ConfigError, one detail line per setting) and prints a line for each allowed
    change. Returns the meta rows that record this start's identity; nothing is written
    here, so that a resume refused later (a run file, a missing key) leaves the archive as
    it was: the caller records them once everything is checked."""
    current = run_identity(config, inputs)
    stored = archive.meta(IDENTITY_KEY)
    if archive.last_candidate_id() == 0:
        pass  # nothing was made under the recorded settings yet: this start defines the run
    elif stored is None:
        _check_unrecorded(archive, config, context)
        say(f"note: '{archive.path}' was started by a compressor_2 that did not record its settings; this config's "
            "are recorded now, and later resumes are compared with them")
    else:
        for line in _allowed(archive, stored, current):
            say(f"changed since the last start: {line}")
    return {IDENTITY_KEY: json.dumps(current), "strategy": config.strategy}


def recorded_context(archive: RunArchive) -> str | None:
    """The answer context a run recorded (its answers are cached under it), when a resume
    keeps it: the run recorded its identity, which covers every setting of the context (the
    model by what it holds, not by its path), so a resume the identity lets through answers
    as the run did, and a copied or moved model keeps its cached answers."""
    if archive.last_candidate_id() == 0 or archive.meta(IDENTITY_KEY) is None:
        return None
    return archive.meta("context")


def check_settings(archive: RunArchive, config: Config, inputs: RunInputs) -> None:
    """`check_identity`'s refusal on what is known before the clusters are built (`inputs`
    without the clusters and the initial deltas; the clusters' own settings among it), and
    nothing written: a refused resume must not rebuild the clusters it was started on."""
    stored = archive.meta(IDENTITY_KEY)
    if archive.last_candidate_id() and stored is not None:
        _allowed(archive, stored, run_identity(config, inputs))


def _allowed(archive: RunArchive, stored: str, current: Mapping[str, str]) -> list[str]:
    """The allowed changes from the recorded identity to `current`; a ConfigError for
    refused ones."""
    refused, allowed = changes(_recorded(archive, stored), current)
    if refused:
        raise ConfigError(
            f"'{archive.path}' holds a run started with other settings, and a resume must not change them "
            "(the scores, or the search, would mix two runs):",
            [*refused, f"Set them back to resume this run; to start a fresh run with the new settings, choose "
                       f"another CONFIG_OUTPUT_DIR (or move '{archive.path.parent}' away)."])
    return allowed


def _recorded(archive: RunArchive, stored: str) -> dict[str, str]:
    try:
        recorded = json.loads(stored)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise ConfigError(f"'{archive.path}' table meta, row {IDENTITY_KEY}: not a JSON object of settings and their "
                          "values; delete that row to record this config's settings at the next start")
    return recorded


def _check_unrecorded(archive: RunArchive, config: Config, context: str) -> None:
    """What a run started before identities were recorded did record: its strategy and the
    answer context (the digest of the settings that make an answer and its verdict)."""
    lines = []
    strategy = archive.meta("strategy")
    if strategy is not None and strategy != config.strategy:
        lines.append(f"CONFIG_STRATEGY_*: {strategy} when the run started, {config.strategy} now")
    recorded = archive.meta("context")
    if recorded is not None and recorded != context:
        lines.append("the model, engine, clusters, CONFIG_MAX_NEW_TOKENS, CONFIG_TEMPERATURE, judge or tolerance "
                     "(recorded as one answer context): changed since the run started")
    if lines:
        raise ConfigError(
            f"'{archive.path}' holds a run started with other settings, and a resume must not change them:",
            [*lines, f"Set them back to resume this run; to start a fresh run, choose another CONFIG_OUTPUT_DIR "
                     f"(or move '{archive.path.parent}' away)."])
