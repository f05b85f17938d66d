"""The one entry point of configuration: `load_config` reads a Kconfig `.config` into one
frozen, typed `Config`, refusing anything suspicious.

Reading and typed access are `kconfig`'s; each strategy's options are parsed by its own
module, found through the strategy registry (`registry`), and the SGLang launch and address
rule by `sglang`. Here: every other setting, each checked (unparsable floats, out-of-range
values, sentinels) and reported as a `ConfigError` naming the symbol and the value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from compressor_2.config import registry
from compressor_2.config.indices import INDICES, check_each_once
from compressor_2.config.kconfig import MAX_LOGITS, Reader, interval, read_config, require
from compressor_2.config.sglang import check_addresses

EngineName = Literal["transformers", "sglang", "logit_bias"]
SGLangApi = Literal["auto", "generate", "completions"]
SGLANG_APIS = ("auto", "generate", "completions")
JudgeName = Literal["numeric", "llm", "hybrid"]
ReflectorName = Literal["local", "openai"]
MAX_WALL_MINUTES = 1e9
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0
MAX_INSTRUCTION = 2000  # characters of CONFIG_COMPARE_INSTRUCTION
# What the transformers engine can run on: `meta` holds no weights, and a typo such as `gpu` is no device.
DEVICES = r"auto|cpu|mps|(cuda|xpu)(:[0-9]+)?"
DESCRIPTIONS_FILE = "cluster_descriptions.json"  # in CONFIG_CLUSTER_DIR, unless CONFIG_CLUSTER_DESCRIPTIONS_PATH says


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
    holdout_data: Path | None  # the held-out file; None: FINANCEBENCH_JSONL_PATH (with holdout_indices)
    holdout_indices: str  # "" with holdout_data None: no held-out check
    # The simpler tools measured after the search
    compare_simple: bool
    compare_instruction: str  # "": none
    instruction_in_search: bool  # every prompt of the run carries compare_instruction
    # Engine
    engine: EngineName
    model_path: str
    max_new_tokens: int
    temperature: float
    transformers_batch_size: int
    transformers_device: str
    transformers_threads: int
    transformers_prompt_cache_mb: int
    eval_concurrency: int
    sglang_command: str
    sglang_urls: tuple[str, ...]
    sglang_api: SGLangApi
    sglang_port: int
    sglang_allow_remote: bool
    sglang_allow_other_model: bool
    sglang_deterministic: bool
    sglang_startup_timeout: float
    sglang_poll_interval: float
    sglang_request_timeout: float
    sglang_max_restarts: int
    sglang_stop_grace: float
    logit_bias_url: str  # the server's base URL, without /v1 and a trailing slash
    logit_bias_request_timeout: float
    # Fitness (lambdas normalised to sum to 1)
    lambda_shortness: float
    lambda_correctness: float
    shortness_scale: float
    best_rule: str  # "fittest", or "shortest": the fewest tokens among candidates as correct as the baseline
    # Correctness judge
    judge: JudgeName
    correctness_tolerance: float
    judge_model: str
    judge_base_url: str
    judge_api_key_env: str
    judge_timeout: float
    judge_max_consecutive_failures: int
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
    reflector_padding_evidence: bool  # the reflectors read the stop oracle's evidence (numeric judge only)
    # Strategy and budgets (0: unlimited)
    strategy: str
    max_metric_calls: int
    max_reflector_tokens: int
    max_wall_minutes: float
    max_idle_steps: int  # steps in a row without a fresh metric call before the run stops
    # Each strategy's options this config sets, by name, read by its own module: the chosen
    # one's, and those every config sets (the GA's). `config.<name>` reads them too.
    strategy_options: Mapping[str, Any]
    seed: int  # every strategy's RNG
    delta_phases: int  # answer phases, one delta vector each (CONFIG_DELTA_PHASES); 1: one vector
    # Clustering
    embedding_model: str
    pca_components: int
    num_clusters: int
    embed_batch_size: int
    cluster_seed: int
    role_clusters: bool  # layout, markup and punctuation in clusters of their own (clusters/roles.py)
    source: Path | None = None  # the .config it was loaded from

    def __getattr__(self, name: str) -> Any:
        """`config.ga`, `config.gepa`, ...: a strategy's options, when this config sets them."""
        options = self.__dict__.get("strategy_options", {})
        if name in options:
            return options[name]
        raise AttributeError(f"'Config' object has no attribute {name!r}")

    def summary(self) -> str:
        """The resolved settings, one `name = value` a line, for `check-config`."""
        pairs = [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "strategy_options"]
        for name, options in self.strategy_options.items():
            # Options every config sets are listed plainly (the GA's, as always); the chosen
            # strategy's under its name.
            prefix = "" if registry.always_read(name) else f"{name}."
            pairs += [(f"{prefix}{f.name}", getattr(options, f.name)) for f in dataclasses.fields(options)]
        width = max(len(name) for name, _ in pairs)
        return "\n".join(f"{name.ljust(width)} = {_show(value)}" for name, value in pairs)


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(none)"
    return "(none)" if value is None else str(value)


