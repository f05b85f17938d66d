"""Evolution strategies: the decisions of each, chosen by CONFIG_STRATEGY (a Kconfig choice
whose entry `STRATEGY_<NAME>` selects `compressor_2/strategies/<name>.py`); the run's
driver (`run/driver.py`) runs every one's loop. A strategy's private arithmetic stands
beside it (`ga_*.py`, `gepa_pareto.py`, `archive_ops.py`; `search.py` holds the steps
random and CMA-ES share); `operators.py` holds what several use.

A strategy module provides:
- `estimate(config, n_examples) -> Cost`: what its start and each step cost, before any
  work, for the budget warning;
- `make(run) -> run.driver.Strategy`: its decisions over the shared services of
  `run.services.Run`: how it starts, one step, its state as one typed object and how it
  takes it up again;
- `OUTPUT_FILES`: the names it writes in the run directory besides the shared services'
  files, which other commands must not write over.
Adding a strategy is adding a module and a Kconfig entry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, cast

from compressor_2.config.kconfig import choice_names
from compressor_2.errors import ConfigError

if TYPE_CHECKING:
    from compressor_2.config import Config
    from compressor_2.run.budget import Cost
    from compressor_2.run.driver import Strategy as Decisions
    from compressor_2.run.services import Run


class Strategy(Protocol):
    OUTPUT_FILES: tuple[str, ...]

    def estimate(self, config: Config, n_examples: int) -> Cost: ...

    def make(self, run: Run) -> Decisions: ...


def strategy_names() -> tuple[str, ...]:
    """Every strategy Kconfig offers (the entries of the STRATEGY_ choice)."""
    return choice_names("STRATEGY_")


def load_strategy(name: str) -> Strategy:
    module_name = f"{__name__}.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ConfigError(f"CONFIG_STRATEGY={name!r} has no module compressor_2/strategies/{name}.py") from None
    return cast(Strategy, module)
