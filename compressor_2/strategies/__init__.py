"""Evolution strategies, each one module or package found by name (`load_strategy`), its options read with `options_of`.

CONFIG_STRATEGY's entry `STRATEGY_<NAME>` in Kconfig selects `compressor_2/strategies/<name>.py`
or the package `compressor_2/strategies/<name>/`, through the strategy registry
(`config/registry.py`); the run's driver (`run/driver.py`) runs every loop. A strategy with
private arithmetic is a package holding it (`ga/`, `archive/`, `gepa/`, each one's face
naming what the registry reads); `search.py` holds random's and CMA-ES's steps,
`individual.py` the GA's and CMA-ES's individuals, `operators.py` what several use. A
strategy module provides (`Plugin`):
- `make(run) -> run.Strategy`: how it starts, one step, its state as one typed object (in
  its `state_format`) and how it takes that up again, over the services of `run.Run`;
- `estimate(config, n_examples) -> Cost`: its start's and each step's cost, before any
  work, for the budget warning;
- `FILES` (`resume.RunFiles`): what it writes in the run directory besides the shared files,
  its state file first; its state format is made with it;
and, when it has options, `read_options(reader)` (typed and checked once, when the config
is loaded) and `IDENTITY` (its options in the run identity). Adding a strategy is adding a
module and a Kconfig entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

from compressor_2.common import ConfigError
from compressor_2.config import strategy_module, strategy_names

if TYPE_CHECKING:
    from compressor_2.config import Config
    from compressor_2.resume import RunFiles
    from compressor_2.run import Cost, Run, Strategy

__all__ = ["Plugin", "load_strategy", "options_of", "strategy_names"]


class Plugin(Protocol):
    """What a strategy module provides to the commands (a module is its own plug-in)."""

    FILES: RunFiles

    def estimate(self, config: Config, n_examples: int) -> Cost: ...

    def make(self, run: Run) -> Strategy: ...


def load_strategy(name: str) -> Plugin:
    """The module of strategy `name`; a ConfigError naming the file when it has none."""
    return cast(Plugin, strategy_module(name))


def options_of(config: Config, name: str) -> Any:
    """The options of strategy `name`, as its module read them: the loader reads them when
    CONFIG_STRATEGY names that strategy."""
    found = config.strategy_options.get(name)
    if found is None:
        raise ConfigError(f"CONFIG_STRATEGY_{name.upper()}=y is needed for the {name} strategy's options")
    return found
