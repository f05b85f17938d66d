"""A processor string that no SGLang server can die of: what the steering probe sends a
server before anything relies on the server importing compressor_2.

SGLang unpickles a request's `custom_logit_processor` inside its scheduler, and a string
that fails to load there (a by-reference class whose module is not installed on the
server) kills the whole server; nothing checks the string on admission. This string
holds no code and no reference to compressor_2, only calls of the standard library that
the server makes while it unpickles it:

    (identity, steer)[find_spec("compressor_2") is not None]

so it loads, in any Python 3.9+ that runs SGLang, to `steer` (imported only then, by
`pkgutil.resolve_name`) where compressor_2 is importable, and otherwise to a processor
that returns the logits unchanged (`max(logits, params, key=callable)`: both keys are
False, so max keeps its first argument). A server that cannot import compressor_2 then
answers the probe unsteered, and the run refuses naming what the server needs, instead
of killing it with the run's own by-reference string.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import operator
import pickle
import pkgutil
from collections.abc import Callable
from typing import Any

STEER = "compressor_2.steering.processor:steer"
STEER_PACKAGE = STEER.split(".", 1)[0]
# Protocol 4: every Python that SGLang 0.5.23 runs on reads it.
PROTOCOL = 4


class _Call:
    """Pickles as `function(*args)`, called by the server while it unpickles the string."""

    def __init__(self, function: Callable[..., Any], *args: Any) -> None:
        self.function = function
        self.args = args

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return self.function, self.args


def guarded_spec() -> str:
    """The `custom_logit_processor` string that steers with compressor_2's processor where
    the server can import it, and leaves the logits alone where it cannot."""
    importable = _Call(operator.is_not, _Call(importlib.util.find_spec, STEER_PACKAGE), None)
    # SGLang calls what the string loads to with no arguments, then the result with
    # (logits, params): both branches are callables that build such a processor.
    identity = functools.partial(functools.partial, max, key=callable)
    steering = functools.partial(pkgutil.resolve_name, STEER)
    chosen = _Call(operator.getitem, (identity, steering), importable)
    return json.dumps({"callable": pickle.dumps(chosen, protocol=PROTOCOL).hex()})
