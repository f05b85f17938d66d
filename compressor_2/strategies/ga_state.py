"""evolution_state.json (seed 000 §2) in the one state format (run/state.py): `generation`
(the next one to run), `rng` (the global `random` and numpy RNGs DEAP and the loop draw
from), `last_candidate_id`, `best_individual` and `best_fitness` are the format's; the
GA's own fields are `population` [{candidate_id, deltas, scratchpad}] and `rr_idx`, the
round robin's next mutation target. The answers themselves live in the run archive.

Its population is read field by field and must be candidates the archive holds with the
same deltas: a hand-edited state is refused with one line naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compressor_2.run import fields
from compressor_2.run.fields import FieldError
from compressor_2.run.state import Member, StateFormat, read_member, state_json

if TYPE_CHECKING:
    from compressor_2.archive.database import RunArchive

STATE_FILE = "evolution_state.json"


@dataclass(frozen=True)
class GaState:
    population: tuple[Member, ...]
    rr_idx: int


def ga_format(out: Path, cluster_ids: Sequence[str], population_size: int) -> StateFormat[GaState]:
    path = out / STATE_FILE

    def read(raw: Mapping[str, Any]) -> GaState:
        rr_idx = fields.integer(raw, "rr_idx")
        if rr_idx >= len(cluster_ids):
            raise FieldError(f"rr_idx is {rr_idx}, not in [0, {len(cluster_ids)})")
        members = fields.typed(raw, "population", list, "a list")
        population = tuple(read_member(m, f"population[{i}]", cluster_ids, path) for i, m in enumerate(members))
        if len(population) != population_size:
            raise FieldError(f"holds {len(population)} individuals but CONFIG_POPULATION_SIZE={population_size}")
        return GaState(population, rr_idx)

    return StateFormat(STATE_FILE, "generation", ("random", "numpy"), read, state_json, check_population,
                       keeps_best=True)


def check_population(state: GaState, archive: RunArchive, last: int) -> None:
    """The population is candidates the archive held when the state was taken, with the
    same deltas."""
    for i, member in enumerate(state.population):
        candidate = archive.candidate(member.candidate_id) if member.candidate_id <= last else None
        if candidate is None or dict(candidate.deltas) != member.deltas:
            held = "does not hold it" if candidate is None else "holds it with other deltas"
            raise FieldError(f"population[{i}] is candidate {member.candidate_id}, but '{archive.path}' {held}")