def _sentinel(r: Reader, name: str) -> None:
    value = r.raw(name)
    require(
        value not in ("", "-1"),
        f"CONFIG_{name} is not set (still at its sentinel {value!r}); "
        "the genetic-algorithm options have no defaults: set it with `make menuconfig`",
    )


def load_config(path: str | Path) -> Config:
    """Parse, check and freeze the `.config` at `path`."""
    config = dataclasses.replace(_build(read_config(Path(path))), source=Path(path))
    if config.engine == "sglang":
        check_addresses(config)
    return config


def _build(r: Reader) -> Config:
    always = tuple(name for name in registry.strategy_names() if registry.always_read(name))
    for name in ("INITIAL_DELTAS_PATH", *registry.sentinels(always), "LAMBDA_SHORTNESS", "LAMBDA_CORRECTNESS"):
        _sentinel(r, name)
    options = registry.read(always, r)
    checked = _checked(r)
    strategy = r.choice_suffix("STRATEGY_")
    return Config(**_paths_and_data(r, checked), **_engine(r, checked), **_fitness_and_reflector(r, checked),
                  **_search(r, checked, strategy, options),
                  embedding_model=r.string("EMBEDDING_MODEL"),
                  pca_components=r.integer("PCA_COMPONENTS"),
                  num_clusters=r.integer("NUM_CLUSTERS"),
                  embed_batch_size=r.integer("EMBED_BATCH_SIZE"),
                  cluster_seed=r.integer("CLUSTER_SEED"),
                  role_clusters=r.flag("ROLE_CLUSTERS"))


def _checked(r: Reader) -> dict[str, Any]:
    """The settings that need more than their symbol's type and range, checked in this order."""
    lambdas = {name: r.number(name, 0, 1) for name in ("LAMBDA_SHORTNESS", "LAMBDA_CORRECTNESS")}
    total = sum(lambdas.values())
    require(total > 0, "CONFIG_LAMBDA_SHORTNESS and CONFIG_LAMBDA_CORRECTNESS are both 0")

    wall_minutes = r.number("MAX_WALL_MINUTES", 0, MAX_WALL_MINUTES)
    temperature = r.number("TEMPERATURE", 0, MAX_TEMPERATURE)
    require(temperature == 0 or temperature >= MIN_TEMPERATURE,
            f"CONFIG_TEMPERATURE={r.raw('TEMPERATURE')} must be 0 (greedy) or {interval(MIN_TEMPERATURE, MAX_TEMPERATURE)}: "
            "dividing the logits by less overflows them")
    tolerance = r.number("CORRECTNESS_TOLERANCE", 0, 1)
    require(tolerance < 1, f"CONFIG_CORRECTNESS_TOLERANCE={tolerance} must be in [0, 1)")

    pool = r.string("FINANCEBENCH_POOL_INDICES").strip()
    require(
        re.fullmatch(INDICES, pool) is not None,
        f"CONFIG_FINANCEBENCH_POOL_INDICES={pool!r} must be 'all' or indices/ranges like '0,3,5-9'",
    )
    check_each_once(pool, "CONFIG_FINANCEBENCH_POOL_INDICES")
    holdout_data = r.string("HOLDOUT_DATA").strip()
    holdout_indices = r.string("HOLDOUT_INDICES").strip()
    require(
        holdout_indices == "" or re.fullmatch(INDICES, holdout_indices) is not None,
        f"CONFIG_HOLDOUT_INDICES={holdout_indices!r} must be empty, 'all' or indices/ranges like '64-99'",
    )
    check_each_once(holdout_indices, "CONFIG_HOLDOUT_INDICES")
    instruction = r.string("COMPARE_INSTRUCTION").strip()
    require(len(instruction) <= MAX_INSTRUCTION and not re.search(r"[\x00-\x1f\x7f-\x9f]", instruction),
            f"CONFIG_COMPARE_INSTRUCTION must be at most {MAX_INSTRUCTION} characters, with no control character")
    require(instruction != "" or not r.flag("INSTRUCTION_IN_SEARCH"),
            "CONFIG_INSTRUCTION_IN_SEARCH=y needs an instruction: CONFIG_COMPARE_INSTRUCTION is blank")
    template = r.string("PROMPT_TEMPLATE_PATH").strip()
    urls = tuple(u.strip().rstrip("/") for u in r.string("SGLANG_URLS").split(",") if u.strip())
    for url in urls:
        require(
            re.match(r"https?://", url) is not None,
            f"CONFIG_SGLANG_URLS has {url!r}, which is not an http(s):// URL",
        )
    bias_url = r.string("LOGIT_BIAS_URL").strip().rstrip("/").removesuffix("/v1")
    require(re.fullmatch(r"https?://[^/\s]+(/\S*)?", bias_url) is not None,
            f"CONFIG_LOGIT_BIAS_URL={r.raw('LOGIT_BIAS_URL')} is not an http(s):// URL, e.g. http://127.0.0.1:8080")
    require(not r.flag("ENGINE_LOGIT_BIAS") or r.integer("DELTA_PHASES") == 1,
            f"CONFIG_DELTA_PHASES={r.integer('DELTA_PHASES')} needs a processor that follows each answer's phase; "
            "CONFIG_ENGINE_LOGIT_BIAS sends one static logit_bias map a request: set CONFIG_DELTA_PHASES=1")
    api = r.string("SGLANG_API").strip()
    require(api in SGLANG_APIS, f"CONFIG_SGLANG_API={api!r} is unknown; use one of {', '.join(SGLANG_APIS)}")
    for name in ("OUTPUT_DIR", "CLUSTER_DIR", "MODEL_PATH", "FINANCEBENCH_JSONL_PATH", "EMBEDDING_MODEL"):
        require(r.string(name).strip() != "", f"CONFIG_{name} is empty")

    device = r.string("TRANSFORMERS_DEVICE")
    require(re.fullmatch(DEVICES, device) is not None,
            f"CONFIG_TRANSFORMERS_DEVICE={device!r} is not a device the transformers engine runs on: write auto, cpu, "
            "cuda, cuda:N or mps")
    return {"lambda_shortness": lambdas["LAMBDA_SHORTNESS"] / total,
            "lambda_correctness": lambdas["LAMBDA_CORRECTNESS"] / total, "max_wall_minutes": wall_minutes,
            "temperature": temperature, "correctness_tolerance": tolerance, "pool_indices": pool,
            "holdout_data": holdout_data, "holdout_indices": holdout_indices, "compare_instruction": instruction,
            "prompt_template_path": template, "sglang_urls": urls, "sglang_api": api, "transformers_device": device,
            "logit_bias_url": bias_url}


