"""What a run gained, outside any loop: `standing`, `Checks`, `Claims`, their confidence, simpler tools, six arms,
the stop oracle."""

from compressor_2.findings.arms import arm_results, arms_lines
from compressor_2.findings.checks import (
    BASELINE_ID, Checks, Measured, Standing, measured, refuse_emptied_heldout, refuse_lost, standing,
    training_baseline,
)
from compressor_2.findings.claims import HELDOUT, TRAINING, Arm, Claims
from compressor_2.findings.confidence import (
    LEVEL, Paired, ci, correctness_claim, difference_in_words, does_as_well, p_text, points_claim, tokens_change,
    tokens_claim,
)
from compressor_2.findings.front import Point, affordable, affordable_bound, pareto_front
from compressor_2.findings.simpler import (
    other_side_examples,
    read_tools_record,
    simpler_advice,
    simpler_options,
    tool_rows,
)
from compressor_2.findings.stop_oracle import Oracle, Summary, share_reached, stop_oracle, summarise, summary_text

__all__ = ["BASELINE_ID", "HELDOUT", "LEVEL", "TRAINING", "Arm", "Checks", "Claims", "Measured", "Oracle", "Paired",
           "Point", "Standing", "Summary", "affordable", "affordable_bound", "arm_results", "arms_lines", "ci",
           "correctness_claim", "difference_in_words", "does_as_well", "measured", "other_side_examples", "p_text",
           "pareto_front", "points_claim", "read_tools_record", "refuse_emptied_heldout", "refuse_lost",
           "share_reached", "simpler_advice", "simpler_options", "standing", "stop_oracle", "summarise", "summary_text",
           "tokens_change", "tokens_claim", "tool_rows", "training_baseline"]
