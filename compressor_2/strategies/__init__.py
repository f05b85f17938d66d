"""Evolution strategies: one module each, chosen by CONFIG_STRATEGY (a Kconfig choice whose
entry `STRATEGY_<NAME>` selects `compressor_2/strategies/<name>.py`).

A strategy module provides two functions:
- `estimate(config, n_examples) -> Cost`: what its start and each step cost, before any
  work, for the budget warning;
- `run(run) -> str`: evolves with the shared services of `evolution.run.Run` (archive,
  evaluator, reflector, budget, best-ever, outputs), resuming from its own state when
  there is one, and returns why it stopped.
Adding a strategy is adding a module and a Kconfig entry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, cast

from compressor_2.errors import ConfigError

if TYPE_CHECKING:
    from compressor_2.config import Config
    from compressor_2.evolution.budget import Cost
    from compressor_2.evolution.run import Run


class Strategy(Protocol):
    def estimate(self, config: Config, n_examples: int) -> Cost: ...

    def run(self, run: Run) -> str: ...


def load_strategy(name: str) -> Strategy:
    module_name = f"{__name__}.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ConfigError(f"CONFIG_STRATEGY={name!r} has no module compressor_2/strategies/{name}.py") from None
    return cast(Strategy, module)
