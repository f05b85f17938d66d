"""Reading a Kconfig `.config` with kconfiglib, refusing anything suspicious.

kconfiglib never raises on a bad value: it warns and falls back to the default.
Here every warning, unknown name, dependency-unmet assignment and repeated line is a
`ConfigError` naming the symbol and the value; `Reader` then gives typed access to the
values, each failure naming `CONFIG_<NAME>`.
"""

from __future__ import annotations

import functools
import math
import re
import sys
from pathlib import Path

import kconfiglib

from compressor_2.common import ConfigError, check_readable_file

KCONFIG_PATH = Path(__file__).resolve().parent.parent.parent / "Kconfig"
# The largest amount in logit units an option may give (a step, a scale, a limit): a
# language model's logits lie within a few tens, and this keeps every sum and square of
# deltas finite, in float32 too.
MAX_LOGITS = 1000.0
# Kconfig's own forms of a value. kconfiglib reads a bool by its first letter (`young` is y)
# and an int with Python's int(), which takes fullwidth and Arabic-Indic digits, `1_0` and
# spaces around the digits: each assignment's raw text must be in one of these.
_FORMS = {
    kconfiglib.BOOL: (re.compile(r"[yn]"), "y or n"),
    kconfiglib.TRISTATE: (re.compile(r"[ymn]"), "y, m or n"),
    kconfiglib.INT: (re.compile(r"-?[0-9]+"), "an integer in ASCII digits, e.g. 10"),
    kconfiglib.HEX: (re.compile(r"0[xX][0-9a-fA-F]+"), "a hex number such as 0x1f"),
}
_ASSIGNMENT = re.compile(r"CONFIG_([^=]+)=(.*)")  # kconfiglib's own, on a line without its trailing space
# A float option's text: ASCII digits, an optional fraction and exponent, nothing around.
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def read_config(path: Path) -> Reader:
    """The `.config` at `path`, loaded against KCONFIG_PATH and checked."""
    text = _check_readable(path)
    kconf = kconfiglib.Kconfig(str(KCONFIG_PATH), warn_to_stderr=False)
    kconf.warn_assign_undef = True
    kconf.warn_assign_override = True
    # A line repeated with the same value is refused too: one of the two was meant to be another.
    kconf.warn_assign_redun = True
    kconf.load_config(str(path))
    for sym in kconf.unique_defined_syms:
        sym.str_value  # range warnings are only emitted when a value is computed
    _check_forms(path, text, kconf)
    _check_kconfig_warnings(kconf)
    _check_unmet_assignments(kconf)
    return Reader(kconf)


def choice_names(prefix: str) -> tuple[str, ...]:
    """Every entry `PREFIX_NAME` of the choice whose symbols start with `prefix`, as `name`,
    in Kconfig's order: a new entry in Kconfig needs no list in the code."""
    return _choice_names(KCONFIG_PATH, prefix)


@functools.cache
def _choice_names(kconfig: Path, prefix: str) -> tuple[str, ...]:
    """Parsed once a process: every file a command writes asks (through `owned_files`)."""
    choice = _choice(kconfiglib.Kconfig(str(kconfig), warn_to_stderr=False), prefix)
    return tuple(sym.name.removeprefix(prefix).lower() for sym in choice.syms)


def menu_depends_on(name: str) -> bool:
    """Whether a menu of Kconfig depends on the symbol `name`: its options are then set
    only while that symbol is (a strategy's, while its entry is chosen)."""
    return name in _menu_dependencies(KCONFIG_PATH)


@functools.cache
def _menu_dependencies(kconfig: Path) -> frozenset[str]:
    kconf = kconfiglib.Kconfig(str(kconfig), warn_to_stderr=False)
    return frozenset(item.name for node in kconf.node_iter() if node.item is kconfiglib.MENU
                     for item in kconfiglib.expr_items(node.dep) if isinstance(item, kconfiglib.Symbol))


