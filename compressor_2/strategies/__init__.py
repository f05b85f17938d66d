"""Evolution strategies: one loop each, chosen by CONFIG_STRATEGY (a Kconfig choice whose
entry `STRATEGY_<NAME>` selects `compressor_2/strategies/<name>.py`). A strategy's private
arithmetic stands beside its loop (`ga_*.py`, `gepa_pareto.py`, `archive_ops.py`;
`search.py` is the loop random and CMA-ES share); `operators.py` holds what several use.

A strategy module provides:
- `estimate(config, n_examples) -> Cost`: what its start and each step cost, before any
  work, for the budget warning;
- `run(run) -> str`: evolves with the shared services of `run.services.Run` (archive,
  evaluator, reflector, budget, best-ever, outputs), resuming from its own state when
  there is one, and returns why it stopped;
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
    from compressor_2.run.services import Run


class Strategy(Protocol):
    OUTPUT_FILES: tuple[str, ...]

    def estimate(self, config: Config, n_examples: int) -> Cost: ...

    def run(self, run: Run) -> str: ...


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
