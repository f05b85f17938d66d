"""Load a Kconfig `.config` into one frozen, typed `Config`, refusing anything suspicious.

kconfiglib never raises on a bad value: it warns and falls back to the default.
Here every warning, unknown name, dependency-unmet assignment, unparsable float and
out-of-range value is a `ConfigError` naming the symbol and the value.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import kconfiglib

from compressor_2.errors import ConfigError

KCONFIG_PATH = Path(__file__).resolve().parent.parent / "Kconfig"

EngineName = Literal["transformers", "sglang"]
JudgeName = Literal["numeric", "llm", "hybrid"]
ReflectorName = Literal["local", "openai"]
SELECTIONS = ("tournament", "truncation", "llm")
FALLBACK_SELECTIONS = ("tournament", "truncation")
MUTATION_SCOPES = ("cluster", "vector")


@dataclass(frozen=True)
class ArchiveOptions:
    """Seed 003's options (CONFIG_ARCHIVE_*)."""

    iterations: int
    parents_per_iteration: int
    replace: bool
    sharpness: float
    midpoint: float | None  # a fixed midpoint, or
    midpoint_percentile: float | None  # a percentile of the archive's fitness values
    novelty_weight: float
    issue_batch: int
    issue_weights: tuple[tuple[str, float], ...]
    generators: tuple[str, ...]
    generation_concurrency: int
    assessment_concurrency: int
    feedback_scope: str
    feedback_depth: int
    postcheck_examples: int
    postcheck_margin: float
    delta_limit: float


@dataclass(frozen=True)
class GepaOptions:
    """Seed 004's options (CONFIG_GEPA_*)."""

    valset_size: int
    valset_indices: str  # "" or pool positions such as "0-9,20"
    minibatch_size: int
    candidate_selector: str
    epsilon: float
    skip_perfect: bool
    component_selector: str
    use_merge: bool
    max_merge_invocations: int
    merge_eps: float
    merge_subsample: int
    val_overlap_floor: int


@dataclass(frozen=True)
class RandomOptions:
    """Random search's options (CONFIG_RANDOM_*)."""

    distribution: str
    scale: float
    batch_size: int
    batches: int


@dataclass(frozen=True)
class CmaesOptions:
    """CMA-ES's options (CONFIG_CMAES_*)."""

    sigma: float
    population: int  # 0: DEAP's default
    generations: int


DISTRIBUTIONS = ("normal", "uniform")
CANDIDATE_SELECTORS = ("pareto", "current_best", "epsilon_greedy")
COMPONENT_SELECTORS = ("round_robin", "all")
ISSUE_TYPES = ("cut_short", "wrong", "padded", "refusal")
ARCHIVE_GENERATORS = ("cluster", "vector", "crossover")
FEEDBACK_SCOPES = ("none", "ancestors", "neighborhood")