def _choice(kconf: kconfiglib.Kconfig, prefix: str) -> kconfiglib.Choice:
    """The choice whose symbols start with `prefix`."""
    return next(sym.choice for name, sym in kconf.syms.items() if name.startswith(prefix) and sym.choice is not None)


def _check_readable(path: Path) -> str:
    """The text of a config kconfiglib can read: it would report a directory or a non-UTF-8
    byte with an exception naming no line, and wait for ever on a FIFO."""
    if path.is_dir():
        raise ConfigError(f"config file '{path}' is a directory: pass the .config file itself")
    # Before the not-found branch: a FIFO, a socket or a device is there, just not a file.
    check_readable_file(path, "config file")
    if not path.is_file():
        raise ConfigError(
            f"config file '{path}' not found: create it with `make defconfig` "
            "(the embedded default) or `make menuconfig`, or pass --config PATH"
        )
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"config file '{path}' cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file '{path}' line {line}: byte {data[exc.start]:#04x} is not UTF-8; "
                          "save the file as UTF-8") from None
    # The lines kconfiglib reads: a text file's universal newlines, as read_text gives them.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _check_forms(path: Path, text: str, kconf: kconfiglib.Kconfig) -> None:
    """Every bool, tristate, int and hex assignment in `text` (the file at `path`) written
    in Kconfig's form."""
    # Split as kconfiglib splits, on "\n" only: splitlines() also ends a line at \x0c, \x1c
    # or \u2028, so `CONFIG_X=n\x0cjunk` passed here as `n` while kconfiglib read the whole.
    for number, line in enumerate(text.split("\n"), 1):
        match = _ASSIGNMENT.match(line.rstrip())
        sym = kconf.syms.get(match[1]) if match else None
        if match is None or sym is None or sym.orig_type not in _FORMS:
            continue
        form, what = _FORMS[sym.orig_type]
        if not form.fullmatch(match[2]):
            raise ConfigError(f"{path}:{number}: CONFIG_{sym.name}={match[2]!r} is not {what}")


def decimal(text: str) -> float:
    """`text` as a float when it is a number in ASCII digits with nothing around it (float()
    also takes `1_0`, spaces and other scripts' digits), else NaN."""
    return float(text) if _DECIMAL.fullmatch(text) else math.nan


class Reader:
    """Typed access to symbol values, each failure naming `CONFIG_<NAME>`."""

    def __init__(self, kconf: kconfiglib.Kconfig) -> None:
        self._kconf = kconf

    def _sym(self, name: str) -> kconfiglib.Symbol:
        return self._kconf.syms[name]

    def raw(self, name: str) -> str:
        sym = self._sym(name)
        if sym.visibility or not sym.defaults:
            return sym.str_value
        # A symbol whose dependency is unmet reads as "": keep its Kconfig default
        # so the dataclass stays fully typed (the setting is simply unused).
        return sym.defaults[0][0].str_value

    def string(self, name: str) -> str:
        return self.raw(name)

    def integer(self, name: str, low: float = -math.inf, high: float = math.inf) -> int:
        """An int option within [low, high]: the bounds of a symbol Kconfig cannot give a
        `range` (its sentinel default lies outside it)."""
        value = self.raw(name)
        try:
            # Base 10, as kconfiglib reads an int symbol: "01" is 1 there, so it is here.
            parsed = int(value, 10)
        except ValueError:
            raise ConfigError(f"CONFIG_{name}={value!r} is not an integer") from None
        if not low <= parsed <= high:
            raise ConfigError(f"CONFIG_{name}={parsed} must be {interval(low, high)}")
        return parsed

    def number(self, name: str, low: float, high: float, above: bool = False) -> float:
        """A float option (kept in a string symbol): finite, not subnormal, and within
        [low, high] ((low, high] when `above`), bounds that keep the arithmetic it feeds
        finite; Kconfig's help text documents them. No float option is read without."""
        value = self.raw(name)
        parsed = decimal(value)
        if math.isnan(parsed):  # nan and inf among them
            raise ConfigError(f"CONFIG_{name}={value!r} is not a number in ASCII digits, e.g. 0.5 or 1e-3")
        if not math.isfinite(parsed):
            raise ConfigError(f"CONFIG_{name}={value!r} is not a finite number")
        if not (low < parsed if above else low <= parsed) or parsed > high:
            raise ConfigError(f"CONFIG_{name}={value} must be {interval(low, high, above)}")
        if parsed != 0 and abs(parsed) < sys.float_info.min:
            # A subnormal float has lost its precision, and its reciprocal overflows.
            zero = "0 or " if low < 0 or (low == 0 and not above) else ""
            raise ConfigError(f"CONFIG_{name}={value} is too close to 0 to compute with: write {zero}a value "
                              f"of magnitude at least {sys.float_info.min:.1e}")
        return parsed

    def flag(self, name: str) -> bool:
        return self._sym(name).tri_value == 2

    def choice(self, options: dict[str, str]) -> str:
        return next(label for sym, label in options.items() if self.flag(sym))

    def choice_suffix(self, prefix: str) -> str:
        """The selected `PREFIX_NAME` symbol of the choice whose symbols start with
        `prefix`, as `name`: a new entry in Kconfig needs no list here."""
        return _choice(self._kconf, prefix).selection.name.removeprefix(prefix).lower()


