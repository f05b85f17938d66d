"""The archive strategy's options (seed 003, CONFIG_ARCHIVE_*), parsed and checked."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compressor_2.config.kconfig import Reader, require

ISSUE_TYPES = ("cut_short", "wrong", "padded", "refusal")
ARCHIVE_GENERATORS = ("cluster", "vector", "crossover")
FEEDBACK_SCOPES = ("none", "ancestors", "neighborhood")


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
    min_correctness: float  # viability: a fraction of the seed candidate's correctness
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


def archive_options(r: Reader) -> ArchiveOptions:
    def at_least(name: str, low: float, strict: bool = False) -> float:
        value = r.number(name)
        require(value > low if strict else value >= low,
                 f"CONFIG_{name}={value} must be {'>' if strict else '>='} {low:g}")
        return value

    midpoint = r.string("ARCHIVE_MIDPOINT").strip()
    fixed, percentile = None, None
    if midpoint.startswith("p"):
        try:
            percentile = float(midpoint[1:])
        except ValueError:
            percentile = math.nan
        require(0 <= percentile <= 100, f"CONFIG_ARCHIVE_MIDPOINT={midpoint!r}: a percentile is p0 .. p100")
    else:
        fixed = r.number("ARCHIVE_MIDPOINT")
    weights = []
    for part in filter(None, (p.strip() for p in r.string("ARCHIVE_ISSUE_WEIGHTS").split(","))):
        name, _, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        require(name.strip() in ISSUE_TYPES and math.isfinite(weight) and weight >= 0,
                 f"CONFIG_ARCHIVE_ISSUE_WEIGHTS has {part!r}: write type=weight with a type among "
                 f"{', '.join(ISSUE_TYPES)} and a weight >= 0")
        weights.append((name.strip(), weight))
    require(any(w > 0 for _, w in weights), "CONFIG_ARCHIVE_ISSUE_WEIGHTS gives no issue type a weight above 0")
    generators = tuple(g.strip() for g in r.string("ARCHIVE_GENERATORS").split(",") if g.strip())
    require(bool(generators) and all(g in ARCHIVE_GENERATORS for g in generators)
             and len(set(generators)) == len(generators),
             f"CONFIG_ARCHIVE_GENERATORS={','.join(generators)!r} must name some of "
             f"{', '.join(ARCHIVE_GENERATORS)}, each once")
    min_correctness = r.number("ARCHIVE_MIN_CORRECTNESS")
    require(0 <= min_correctness <= 1, f"CONFIG_ARCHIVE_MIN_CORRECTNESS={min_correctness} must be in [0, 1]")
    scope = r.string("ARCHIVE_FEEDBACK_SCOPE").strip()
    require(scope in FEEDBACK_SCOPES,
             f"CONFIG_ARCHIVE_FEEDBACK_SCOPE={scope!r} is unknown; use one of {', '.join(FEEDBACK_SCOPES)}")
    return ArchiveOptions(
        iterations=r.integer("ARCHIVE_ITERATIONS"),
        parents_per_iteration=r.integer("ARCHIVE_PARENTS_PER_ITERATION"),
        replace=r.flag("ARCHIVE_REPLACE"),
        sharpness=at_least("ARCHIVE_SHARPNESS", 0, strict=True),
        midpoint=fixed,
        midpoint_percentile=percentile,
        novelty_weight=at_least("ARCHIVE_NOVELTY_WEIGHT", 0),
        min_correctness=min_correctness,
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
