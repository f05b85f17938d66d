"""What every strategy's state file shares: a population member (deltas, scratchpad,
candidate id), the global RNGs captured and restored exactly (a resumed run draws what an
uninterrupted one would have; GEPA forgets its RNG on resume), and the reading of a
strategy's own state file (`rng`, `iteration`, `last_candidate_id`), which refuses a file
it cannot use instead of silently starting afresh.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compressor_2.deltas import Deltas
from compressor_2.errors import ConfigError
from compressor_2.run import fields


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


def load_strategy_state(path: Path, keys: Sequence[str]) -> dict[str, Any] | None:
    """A strategy's state file (JSON with `rng`, an integer `iteration` and
    `last_candidate_id`, and `keys`), or None for a fresh run. One that cannot be used is
    a ConfigError, never a silent fresh start."""
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        restore_rng(state["rng"], into=(random.Random(), np.random.RandomState()))
        missing = [key for key in keys if key not in state]
        if missing:
            raise KeyError(", ".join(missing))
        fields.integer(state, "iteration")
        fields.integer(state, "last_candidate_id")
        return state
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"'{path}' cannot be read ({type(exc).__name__}: {exc}); {FRESH_START_HINT}") from None
