"""Steps that made nothing new (CONFIG_MAX_IDLE_STEPS). With greedy decoding every answer
of a genome the run has seen comes from the cache, so a step without a fresh metric call
evaluated no new genome: its proposals were all known, or all refused before evaluation
(a value the post-check clamps back). Cache hits cost nothing, so a reflector that only
proposes those would never reach CONFIG_MAX_METRIC_CALLS and loop for ever, paying for
every reflector call. A run stops after `limit` such steps in a row. (With sampling every
answer is fresh, so no step is idle; the step counts and the budgets end such a run.)"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IdleSteps:
    limit: int
    in_a_row: int = 0
    _metric_calls: int | None = None  # at the last step boundary

    def after_step(self, metric_calls: int, proposer: str) -> str | None:
        """Called at every step boundary with the run's metric calls so far (the first
        call of a session only takes note); the stop reason once `limit` steps in a row
        made none. `proposer` names what proposes the genomes: "the reflector"."""
        self.in_a_row = self.in_a_row + 1 if metric_calls == self._metric_calls else 0
        self._metric_calls = metric_calls
        if self.in_a_row < self.limit:
            return None
        return (f"{proposer} proposed only known genomes for {self.in_a_row} steps in a row: none made a fresh "
                f"metric call (CONFIG_MAX_IDLE_STEPS={self.limit})")
