"""What a run gained, outside any loop: `standing`, `Checks`, `Claims` and their confidence, the simpler tools."""

from compressor_2.verdict.checks import BASELINE_ID, Checks, Standing, standing
from compressor_2.verdict.claims import HELDOUT, TRAINING, Arm, Claims
from compressor_2.verdict.confidence import (
    LEVEL, Paired, ci, correctness_claim, does_as_well, p_text, points_claim, tokens_change, tokens_claim, verdict,
)
from compressor_2.verdict.front import Point, affordable, affordable_bound, pareto_front
from compressor_2.verdict.simpler import (
    instructed_examples,
    read_record,
    simpler_options,
    tool_rows,
    verdict as tools_verdict,
)

__all__ = ["BASELINE_ID", "HELDOUT", "LEVEL", "TRAINING", "Arm", "Checks", "Claims", "Paired", "Point", "Standing",
           "affordable", "affordable_bound", "ci", "correctness_claim", "does_as_well", "instructed_examples", "p_text",
           "pareto_front", "points_claim", "read_record", "simpler_options", "standing", "tokens_change",
           "tokens_claim", "tool_rows", "tools_verdict", "verdict"]