@dataclass(frozen=True)
class Config:
    """Every setting of a run; built only by `load_config`, which validated it."""

    # Paths
    output_dir: Path
    cluster_dir: Path
    cluster_descriptions_path: Path
    initial_deltas_path: Path
    # Dataset
    financebench_jsonl_path: Path
    pool_indices: str
    prompt_template_path: Path | None
    evidence_max_chars: int
    # Engine
    engine: EngineName
    model_path: str
    max_new_tokens: int
    temperature: float
    transformers_batch_size: int
    transformers_device: str
    transformers_threads: int
    eval_concurrency: int
    sglang_command: str
    sglang_urls: tuple[str, ...]
    sglang_port: int
    sglang_allow_remote: bool
    sglang_startup_timeout: float
    sglang_poll_interval: float
    sglang_request_timeout: float
    sglang_max_restarts: int
    sglang_stop_grace: float
    # Fitness (lambdas normalised to sum to 1)
    lambda_shortness: float
    lambda_correctness: float
    shortness_scale: float
    # Correctness judge
    judge: JudgeName
    correctness_tolerance: float
    judge_model: str
    judge_base_url: str
    judge_api_key_env: str
    # Reflector
    reflector: ReflectorName
    reflector_model: str
    reflector_base_url: str
    reflector_api_key_env: str
    reflector_timeout: float
    reflector_max_retries: int
    reflector_max_consecutive_failures: int
    reflector_concurrency: int
    reflector_answer_max_chars: int
    local_reflector_step: float
    # Strategy and budgets (0: unlimited)
    strategy: str
    max_metric_calls: int
    max_reflector_tokens: int
    max_wall_minutes: float
    archive: ArchiveOptions | None  # with strategy "archive"
    gepa: GepaOptions | None  # with strategy "gepa"
    random: RandomOptions | None  # with strategy "random"
    cmaes: CmaesOptions | None  # with strategy "cmaes"
    # Genetic algorithm
    seed: int
    population_size: int
    ngen: int
    cxpb: float
    mutpb: float
    elitism_size: int
    selection: str
    selection_fallback: str | None  # with selection "llm"
    tournament_size: int | None
    truncation_top_k: int | None
    mutation_scope: str
    # Clustering
    embedding_model: str
    pca_components: int
    num_clusters: int
    embed_batch_size: int
    cluster_seed: int

    def summary(self) -> str:
        """The resolved settings, one `name = value` a line, for `check-config`."""
        nested = {"archive": self.archive, "gepa": self.gepa, "random": self.random, "cmaes": self.cmaes}
        pairs = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in nested]
        for name, options in nested.items():
            if options is not None:
                pairs += [(f"{name}.{f.name}", getattr(options, f.name)) for f in dataclasses.fields(options)]
        width = max(len(name) for name, _ in pairs)
        return "\n".join(f"{name.ljust(width)} = {_show(value)}" for name, value in pairs)


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(none)"
    return "(none)" if value is None else str(value)


class _Reader:
    """Typed access to symbol values, each failure naming `CONFIG_<NAME>`."""

    def __init__(self, kconf: kconfiglib.Kconfig) -> None:
        self._kconf = kconf

    def _sym(self, name: str) -> kconfiglib.Symbol:
        return self._kconf.syms[name]

    def raw(self, name: str) -> str:
        sym = self._sym(name)
        if sym.visibility or not sym.defaults:
            return sym.str_value
        # A symbol whose dependency is unmet reads as "": keep its Kconfig default
        # so the dataclass stays fully typed (the setting is simply unused).
        return sym.defaults[0][0].str_value

    def string(self, name: str) -> str:
        return self.raw(name)

    def integer(self, name: str) -> int:
        value = self.raw(name)
        try:
            # Base 10, as kconfiglib reads an int symbol: "01" is 1 there, so it is here.
            return int(value, 10)
        except ValueError:
            raise ConfigError(f"CONFIG_{name}={value!r} is not an integer") from None

    def number(self, name: str) -> float:
        value = self.raw(name).strip()
        try:
            parsed = float(value)
        except ValueError:
            raise ConfigError(f"CONFIG_{name}={value!r} is not a number") from None
        if not math.isfinite(parsed):
            raise ConfigError(f"CONFIG_{name}={value!r} is not a finite number")
        return parsed

    def flag(self, name: str) -> bool:
        return self._sym(name).tri_value == 2

    def choice(self, options: dict[str, str]) -> str:
        return next(label for sym, label in options.items() if self.flag(sym))

    def choice_suffix(self, prefix: str) -> str:
        """The selected `PREFIX_NAME` symbol of the choice whose symbols start with
        `prefix`, as `name`: a new entry in Kconfig needs no list here."""
        choice = next(sym.choice for name, sym in self._kconf.syms.items()
                      if name.startswith(prefix) and sym.choice is not None)
        return choice.selection.name.removeprefix(prefix).lower()


def _check_kconfig_warnings(kconf: kconfiglib.Kconfig) -> None:
    if kconf.warnings:
        message = kconf.warnings[0].replace("warning: ", "")
        message = re.sub(r"\s*\(defined at [^)]*\)", "", message)
        # We refuse instead of falling back, so kconfiglib's "ignored" wording would mislead.
        message = re.sub(r"\s*(--\s*)?(falling back on defaults|[.,]?\s*[Aa]ssignment ignored\.?)", "", message)
        # kconfiglib names symbols without the prefix users see in .config files.
        message = re.sub(
            r"\b(?<!CONFIG_)([A-Z][A-Z0-9_]{2,})\b",
            lambda m: f"CONFIG_{m[1]}" if m[1] in kconf.syms or "symbol " + m[1] in message else m[1],
            message,
        )
        raise ConfigError(" ".join(message.split()))


