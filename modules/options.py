"""Validation helpers for config values, and the base of every variant's options.

Each variant class declares `Options`, a frozen dataclass whose fields are the keys its YAML may set (always
`name`, plus the family's shared keys, plus its own); the dataclass validates each value on construction and
raises a one-line ConfigError naming the field, the value and what would have been valid.
"""
from __future__ import annotations

from dataclasses import dataclass

from modules.errors import ConfigError


def fail(field_name: str, value, expected: str):
    raise ConfigError(f"invalid {field_name}={value!r}: {expected}")


def is_int(value, lo: int | None = None, hi: int | None = None) -> bool:
    """An int in [lo, hi] (None: unbounded). bool is an int subclass; `n_layer: true` in a YAML is a typo, not 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def check_int(field_name: str, value, lo: int = 1, hi: int | None = None) -> int:
    if not is_int(value):
        fail(field_name, value, "expected an integer")
    if not is_int(value, lo, hi):
        fail(field_name, value, f"expected an integer in [{lo}, {hi if hi is not None else 'inf'}]")
    return value


def check_number(field_name: str, value, lo: float, hi: float | None = None, lo_open=True, hi_open=True):
    """A real number in the interval (lo, hi) (open or closed ends; hi None: unbounded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(field_name, value, "expected a number")
    ok = (value > lo if lo_open else value >= lo) and (hi is None or (value < hi if hi_open else value <= hi))
    if not ok:
        if hi is None:
            fail(field_name, value, f"expected a number {'>' if lo_open else '>='} {lo:g}")
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        fail(field_name, value, f"expected a number in {left}{lo:g}, {hi:g}{right}")
    return value


def check_bool(field_name: str, value) -> bool:
    if not isinstance(value, bool):
        fail(field_name, value, "expected true or false")
    return value


def check_choice(field_name: str, value, choices) -> str:
    if value not in choices:
        fail(field_name, value, f"choose one of {', '.join(choices)}")
    return value


@dataclass(frozen=True)
class VariantOptions:
    """The options every variant has: its name. Families add their shared keys; variants their own."""
    name: str

    family = ""  # set by each family's base class (class attribute, not a field)

    def key(self, field_name: str) -> str:
        """The dotted key a user writes, e.g. `attention.window`, for error messages."""
        return f"{self.family}.{field_name}"
