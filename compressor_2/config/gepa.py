"""GEPA's options (seed 004, CONFIG_GEPA_*), parsed and checked."""

from __future__ import annotations

import re
from dataclasses import dataclass

from compressor_2.config.indices import check_each_once
from compressor_2.config.kconfig import MAX_LOGITS, Reader, require

CANDIDATE_SELECTORS = ("pareto", "current_best", "epsilon_greedy")
COMPONENT_SELECTORS = ("round_robin", "all")


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


def gepa_options(r: Reader, max_metric_calls: int) -> GepaOptions:
    require(max_metric_calls > 0, "CONFIG_STRATEGY_GEPA needs CONFIG_MAX_METRIC_CALLS > 0: the metric-call "
             "budget is GEPA's natural stopping criterion")
    indices = r.string("GEPA_VALSET_INDICES").strip()
    require(indices == "" or re.fullmatch(r"[0-9]+(-[0-9]+)?(\s*,\s*[0-9]+(-[0-9]+)?)*", indices) is not None,
             f"CONFIG_GEPA_VALSET_INDICES={indices!r} must be empty or pool positions such as '0-9,20'")
    selector = r.string("GEPA_CANDIDATE_SELECTOR").strip()
    require(selector in CANDIDATE_SELECTORS, f"CONFIG_GEPA_CANDIDATE_SELECTOR={selector!r} is unknown; use one "
             f"of {', '.join(CANDIDATE_SELECTORS)}")
    component = r.string("GEPA_COMPONENT_SELECTOR").strip()
    require(component in COMPONENT_SELECTORS, f"CONFIG_GEPA_COMPONENT_SELECTOR={component!r} is unknown; use "
             f"one of {', '.join(COMPONENT_SELECTORS)}")
    for low, high in re.findall(r"([0-9]+)-([0-9]+)", indices):
        require(int(low) <= int(high), f"CONFIG_GEPA_VALSET_INDICES={indices!r} has the range {low}-{high}, which "
                 f"runs backwards: write {high}-{low}")
    check_each_once(indices, "CONFIG_GEPA_VALSET_INDICES", "position")
    epsilon = r.number("GEPA_EPSILON", 0, 1)
    eps = r.number("GEPA_MERGE_EPS", 0, MAX_LOGITS)
    return GepaOptions(
        valset_size=r.integer("GEPA_VALSET_SIZE"), valset_indices=indices,
        minibatch_size=r.integer("GEPA_MINIBATCH_SIZE"), candidate_selector=selector, epsilon=epsilon,
        skip_perfect=r.flag("GEPA_SKIP_PERFECT"), component_selector=component, use_merge=r.flag("GEPA_USE_MERGE"),
        max_merge_invocations=r.integer("GEPA_MAX_MERGE_INVOCATIONS"), merge_eps=eps,
        merge_subsample=r.integer("GEPA_MERGE_SUBSAMPLE"), val_overlap_floor=r.integer("GEPA_VAL_OVERLAP_FLOOR"),
    )