def _symbol_name(sc: kconfiglib.Symbol) -> str:
    """A symbol as users write it in .config; a constant (`"llm"` in `SELECTION = "llm"`) quoted."""
    return f'"{sc.name}"' if sc.is_constant else f"CONFIG_{sc.name}"


def _check_unmet_assignments(kconf: kconfiglib.Kconfig) -> None:
    for sym in kconf.unique_defined_syms:
        if sym.user_value is None:
            continue
        if sym.orig_type in (kconfiglib.BOOL, kconfiglib.TRISTATE):
            effective, given = sym.tri_value, sym.user_value
            shown = {0: "n", 1: "m", 2: "y"}.get(given, str(given))
        else:
            effective, given = sym.str_value, sym.user_value
            shown = str(given)
        if effective != given:
            if sym.choice is not None:
                raise ConfigError(
                    f"CONFIG_{sym.name}={shown} conflicts with another choice in the same menu "
                    f"(only one of {', '.join('CONFIG_' + s.name for s in sym.choice.syms)} may be y)"
                )
            raise ConfigError(
                f"CONFIG_{sym.name}={shown} is set but its dependency "
                f"({kconfiglib.expr_str(sym.direct_dep, _symbol_name)}) is not met, "
                "so it would be ignored"
            )


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _sentinel(r: _Reader, name: str) -> None:
    value = r.raw(name)
    _require(
        value not in ("", "-1"),
        f"CONFIG_{name} is not set (still at its sentinel {value!r}); "
        "the genetic-algorithm options have no defaults: set it with `make menuconfig`",
    )


def load_config(path: str | Path) -> Config:
    """Parse, check and freeze the `.config` at `path`."""
    path = Path(path)
    _check_readable(path)
    kconf = kconfiglib.Kconfig(str(KCONFIG_PATH), warn_to_stderr=False)
    kconf.warn_assign_undef = True
    kconf.warn_assign_override = True
    # A line repeated with the same value is refused too: one of the two was meant to be another.
    kconf.warn_assign_redun = True
    kconf.load_config(str(path))
    for sym in kconf.unique_defined_syms:
        sym.str_value  # range warnings are only emitted when a value is computed
    _check_kconfig_warnings(kconf)
    _check_unmet_assignments(kconf)
    config = _build(_Reader(kconf))
    if config.engine == "sglang":
        # Imported here: the engine's module needs the Config this module defines.
        from compressor_2.engines.sglang_server import check_addresses

        check_addresses(config)
    return config


def _check_readable(path: Path) -> None:
    """A config kconfiglib can read: it would report a directory or a non-UTF-8 byte with an
    exception naming no line."""
    if path.is_dir():
        raise ConfigError(f"config file '{path}' is a directory: pass the .config file itself")
    if not path.is_file():
        raise ConfigError(
            f"config file '{path}' not found: create it with `make defconfig` "
            "(the embedded default) or `make menuconfig`, or pass --config PATH"
        )
    try:
        data = path.read_bytes()
        data.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file '{path}' cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file '{path}' line {line}: byte {data[exc.start]:#04x} is not UTF-8; "
                          "save the file as UTF-8") from None


