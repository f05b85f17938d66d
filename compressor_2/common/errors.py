"""The two failures the CLI reports as one line: bad input (exit 2) and a failed run (exit 1).
A refusal with several culprits (a resume's changed settings) adds one line for each."""

from __future__ import annotations

from collections.abc import Sequence


class ConfigError(Exception):
    """A config, argument or input file is wrong; the message names the culprit. `details`:
    further lines when there are several culprits, one each."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


class RunError(Exception):
    """The inputs were fine but the work failed (server died, API unreachable, ...)."""


class ReflectorUnavailable(RunError):
    """Too many reflector calls in a row failed: the run stops, its state saved."""
