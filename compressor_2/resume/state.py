"""One state format for every strategy: the file a rerun resumes from.

A state file is one JSON object:
- the step to run next, under the strategy's own key (`generation` for the GA and
  CMA-ES; `iteration` for the others);
- `rng`: exactly the generators the strategy draws from (the global `random` and numpy
  ones for the GA and the numeric baselines, its own `random.Random` for the archive and
  GEPA), so a resumed run draws what an uninterrupted one would have;
- `last_candidate_id`: the archive's newest candidate when the state was taken; a resume
  forgets what came after it, so the replayed step makes the same ids again;
- with the GA (`keeps_best`), `best_individual` and `best_fitness`: the best-ever, which
  the other strategies take from the archive;
- the strategy's own fields: one typed object, read by the strategy's own reader.

`read_state` reads every field before any work (types, finite numbers, ranges) and
`check_state` holds it against the archive; a file that cannot be used is refused with one
line naming the file and the field, never silently replaced by a fresh start.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from compressor_2.common import ConfigError, atomic_write_json
from compressor_2.deltas import Deltas, validate_deltas
from compressor_2.resume import fields
from compressor_2.resume.fields import FieldError

if TYPE_CHECKING:
    from compressor_2.archive import RunArchive

S = TypeVar("S")
FRESH_START_HINT = "move it away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run"
GLOBAL_RNGS = {"random": random, "numpy": np.random}  # what DEAP's selectors and the samplers draw from


@dataclass(frozen=True)
class Member:
    deltas: Deltas
    scratchpad: str
    candidate_id: int


@dataclass(frozen=True)
class RunFiles:
    """What a strategy writes in the run directory besides the shared services' files,
    declared once in its module (`FILES`): its state file, the JSON-lines log of its steps'
    history entries the driver keeps beside it (a resume drops the lines of the steps it
    replays), its progress plot, and the files its steps leave (`Report.files`). Its state
    format is made with it, and every other command refuses to write over these names."""

    state: str
    log: str | None = None
    plot: str | None = None
    others: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return tuple(name for name in (self.state, self.log, self.plot, *self.others) if name is not None)


@dataclass(frozen=True)
class StateFormat(Generic[S]):
    """A strategy's state file: its files (the state file's name and its step log's), its
    step key, the generators it draws from, and its own fields' reader (each field checked,
    a FieldError naming the one that is off), writer and check against the archive (the
    state's `last_candidate_id` given)."""

    files: RunFiles
    step_key: str
    rngs: tuple[str, ...]  # "random", "numpy"
    read: Callable[[Mapping[str, Any]], S]
    write: Callable[[S], dict[str, Any]]
    check: Callable[[S, RunArchive, int], None] = lambda own, archive, last: None
    keeps_best: bool = False
    older_step_keys: tuple[str, ...] = ()  # what files of an earlier compressor_2 called the step, still read

    @property
    def file(self) -> str:
        return self.files.state

    @property
    def log(self) -> str | None:
        return self.files.log


@dataclass(frozen=True)
class Saved(Generic[S]):
    step: int  # the next one to run
    rng: dict[str, list[Any]]
    last_candidate_id: int
    own: S
    best: Member | None = None  # with `keeps_best`
    best_fitness: float | None = None


def seed_rng(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


def capture_rngs(generators: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The states of `generators` ("random": a `random.Random` or the module; "numpy": a
    `RandomState` or `np.random`) as JSON."""
    captured: dict[str, list[Any]] = {}
    for name, generator in generators.items():
        if name == "random":
            version, internal, gauss = generator.getstate()
            captured[name] = [version, list(internal), gauss]
        else:
            kind, keys, pos, has_gauss, cached = generator.get_state(legacy=True)
            captured[name] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    return captured


def restore_rngs(rng: Mapping[str, Any], generators: Mapping[str, Any]) -> None:
    """Sets `generators` to the states `capture_rngs` wrote."""
    for name, generator in generators.items():
        if name == "random":
            version, internal, gauss = rng[name]
            generator.setstate((version, tuple(internal), gauss))
        else:
            kind, keys, pos, has_gauss, cached = rng[name]
            generator.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_state(out: Path, fmt: StateFormat[S], saved: Saved[S]) -> None:
    best = {"best_individual": _member_json(saved.best) if saved.best else None,
            "best_fitness": saved.best_fitness} if fmt.keeps_best else {}
    atomic_write_json(out / fmt.file, {fmt.step_key: saved.step, **fmt.write(saved.own), **best, "rng": saved.rng,
                                       "last_candidate_id": saved.last_candidate_id})


def state_json(own: object) -> dict[str, Any]:
    """A dataclass of JSON values (members, lists, numbers) as a JSON object."""
    return dataclasses.asdict(own)  # type: ignore[call-overload]


def _member_json(member: Member) -> dict[str, Any]:
    return {"candidate_id": member.candidate_id, "deltas": member.deltas, "scratchpad": member.scratchpad}


def read_state(path: Path, fmt: StateFormat[S], cluster_ids: Sequence[str], max_fitness: float) -> Saved[S] | None:
    """The state file, read field by field, or None for a fresh run. `max_fitness`
    (lambda_s + lambda_c: both fitness terms lie in [0, 1]) bounds the best fitness."""
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({type(exc).__name__}: {exc}); {FRESH_START_HINT}") from None
    try:
        if not isinstance(raw, dict):
            raise FieldError(f"holds {fields.shown(raw)}, not a JSON object")
        step = fields.integer(raw, _step_key(raw, fmt))
        best, best_fitness = _best(raw, path, cluster_ids, max_fitness) if fmt.keeps_best else (None, None)
        return Saved(step, _rng(raw, fmt.rngs), fields.integer(raw, "last_candidate_id"), fmt.read(raw), best,
                     best_fitness)
    except FieldError as exc:
        raise ConfigError(f"'{path}': {exc}; {FRESH_START_HINT}") from None
    except ConfigError as exc:
        raise ConfigError(f"{exc} (the clusters changed since this run started); {FRESH_START_HINT}") from None


def _step_key(raw: Mapping[str, Any], fmt: StateFormat[S]) -> str:
    """The key the file holds its step under: the format's, or an older one (a file of an
    earlier compressor_2)."""
    if fmt.step_key in raw:
        return fmt.step_key
    return next((key for key in fmt.older_step_keys if key in raw), fmt.step_key)


def read_member(obj: Any, where: str, cluster_ids: Sequence[str], path: Path) -> Member:
    """A member as `save_state` writes it: deltas over `cluster_ids`, each finite (a
    ConfigError when the clusters differ), a scratchpad and a candidate id."""
    if not isinstance(obj, dict):
        raise FieldError(f"{where} is {fields.shown(obj)}, not an object")
    scratchpad = fields.typed(obj, "scratchpad", str, "a string", f"{where}.")
    cid = fields.integer(obj, "candidate_id", f"{where}.", minimum=1)
    deltas = fields.typed(obj, "deltas", dict, "an object {cluster id: delta}", f"{where}.")
    for cluster in deltas:
        fields.number(deltas, cluster, f"{where}.deltas.")
    return Member(validate_deltas(deltas, cluster_ids, f"'{path}' {where}"), scratchpad, cid)


def _best(raw: Mapping[str, Any], path: Path, cluster_ids: Sequence[str],
          max_fitness: float) -> tuple[Member | None, float | None]:
    best = fields.value(raw, "best_individual")
    fitness = (None if fields.value(raw, "best_fitness") is None
               else fields.number(raw, "best_fitness", low=0.0, high=max_fitness))
    if (best is None) != (fitness is None):
        raise FieldError("best_individual and best_fitness must both be set or both be null")
    return (read_member(best, "best_individual", cluster_ids, path) if best is not None else None), fitness


def _rng(raw: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, list[Any]]:
    """`raw["rng"]`: the states of the generators `names`, each one that restores (a state
    file of an earlier compressor_2 may hold one more, which is not read)."""
    rng = fields.typed(raw, "rng", dict, "an object")
    if missing := [name for name in names if name not in rng]:
        raise FieldError(f"rng holds no state of the {', '.join(missing)} generator")
    try:
        restore_rngs(rng, {name: random.Random() if name == "random" else np.random.RandomState() for name in names})
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise FieldError(f"rng cannot be restored ({type(exc).__name__}: {exc})") from None
    return {name: rng[name] for name in names}


def check_state(saved: Saved[S], path: Path, fmt: StateFormat[S], archive: RunArchive, deterministic: bool) -> None:
    """The state must describe the run its archive holds (called before the resume's
    rollback, while the archive still holds what the state refers to): its newest candidate
    at most the archive's, its own fields' candidates held, and a best-ever it keeps the
    one the archive holds, with the fitness the archive recorded. Only a `deterministic`
    run (greedy decoding, answers reused) gives a genome one fitness; the best may be a
    candidate made after the state was taken (in a step a resume replays): the archive
    has not recorded it for sure, so it is not compared."""
    last, newest = saved.last_candidate_id, archive.last_candidate_id()
    try:
        if last > newest:
            raise FieldError(f"last_candidate_id is {last} but the newest candidate of '{archive.path}' is {newest}")
        fmt.check(saved.own, archive, last)
        if saved.best is not None and saved.best.candidate_id <= last:
            _check_best(saved.best, saved.best_fitness, archive, deterministic)
    except FieldError as exc:
        raise ConfigError(f"'{path}': {exc}; {FRESH_START_HINT}") from None


def _check_best(best: Member, fitness: float | None, archive: RunArchive, deterministic: bool) -> None:
    candidate = archive.candidate(best.candidate_id)
    if candidate is None or dict(candidate.deltas) != best.deltas:
        found = "does not hold it" if candidate is None else "holds it with other deltas"
        raise FieldError(f"best_individual is candidate {best.candidate_id}, but '{archive.path}' {found}")
    recorded = candidate.fitness
    if deterministic and recorded is not None and fitness is not None and not math.isclose(
            recorded, fitness, rel_tol=1e-9, abs_tol=1e-12):
        raise FieldError(f"best_fitness is {fitness!r}, but '{archive.path}' records {recorded!r} for the best "
                         f"individual (candidate {best.candidate_id})")


def held(cid: Any, where: str, archive: RunArchive, last: int, assessed: bool = False) -> int:
    """`cid`, read at `where`: a candidate the archive held when the state was taken (at
    most `last`, its `last_candidate_id`), and with `assessed` one whose fitness it recorded."""
    cid = fields.candidate_id(cid, where)
    candidate = archive.candidate(cid) if cid <= last else None
    if candidate is None:
        raise FieldError(f"{where} is candidate {cid}, but '{archive.path}' does not hold it (the state was "
                         f"saved after candidate {last})")
    if assessed and candidate.fitness is None:
        raise FieldError(f"{where} is candidate {cid}, which '{archive.path}' holds unassessed")
    return cid


def candidate_ids(raw: Mapping[str, Any], key: str) -> list[int]:
    """`raw[key]`: a list of candidate ids (whether the archive holds them is `held`'s)."""
    ids = fields.typed(raw, key, list, "a list of candidate ids")
    for i, cid in enumerate(ids):
        fields.candidate_id(cid, f"{key}[{i}]")
    return ids


def held_list(ids: Sequence[int], key: str, archive: RunArchive, last: int, assessed: bool = False) -> None:
    """Every id of `ids` (read from `key`) `held`."""
    for i, cid in enumerate(ids):
        held(cid, f"{key}[{i}]", archive, last, assessed)