def _paths_and_data(r: Reader, checked: dict[str, Any]) -> dict[str, Any]:
    return dict(
        output_dir=Path(r.string("OUTPUT_DIR")),
        cluster_dir=Path(r.string("CLUSTER_DIR")),
        cluster_descriptions_path=_descriptions_path(r),
        initial_deltas_path=Path(r.string("INITIAL_DELTAS_PATH")),
        financebench_jsonl_path=Path(r.string("FINANCEBENCH_JSONL_PATH")),
        pool_indices=checked["pool_indices"],
        prompt_template_path=Path(checked["prompt_template_path"]) if checked["prompt_template_path"] else None,
        evidence_max_chars=r.integer("EVIDENCE_MAX_CHARS"),
        holdout_data=Path(checked["holdout_data"]) if checked["holdout_data"] else None,
        holdout_indices=checked["holdout_indices"],
        compare_simple=r.flag("COMPARE_SIMPLE"),
        compare_instruction=checked["compare_instruction"],
        instruction_in_search=r.flag("INSTRUCTION_IN_SEARCH"),
    )


def _descriptions_path(r: Reader) -> Path:
    """CONFIG_CLUSTER_DESCRIPTIONS_PATH; empty: the descriptions inside CONFIG_CLUSTER_DIR,
    which follow the directory wherever it moves."""
    given = r.string("CLUSTER_DESCRIPTIONS_PATH").strip()
    return Path(given) if given else Path(r.string("CLUSTER_DIR")) / DESCRIPTIONS_FILE


