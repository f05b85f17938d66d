"""Evolution strategies, chosen by CONFIG_STRATEGY (a Kconfig choice whose entry
`STRATEGY_<NAME>` selects `compressor_2/strategies/<name>.py`): the decisions of each; the
run's driver (`run/driver.py`) runs every loop. Private arithmetic stands beside them
(`ga_*.py`, `gepa_pareto.py`, `archive_ops.py`; `search.py`: random's and CMA-ES's steps);
`operators.py` holds what several use. A strategy module provides:
- `estimate(config, n_examples) -> Cost`: its start's and each step's cost, before any
  work, for the budget warning;
- `make(run) -> run.driver.Strategy`: how it starts, one step, its state as one typed
  object and how it takes that up again, over the services of `run.services.Run`;
- `OUTPUT_FILES`: the names it writes in the run directory besides the shared files.
Adding a strategy is adding a module and a Kconfig entry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol, cast

from compressor_2.common.errors import ConfigError
from compressor_2.config.kconfig import choice_names

if TYPE_CHECKING:
    from compressor_2.config import Config
    from compressor_2.run.budget import Cost
    from compressor_2.run.driver import Strategy as Decisions
    from compressor_2.run.services import Run


class Strategy(Protocol):
    OUTPUT_FILES: tuple[str, ...]

    def estimate(self, config: Config, n_examples: int) -> Cost: ...

    def make(self, run: Run) -> Decisions: ...


def options_of(config: Config, name: str) -> Any:
    """The options of strategy `name` (`config.<name>`): the loader parses them when
    CONFIG_STRATEGY names that strategy."""
    found = getattr(config, name, None)
    if found is None:
        raise ConfigError(f"CONFIG_STRATEGY_{name.upper()}=y is needed for the {name} strategy's options")
    return found


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