def _build(r: _Reader) -> Config:
    for name in (
        "INITIAL_DELTAS_PATH", "POPULATION_SIZE", "NGEN", "CXPB", "MUTPB",
        "ELITISM_SIZE", "SELECTION", "LAMBDA_SHORTNESS", "LAMBDA_CORRECTNESS",
    ):
        _sentinel(r, name)

    population = r.integer("POPULATION_SIZE")
    _require(population >= 2, f"CONFIG_POPULATION_SIZE={population} must be at least 2")
    ngen = r.integer("NGEN")
    _require(ngen >= 1, f"CONFIG_NGEN={ngen} must be at least 1")
    elitism = r.integer("ELITISM_SIZE")
    _require(
        0 <= elitism < population,
        f"CONFIG_ELITISM_SIZE={elitism} must satisfy 0 <= elitism < population ({population})",
    )
    probabilities = {name: r.number(name) for name in ("CXPB", "MUTPB")}
    for name, value in probabilities.items():
        _require(0.0 <= value <= 1.0, f"CONFIG_{name}={value} must be in [0, 1]")

    selection = r.string("SELECTION").strip()
    _require(
        selection in SELECTIONS,
        f"CONFIG_SELECTION={selection!r} is unknown; use one of {', '.join(SELECTIONS)}",
    )
    fallback = None
    if selection == "llm":
        fallback = r.string("SELECTION_FALLBACK").strip()
        _require(fallback != "", 'CONFIG_SELECTION_FALLBACK is not set but CONFIG_SELECTION="llm" needs it '
                 f"(one of {', '.join(FALLBACK_SELECTIONS)})")
        _require(fallback in FALLBACK_SELECTIONS, f"CONFIG_SELECTION_FALLBACK={fallback!r} is unknown; use one of "
                 f"{', '.join(FALLBACK_SELECTIONS)}")
    drawn = {selection, fallback}
    sizes = {"TOURNAMENT_SIZE": "tournament", "TRUNCATION_TOP_K": "truncation"}
    used = {name: _selection_size(r, name, population) for name, kind in sizes.items() if kind in drawn}
    for name, kind in sizes.items():
        # A size no selection reads is a sign that the selection is not the one meant.
        _require(name in used or r.integer(name) == -1,
                 f"CONFIG_{name}={r.integer(name)} is set but no selection draws by {kind} "
                 f"(CONFIG_SELECTION={selection!r}"
                 f"{f', CONFIG_SELECTION_FALLBACK={fallback!r}' if fallback else ''}): set it to -1 (unset)")
    scope = r.string("MUTATION_SCOPE").strip()
    _require(scope in MUTATION_SCOPES,
             f"CONFIG_MUTATION_SCOPE={scope!r} is unknown; use one of {', '.join(MUTATION_SCOPES)}")

    lambdas = {name: r.number(name) for name in ("LAMBDA_SHORTNESS", "LAMBDA_CORRECTNESS")}
    for name, value in lambdas.items():
        _require(0.0 <= value <= 1.0, f"CONFIG_{name}={value} must be in [0, 1]")
    total = sum(lambdas.values())
    _require(total > 0, "CONFIG_LAMBDA_SHORTNESS and CONFIG_LAMBDA_CORRECTNESS are both 0")

    wall_minutes = r.number("MAX_WALL_MINUTES")
    _require(wall_minutes >= 0, f"CONFIG_MAX_WALL_MINUTES={wall_minutes} must be >= 0 (0: unlimited)")

    def positive(name: str) -> float:
        value = r.number(name)
        _require(value > 0, f"CONFIG_{name}={value} must be greater than 0")
        return value

    temperature = r.number("TEMPERATURE")
    _require(temperature >= 0, f"CONFIG_TEMPERATURE={temperature} must be >= 0")
    tolerance = r.number("CORRECTNESS_TOLERANCE")
    _require(0 <= tolerance < 1, f"CONFIG_CORRECTNESS_TOLERANCE={tolerance} must be in [0, 1)")

    pool = r.string("FINANCEBENCH_POOL_INDICES").strip()
    _require(
        re.fullmatch(r"all|\d+(-\d+)?(\s*,\s*\d+(-\d+)?)*", pool) is not None,
        f"CONFIG_FINANCEBENCH_POOL_INDICES={pool!r} must be 'all' or indices/ranges like '0,3,5-9'",
    )
    template = r.string("PROMPT_TEMPLATE_PATH").strip()
    urls = tuple(u.strip().rstrip("/") for u in r.string("SGLANG_URLS").split(",") if u.strip())
    for url in urls:
        _require(
            re.match(r"https?://", url) is not None,
            f"CONFIG_SGLANG_URLS has {url!r}, which is not an http(s):// URL",
        )
    for name in ("OUTPUT_DIR", "CLUSTER_DIR", "CLUSTER_DESCRIPTIONS_PATH", "MODEL_PATH",
                 "FINANCEBENCH_JSONL_PATH", "EMBEDDING_MODEL"):
        _require(r.string(name).strip() != "", f"CONFIG_{name} is empty")

    return Config(
        output_dir=Path(r.string("OUTPUT_DIR")),
        cluster_dir=Path(r.string("CLUSTER_DIR")),
        cluster_descriptions_path=Path(r.string("CLUSTER_DESCRIPTIONS_PATH")),
        initial_deltas_path=Path(r.string("INITIAL_DELTAS_PATH")),
        financebench_jsonl_path=Path(r.string("FINANCEBENCH_JSONL_PATH")),
        pool_indices=pool,
        prompt_template_path=Path(template) if template else None,
        evidence_max_chars=r.integer("EVIDENCE_MAX_CHARS"),
        engine=r.choice({"ENGINE_TRANSFORMERS": "transformers", "ENGINE_SGLANG": "sglang"}),  # type: ignore[arg-type]
        model_path=r.string("MODEL_PATH"),
        max_new_tokens=r.integer("MAX_NEW_TOKENS"),
        temperature=temperature,
        transformers_batch_size=r.integer("TRANSFORMERS_BATCH_SIZE"),
        transformers_device=r.string("TRANSFORMERS_DEVICE"),
        transformers_threads=r.integer("TRANSFORMERS_THREADS"),
        eval_concurrency=r.integer("EVAL_CONCURRENCY"),
        sglang_command=r.string("SGLANG_COMMAND"),
        sglang_urls=urls,
        sglang_port=r.integer("SGLANG_PORT"),
        sglang_allow_remote=r.flag("SGLANG_ALLOW_REMOTE"),
        sglang_startup_timeout=float(r.integer("SGLANG_STARTUP_TIMEOUT")),
        sglang_poll_interval=positive("SGLANG_POLL_INTERVAL"),
        sglang_request_timeout=float(r.integer("SGLANG_REQUEST_TIMEOUT")),
        sglang_max_restarts=r.integer("SGLANG_MAX_RESTARTS"),
        sglang_stop_grace=float(r.integer("SGLANG_STOP_GRACE")),
        lambda_shortness=lambdas["LAMBDA_SHORTNESS"] / total,
        lambda_correctness=lambdas["LAMBDA_CORRECTNESS"] / total,
        shortness_scale=positive("SHORTNESS_SCALE"),
        judge=r.choice({"JUDGE_NUMERIC": "numeric", "JUDGE_LLM": "llm", "JUDGE_HYBRID": "hybrid"}),  # type: ignore[arg-type]
        correctness_tolerance=tolerance,
        judge_model=r.string("JUDGE_MODEL"),
        judge_base_url=r.string("JUDGE_BASE_URL"),
        judge_api_key_env=r.string("JUDGE_API_KEY_ENV"),
        reflector=r.choice({"REFLECTOR_LOCAL": "local", "REFLECTOR_OPENAI": "openai"}),  # type: ignore[arg-type]
        reflector_model=r.string("REFLECTOR_MODEL"),
        reflector_base_url=r.string("REFLECTOR_BASE_URL"),
        reflector_api_key_env=r.string("REFLECTOR_API_KEY_ENV"),
        reflector_timeout=float(r.integer("REFLECTOR_TIMEOUT")),
        reflector_max_retries=r.integer("REFLECTOR_MAX_RETRIES"),
        reflector_max_consecutive_failures=r.integer("REFLECTOR_MAX_CONSECUTIVE_FAILURES"),
        reflector_concurrency=r.integer("REFLECTOR_CONCURRENCY"),
        reflector_answer_max_chars=r.integer("REFLECTOR_ANSWER_MAX_CHARS"),
        local_reflector_step=positive("LOCAL_REFLECTOR_STEP"),
        strategy=r.choice_suffix("STRATEGY_"),
        max_metric_calls=r.integer("MAX_METRIC_CALLS"),
        max_reflector_tokens=r.integer("MAX_REFLECTOR_TOKENS"),
        max_wall_minutes=wall_minutes,
        archive=_archive_options(r) if r.choice_suffix("STRATEGY_") == "archive" else None,
        gepa=_gepa_options(r, r.integer("MAX_METRIC_CALLS")) if r.choice_suffix("STRATEGY_") == "gepa" else None,
        random=_random_options(r) if r.choice_suffix("STRATEGY_") == "random" else None,
        cmaes=_cmaes_options(r) if r.choice_suffix("STRATEGY_") == "cmaes" else None,
        seed=r.integer("SEED"),
        population_size=population,
        ngen=ngen,
        cxpb=probabilities["CXPB"],
        mutpb=probabilities["MUTPB"],
        elitism_size=elitism,
        selection=selection,
        selection_fallback=fallback,
        tournament_size=used.get("TOURNAMENT_SIZE"),
        truncation_top_k=used.get("TRUNCATION_TOP_K"),
        mutation_scope=scope,
        embedding_model=r.string("EMBEDDING_MODEL"),
        pca_components=r.integer("PCA_COMPONENTS"),
        num_clusters=r.integer("NUM_CLUSTERS"),
        embed_batch_size=r.integer("EMBED_BATCH_SIZE"),
        cluster_seed=r.integer("CLUSTER_SEED"),
    )