def _check_kconfig_warnings(kconf: kconfiglib.Kconfig) -> None:
    if kconf.warnings:
        message = kconf.warnings[0].replace("warning: ", "")
        message = re.sub(r"\s*\(defined at [^)]*\)", "", message)
        # We refuse instead of falling back, so kconfiglib's "ignored" wording would mislead.
        message = re.sub(r"\s*(--\s*)?(falling back on defaults|[.,]?\s*[Aa]ssignment ignored\.?)", "", message)
        # kconfiglib names symbols without the prefix users see in .config files.
        message = re.sub(
            r"\b(?<!CONFIG_)([A-Z][A-Z0-9_]{2,})\b",
            lambda m: f"CONFIG_{m[1]}" if m[1] in kconf.syms or "symbol " + m[1] in message else m[1],
            message,
        )
        raise ConfigError(" ".join(message.split()))


def _symbol_name(sc: kconfiglib.Symbol) -> str:
    """A symbol as users write it in .config; a constant (`"llm"` in `SELECTION = "llm"`) quoted."""
    return f'"{sc.name}"' if sc.is_constant else f"CONFIG_{sc.name}"


def _check_unmet_assignments(kconf: kconfiglib.Kconfig) -> None:
    for sym in kconf.unique_defined_syms:
        if sym.user_value is None:
            continue
        if sym.orig_type in (kconfiglib.BOOL, kconfiglib.TRISTATE):
            effective, given = sym.tri_value, sym.user_value
            shown = {0: "n", 1: "m", 2: "y"}.get(given, str(given))
        else:
            effective, given = sym.str_value, sym.user_value
            shown = str(given)
        if effective != given:
            if sym.choice is not None:
                raise ConfigError(
                    f"CONFIG_{sym.name}={shown} conflicts with another choice in the same menu "
                    f"(only one of {', '.join('CONFIG_' + s.name for s in sym.choice.syms)} may be y)"
                )
            raise ConfigError(
                f"CONFIG_{sym.name}={shown} is set but its dependency "
                f"({kconfiglib.expr_str(sym.direct_dep, _symbol_name)}) is not met, "
                "so it would be ignored"
            )


def interval(low: float, high: float, above: bool = False) -> str:
    """How a message states a range: "in [0, 1]", "in (0, 1000]", "in [1, 1e6]", ">= 0"."""
    if math.isinf(high):
        return f"{'>' if above else '>='} {shown_number(low)}"
    return f"in {'(' if above else '['}{shown_number(low)}, {shown_number(high)}]"


def shown_number(x: float) -> str:
    """1e6 rather than 1e+06, 1000 rather than 1000.0."""
    return re.sub(r"e([+-])0*(\d)", lambda m: f"e{'-' if m[1] == '-' else ''}{m[2]}", f"{x:g}")


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)
