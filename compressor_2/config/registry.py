"""The strategy registry: every entry `STRATEGY_<NAME>` of Kconfig's strategy choice names the
module compressor_2/strategies/<name>.py (or package <name>/), a plug-in loaded here by that name (nothing below
the commands imports a strategy module). It sits with the configuration because the
configuration reads what a module declares of itself, all optional:
- `read_options(reader)`: its options, typed and checked once, when the config is loaded;
- `SENTINELS`: those of its options that have no default, refused at their sentinel first;
- `IDENTITY`: its options in the run identity (`resume.identity.Option`s).
A strategy's options are read when it is chosen, and whatever the choice when no Kconfig
menu depends on its entry (every config then sets them: the GA's)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from compressor_2.common import ConfigError
from compressor_2.config.kconfig import Reader, choice_names, menu_depends_on

STRATEGIES_PACKAGE = "compressor_2.strategies"


def strategy_names() -> tuple[str, ...]:
    """Every strategy Kconfig offers (the entries of the STRATEGY_ choice), in its order."""
    return choice_names("STRATEGY_")


def strategy_module(name: str) -> ModuleType:
    module_name = f"{STRATEGIES_PACKAGE}.{name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ConfigError(f"CONFIG_STRATEGY={name!r} has no module compressor_2/strategies/{name}.py") from None


def always_read(name: str) -> bool:
    """Whether every config sets strategy `name`'s options (no Kconfig menu depends on its entry)."""
    return not menu_depends_on(f"STRATEGY_{name.upper()}")


def read(names: tuple[str, ...], r: Reader) -> dict[str, Any]:
    """The options of the strategies `names` that declare any, by name."""
    modules = {name: strategy_module(name) for name in names}
    return {name: module.read_options(r) for name, module in modules.items() if hasattr(module, "read_options")}


def sentinels(names: tuple[str, ...]) -> tuple[str, ...]:
    """The options without a default of the strategies `names`."""
    return tuple(symbol for name in names for symbol in getattr(strategy_module(name), "SENTINELS", ()))


def identity(name: str) -> tuple[Any, ...]:
    """Strategy `name`'s part of the run identity: its `IDENTITY`, none when it declares none."""
    return tuple(getattr(strategy_module(name), "IDENTITY", ()))