def _selection_size(r: _Reader, name: str, population: int) -> int:
    value = r.integer(name)
    _require(value != -1, f"CONFIG_{name} is not set (still at its sentinel -1) but CONFIG_SELECTION "
             "(or CONFIG_SELECTION_FALLBACK) needs it")
    _require(
        2 <= value <= population,
        f"CONFIG_{name}={value} must be in [2, population] = [2, {population}]",
    )
    return value


def _archive_options(r: _Reader) -> ArchiveOptions:
    def at_least(name: str, low: float, strict: bool = False) -> float:
        value = r.number(name)
        _require(value > low if strict else value >= low,
                 f"CONFIG_{name}={value} must be {'>' if strict else '>='} {low:g}")
        return value

    midpoint = r.string("ARCHIVE_MIDPOINT").strip()
    fixed, percentile = None, None
    if midpoint.startswith("p"):
        try:
            percentile = float(midpoint[1:])
        except ValueError:
            percentile = math.nan
        _require(0 <= percentile <= 100, f"CONFIG_ARCHIVE_MIDPOINT={midpoint!r}: a percentile is p0 .. p100")
    else:
        fixed = r.number("ARCHIVE_MIDPOINT")
    weights = []
    for part in filter(None, (p.strip() for p in r.string("ARCHIVE_ISSUE_WEIGHTS").split(","))):
        name, _, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        _require(name.strip() in ISSUE_TYPES and math.isfinite(weight) and weight >= 0,
                 f"CONFIG_ARCHIVE_ISSUE_WEIGHTS has {part!r}: write type=weight with a type among "
                 f"{', '.join(ISSUE_TYPES)} and a weight >= 0")
        weights.append((name.strip(), weight))
    _require(any(w > 0 for _, w in weights), "CONFIG_ARCHIVE_ISSUE_WEIGHTS gives no issue type a weight above 0")
    generators = tuple(g.strip() for g in r.string("ARCHIVE_GENERATORS").split(",") if g.strip())
    _require(bool(generators) and all(g in ARCHIVE_GENERATORS for g in generators)
             and len(set(generators)) == len(generators),
             f"CONFIG_ARCHIVE_GENERATORS={','.join(generators)!r} must name some of "
             f"{', '.join(ARCHIVE_GENERATORS)}, each once")
    scope = r.string("ARCHIVE_FEEDBACK_SCOPE").strip()
    _require(scope in FEEDBACK_SCOPES,
             f"CONFIG_ARCHIVE_FEEDBACK_SCOPE={scope!r} is unknown; use one of {', '.join(FEEDBACK_SCOPES)}")
    return ArchiveOptions(
        iterations=r.integer("ARCHIVE_ITERATIONS"),
        parents_per_iteration=r.integer("ARCHIVE_PARENTS_PER_ITERATION"),
        replace=r.flag("ARCHIVE_REPLACE"),
        sharpness=at_least("ARCHIVE_SHARPNESS", 0, strict=True),
        midpoint=fixed,
        midpoint_percentile=percentile,
        novelty_weight=at_least("ARCHIVE_NOVELTY_WEIGHT", 0),
        issue_batch=r.integer("ARCHIVE_ISSUE_BATCH"),
        issue_weights=tuple(weights),
        generators=generators,
        generation_concurrency=r.integer("ARCHIVE_GENERATION_CONCURRENCY"),
        assessment_concurrency=r.integer("ARCHIVE_ASSESSMENT_CONCURRENCY"),
        feedback_scope=scope,
        feedback_depth=r.integer("ARCHIVE_FEEDBACK_DEPTH"),
        postcheck_examples=r.integer("ARCHIVE_POSTCHECK_EXAMPLES"),
        postcheck_margin=at_least("ARCHIVE_POSTCHECK_MARGIN", 0),
        delta_limit=at_least("ARCHIVE_DELTA_LIMIT", 0, strict=True),
    )


