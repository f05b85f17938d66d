"""The archive strategy's options (seed 003, CONFIG_ARCHIVE_*), parsed and checked."""

from __future__ import annotations

import math
from dataclasses import dataclass

from compressor_2.config.kconfig import MAX_LOGITS, Reader, decimal, require, shown_number

ISSUE_TYPES = ("cut_short", "wrong", "padded", "refusal")
ARCHIVE_GENERATORS = ("cluster", "vector", "crossover")
FEEDBACK_SCOPES = ("none", "ancestors", "neighborhood")
# Bounds that keep seed 003's arithmetic finite: exp(sharpness x (fitness - midpoint)) with
# both in [0, 1], (1 + children) ** novelty_weight, and the sum of the issue weights.
MAX_SHARPNESS = 100.0
MAX_NOVELTY_WEIGHT = 10.0
MAX_ISSUE_WEIGHT = 1e6
MAX_POSTCHECK_MARGIN = 1e6  # summed per-example scores, each at most 1


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
    midpoint = r.string("ARCHIVE_MIDPOINT")
    fixed, percentile = None, None
    if midpoint.startswith("p"):
        percentile = decimal(midpoint[1:])
        require(0 <= percentile <= 100, f"CONFIG_ARCHIVE_MIDPOINT={midpoint!r}: a percentile is p0 .. p100")
    else:
        # The sigmoid's exponent is sharpness x (fitness - midpoint), and a fitness lies in [0, 1];
        # that range is checked here, with a hint at the percentile form.
        fixed = r.number("ARCHIVE_MIDPOINT", -math.inf, math.inf)
        require(0 <= fixed <= 1, f"CONFIG_ARCHIVE_MIDPOINT={midpoint!r}: a fixed midpoint is a fitness in [0, 1] "
                 f"(or write p{midpoint} for a percentile of the archive's fitness values)")
    weights: list[tuple[str, float]] = []
    given: dict[str, str] = {}  # type -> the part that gave its weight
    for part in filter(None, (p.strip() for p in r.string("ARCHIVE_ISSUE_WEIGHTS").split(","))):
        name, _, value = part.partition("=")
        weight = decimal(value.strip())
        require(name.strip() in ISSUE_TYPES and 0 <= weight <= MAX_ISSUE_WEIGHT,
                 f"CONFIG_ARCHIVE_ISSUE_WEIGHTS has {part!r}: write type=weight with a type among "
                 f"{', '.join(ISSUE_TYPES)} and a weight in [0, {shown_number(MAX_ISSUE_WEIGHT)}]")
        require(name.strip() not in given,
                 f"CONFIG_ARCHIVE_ISSUE_WEIGHTS names {name.strip()} more than once ({given.get(name.strip())!r} and "
                 f"{part!r}): give each issue type one weight")
        given[name.strip()] = part
        weights.append((name.strip(), weight))
    require(any(w > 0 for _, w in weights), "CONFIG_ARCHIVE_ISSUE_WEIGHTS gives no issue type a weight above 0")
    generators = tuple(g.strip() for g in r.string("ARCHIVE_GENERATORS").split(",") if g.strip())
    require(bool(generators) and all(g in ARCHIVE_GENERATORS for g in generators)
             and len(set(generators)) == len(generators),
             f"CONFIG_ARCHIVE_GENERATORS={','.join(generators)!r} must name some of "
             f"{', '.join(ARCHIVE_GENERATORS)}, each once")
    scope = r.string("ARCHIVE_FEEDBACK_SCOPE").strip()
    require(scope in FEEDBACK_SCOPES,
             f"CONFIG_ARCHIVE_FEEDBACK_SCOPE={scope!r} is unknown; use one of {', '.join(FEEDBACK_SCOPES)}")
    return ArchiveOptions(
        iterations=r.integer("ARCHIVE_ITERATIONS"),
        parents_per_iteration=r.integer("ARCHIVE_PARENTS_PER_ITERATION"),
        replace=r.flag("ARCHIVE_REPLACE"),
        sharpness=r.number("ARCHIVE_SHARPNESS", 0, MAX_SHARPNESS, above=True),
        midpoint=fixed,
        midpoint_percentile=percentile,
        novelty_weight=r.number("ARCHIVE_NOVELTY_WEIGHT", 0, MAX_NOVELTY_WEIGHT),
        min_correctness=r.number("ARCHIVE_MIN_CORRECTNESS", 0, 1),
        issue_batch=r.integer("ARCHIVE_ISSUE_BATCH"),
        issue_weights=tuple(weights),
        generators=generators,
        generation_concurrency=r.integer("ARCHIVE_GENERATION_CONCURRENCY"),
        assessment_concurrency=r.integer("ARCHIVE_ASSESSMENT_CONCURRENCY"),
        feedback_scope=scope,
        feedback_depth=r.integer("ARCHIVE_FEEDBACK_DEPTH"),
        postcheck_examples=r.integer("ARCHIVE_POSTCHECK_EXAMPLES"),
        postcheck_margin=r.number("ARCHIVE_POSTCHECK_MARGIN", 0, MAX_POSTCHECK_MARGIN),
        delta_limit=r.number("ARCHIVE_DELTA_LIMIT", 0, MAX_LOGITS, above=True),
    )