def _engine(r: Reader, checked: dict[str, Any]) -> dict[str, Any]:
    return dict(
        engine=r.choice({"ENGINE_TRANSFORMERS": "transformers", "ENGINE_SGLANG": "sglang",
                         "ENGINE_LOGIT_BIAS": "logit_bias"}),
        model_path=r.string("MODEL_PATH"),
        max_new_tokens=r.integer("MAX_NEW_TOKENS"),
        temperature=checked["temperature"],
        transformers_batch_size=r.integer("TRANSFORMERS_BATCH_SIZE"),
        transformers_device=checked["transformers_device"],
        transformers_threads=r.integer("TRANSFORMERS_THREADS"),
        transformers_prompt_cache_mb=r.integer("TRANSFORMERS_PROMPT_CACHE_MB"),
        eval_concurrency=r.integer("EVAL_CONCURRENCY"),
        sglang_command=r.string("SGLANG_COMMAND"),
        sglang_urls=checked["sglang_urls"],
        sglang_api=checked["sglang_api"],
        sglang_port=r.integer("SGLANG_PORT"),
        sglang_allow_remote=r.flag("SGLANG_ALLOW_REMOTE"),
        sglang_allow_other_model=r.flag("SGLANG_ALLOW_OTHER_MODEL"),
        sglang_deterministic=r.flag("SGLANG_DETERMINISTIC"),
        sglang_startup_timeout=float(r.integer("SGLANG_STARTUP_TIMEOUT")),
        sglang_poll_interval=r.number("SGLANG_POLL_INTERVAL", 0.01, 3600),
        sglang_request_timeout=float(r.integer("SGLANG_REQUEST_TIMEOUT")),
        sglang_max_restarts=r.integer("SGLANG_MAX_RESTARTS"),
        sglang_stop_grace=float(r.integer("SGLANG_STOP_GRACE")),
        logit_bias_url=checked["logit_bias_url"],
        logit_bias_request_timeout=float(r.integer("LOGIT_BIAS_REQUEST_TIMEOUT")),
    )


def _fitness_and_reflector(r: Reader, checked: dict[str, Any]) -> dict[str, Any]:
    # The floor is the baseline's correctness on the whole pool; GEPA scores its candidates on its valset.
    require(not (r.flag("BEST_SHORTEST") and r.flag("STRATEGY_GEPA")),
            "CONFIG_BEST_SHORTEST compares a candidate's correctness on the whole training pool with the baseline's, "
            "but CONFIG_STRATEGY_GEPA scores its candidates on its valset: set CONFIG_BEST_FITTEST=y with GEPA")
    return dict(
        lambda_shortness=checked["lambda_shortness"],
        lambda_correctness=checked["lambda_correctness"],
        shortness_scale=r.number("SHORTNESS_SCALE", 0.001, 1e9),
        best_rule=r.choice({"BEST_FITTEST": "fittest", "BEST_SHORTEST": "shortest"}),
        judge=r.choice({"JUDGE_NUMERIC": "numeric", "JUDGE_LLM": "llm", "JUDGE_HYBRID": "hybrid"}),
        correctness_tolerance=checked["correctness_tolerance"],
        judge_model=r.string("JUDGE_MODEL"),
        judge_base_url=r.string("JUDGE_BASE_URL"),
        judge_api_key_env=r.string("JUDGE_API_KEY_ENV"),
        judge_timeout=float(r.integer("JUDGE_TIMEOUT")),
        judge_max_consecutive_failures=r.integer("JUDGE_MAX_CONSECUTIVE_FAILURES"),
        reflector=r.choice({"REFLECTOR_LOCAL": "local", "REFLECTOR_OPENAI": "openai"}),
        reflector_model=r.string("REFLECTOR_MODEL"),
        reflector_base_url=r.string("REFLECTOR_BASE_URL"),
        reflector_api_key_env=r.string("REFLECTOR_API_KEY_ENV"),
        reflector_timeout=float(r.integer("REFLECTOR_TIMEOUT")),
        reflector_max_retries=r.integer("REFLECTOR_MAX_RETRIES"),
        reflector_max_consecutive_failures=r.integer("REFLECTOR_MAX_CONSECUTIVE_FAILURES"),
        reflector_concurrency=r.integer("REFLECTOR_CONCURRENCY"),
        reflector_answer_max_chars=r.integer("REFLECTOR_ANSWER_MAX_CHARS"),
        local_reflector_step=r.number("LOCAL_REFLECTOR_STEP", 1e-6, MAX_LOGITS),
        reflector_padding_evidence=r.flag("REFLECTOR_PADDING_EVIDENCE"),
    )


def _search(r: Reader, checked: dict[str, Any], strategy: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options`: those every config sets, read already; the chosen strategy's are read here."""
    return dict(
        strategy=strategy,
        max_metric_calls=r.integer("MAX_METRIC_CALLS"),
        max_reflector_tokens=r.integer("MAX_REFLECTOR_TOKENS"),
        max_wall_minutes=checked["max_wall_minutes"],
        max_idle_steps=r.integer("MAX_IDLE_STEPS"),
        strategy_options={**options, **(registry.read((strategy,), r) if strategy not in options else {})},
        seed=r.integer("SEED"),
        delta_phases=r.integer("DELTA_PHASES"),
    )