def _random_options(r: _Reader) -> RandomOptions:
    distribution = r.string("RANDOM_DISTRIBUTION").strip()
    _require(distribution in DISTRIBUTIONS, f"CONFIG_RANDOM_DISTRIBUTION={distribution!r} is unknown; use one of "
             f"{', '.join(DISTRIBUTIONS)}")
    scale = r.number("RANDOM_SCALE")
    _require(scale > 0, f"CONFIG_RANDOM_SCALE={scale} must be > 0")
    return RandomOptions(distribution, scale, r.integer("RANDOM_BATCH_SIZE"), r.integer("RANDOM_BATCHES"))


def _cmaes_options(r: _Reader) -> CmaesOptions:
    sigma = r.number("CMAES_SIGMA")
    _require(sigma > 0, f"CONFIG_CMAES_SIGMA={sigma} must be > 0")
    population = r.integer("CMAES_POPULATION")
    _require(population == 0 or population >= 2, f"CONFIG_CMAES_POPULATION={population} must be 0 (DEAP's "
             "default) or at least 2: CMA-ES updates from the better half")
    return CmaesOptions(sigma, population, r.integer("CMAES_GENERATIONS"))


def _gepa_options(r: _Reader, max_metric_calls: int) -> GepaOptions:
    _require(max_metric_calls > 0, "CONFIG_STRATEGY_GEPA needs CONFIG_MAX_METRIC_CALLS > 0: the metric-call "
             "budget is GEPA's natural stopping criterion")
    indices = r.string("GEPA_VALSET_INDICES").strip()
    _require(indices == "" or re.fullmatch(r"\d+(-\d+)?(\s*,\s*\d+(-\d+)?)*", indices) is not None,
             f"CONFIG_GEPA_VALSET_INDICES={indices!r} must be empty or pool positions such as '0-9,20'")
    selector = r.string("GEPA_CANDIDATE_SELECTOR").strip()
    _require(selector in CANDIDATE_SELECTORS, f"CONFIG_GEPA_CANDIDATE_SELECTOR={selector!r} is unknown; use one "
             f"of {', '.join(CANDIDATE_SELECTORS)}")
    component = r.string("GEPA_COMPONENT_SELECTOR").strip()
    _require(component in COMPONENT_SELECTORS, f"CONFIG_GEPA_COMPONENT_SELECTOR={component!r} is unknown; use "
             f"one of {', '.join(COMPONENT_SELECTORS)}")
    epsilon = r.number("GEPA_EPSILON")
    _require(0 <= epsilon <= 1, f"CONFIG_GEPA_EPSILON={epsilon} must be in [0, 1]")
    eps = r.number("GEPA_MERGE_EPS")
    _require(eps >= 0, f"CONFIG_GEPA_MERGE_EPS={eps} must be >= 0")
    return GepaOptions(
        valset_size=r.integer("GEPA_VALSET_SIZE"), valset_indices=indices,
        minibatch_size=r.integer("GEPA_MINIBATCH_SIZE"), candidate_selector=selector, epsilon=epsilon,
        skip_perfect=r.flag("GEPA_SKIP_PERFECT"), component_selector=component, use_merge=r.flag("GEPA_USE_MERGE"),
        max_merge_invocations=r.integer("GEPA_MAX_MERGE_INVOCATIONS"), merge_eps=eps,
        merge_subsample=r.integer("GEPA_MERGE_SUBSAMPLE"), val_overlap_floor=r.integer("GEPA_VAL_OVERLAP_FLOOR"),
    )
