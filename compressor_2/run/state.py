"""What every strategy's state file shares: a population member (deltas, scratchpad,
candidate id), the global RNGs captured and restored exactly (a resumed run draws what an
uninterrupted one would have; GEPA forgets its RNG on resume), and the reading of a
strategy's own state file: `rng`, `iteration`, `last_candidate_id` here, its own fields by
the strategy, each field read as `fields` reads them and every candidate it names looked up
in the archive. A file it cannot use is refused naming the file and the field, never
silently replaced by a fresh start.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compressor_2.deltas import Deltas
from compressor_2.errors import ConfigError
from compressor_2.run import fields
from compressor_2.run.fields import FieldError

if TYPE_CHECKING:
    from compressor_2.archive.database import RunArchive


@dataclass(frozen=True)
class Member:
    deltas: Deltas
    scratchpad: str
    candidate_id: int


def seed_rng(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)


def capture_rng() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {"random": [version, list(internal), gauss],
            "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def restore_rng(rng: dict[str, Any], into: tuple[Any, Any] = (random, np.random)) -> None:
    """Sets the global RNGs, or the (random.Random, np.random.RandomState) pair `into`."""
    version, internal, gauss = rng["random"]
    into[0].setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    into[1].set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


FRESH_START_HINT = "move it away (or choose another CONFIG_OUTPUT_DIR) to start a fresh run"


def capture_rng_of(rng: random.Random) -> dict[str, Any]:
    """A strategy's own RNG in `restore_rng`'s format (its numpy part is the global one)."""
    version, internal, gauss = rng.getstate()
    return {**capture_rng(), "random": [version, list(internal), gauss]}


def load_strategy_state(path: Path, archive: RunArchive,
                        read: Callable[[dict[str, Any]], None] = lambda raw: None) -> dict[str, Any] | None:
    """A strategy's state file, or None for a fresh run: a JSON object with an integer
    `iteration`, `rng` and `last_candidate_id` (at most the archive's newest candidate), and
    the strategy's own fields, which `read` checks field by field (raising FieldError naming
    the field). One that cannot be used is a ConfigError naming the file and the field,
    never a silent fresh start."""
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({type(exc).__name__}: {exc}); {FRESH_START_HINT}") from None
    try:
        if not isinstance(raw, dict):
            raise FieldError(f"holds {fields.shown(raw)}, not a JSON object")
        fields.integer(raw, "iteration")
        last = fields.integer(raw, "last_candidate_id")
        if last > archive.last_candidate_id():
            raise FieldError(f"last_candidate_id is {last} but the newest candidate of '{archive.path}' is "
                             f"{archive.last_candidate_id()}")
        check_rng(raw)
        read(raw)
    except FieldError as exc:
        raise ConfigError(f"'{path}': {exc}; {FRESH_START_HINT}") from None
    return raw


def check_rng(raw: dict[str, Any]) -> None:
    """`raw["rng"]` is what `capture_rng` wrote: it restores."""
    rng = fields.typed(raw, "rng", dict, "an object")
    try:
        restore_rng(rng, into=(random.Random(), np.random.RandomState()))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise FieldError(f"rng cannot be restored ({type(exc).__name__}: {exc})") from None


def held(cid: Any, where: str, archive: RunArchive, last: int, assessed: bool = False) -> int:
    """`cid`, read at `where`: a candidate the archive held when the state was taken (at
    most `last`, its `last_candidate_id`), and with `assessed` one whose fitness it recorded."""
    if isinstance(cid, bool) or not isinstance(cid, int) or cid < 1:
        raise FieldError(f"{where} is {fields.shown(cid)}, not a candidate id")
    candidate = archive.candidate(cid) if cid <= last else None
    if candidate is None:
        raise FieldError(f"{where} is candidate {cid}, but '{archive.path}' does not hold it (the state was "
                         f"saved after candidate {last})")
    if assessed and candidate.fitness is None:
        raise FieldError(f"{where} is candidate {cid}, which '{archive.path}' holds unassessed")
    return cid


def held_list(raw: dict[str, Any], key: str, archive: RunArchive, assessed: bool = False) -> list[int]:
    """`raw[key]`: a list of candidates, each `held`."""
    ids = fields.typed(raw, key, list, "a list of candidate ids")
    return [held(cid, f"{key}[{i}]", archive, raw["last_candidate_id"], assessed) for i, cid in enumerate(ids)]
