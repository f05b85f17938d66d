"""The two failures the CLI reports as one line: bad input (exit 2) and a failed run (exit 1)."""


class ConfigError(Exception):
    """A config, argument or input file is wrong; the message names the culprit."""


class RunError(Exception):
    """The inputs were fine but the work failed (server died, API unreachable, ...)."""


class ReflectorUnavailable(RunError):
    """Too many reflector calls in a row failed: the run stops, its state saved."""
