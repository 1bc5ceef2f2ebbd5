"""Search spaces: parse ``sweep.space`` from a ``conf/sweep/*.yaml`` and turn Optuna suggestions into Hydra overrides.

A space is an ordered mapping from a Hydra override key to a distribution::

    space:
      optim.lr: {type: float, low: 1.0e-4, high: 3.0e-2, log: true}
      data.batch_size: {type: int, low: 8, high: 32, step: 8}
      norm: [layernorm, rmsnorm]                 # a plain list is a categorical
      attention: {type: categorical, choices: [mha, gqa, sliding]}
      attention.n_kv_head: {type: categorical, choices: [1, 2], when: {attention: [gqa, sliding]}}

The key is used verbatim both as the Optuna parameter name and as the Hydra override key, so a key naming a
config group (``norm``, ``attention``, ...) selects a group option (``norm=rmsnorm``) and a dotted key sets a
value (``attention.n_kv_head=2``). Hydra applies group choices before value overrides, whatever their order.
``when`` makes a parameter conditional on earlier parameters (or on values the user fixed on the command line):
it is only suggested when every listed key currently has one of the listed values.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna

from modules.errors import ConfigError
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)


class SpaceError(ConfigError):
    """The search space in a sweep YAML is malformed."""


@dataclass
class Param:
    key: str
    distribution: BaseDistribution
    when: dict[str, list[Any]] = field(default_factory=dict)

    def active(self, values: Mapping[str, Any]) -> bool:
        for other, allowed in self.when.items():
            if other not in values or values[other] not in allowed:
                return False
        return True


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _variants(key: str, exclude: Any) -> tuple[str, ...]:
    """`{type: variants}`: the names modules.registry has for family `key`, less `exclude`."""
    from modules.registry import FAMILIES, names

    if key not in FAMILIES:
        raise SpaceError(f"sweep.space.{key}: type variants is for a model family ({', '.join(FAMILIES)}), "
                         f"not {key!r}")
    found = names(key)
    unknown = sorted(set(_as_list(exclude)) - set(found))
    if unknown:
        raise SpaceError(f"sweep.space.{key}.exclude: {unknown[0]!r} is not a {key} variant "
                         f"(registered: {', '.join(found)})")
    choices = tuple(n for n in found if n not in _as_list(exclude))
    if not choices:
        raise SpaceError(f"sweep.space.{key}: every variant is excluded")
    return choices


def _parse_param(key: str, spec: Any) -> Param:
    if isinstance(spec, (list, tuple)):
        spec = {"type": "categorical", "choices": list(spec)}
    if not isinstance(spec, Mapping):
        raise SpaceError(f"sweep.space.{key}: expected a list of choices or a mapping with 'type', got {spec!r}")
    spec = dict(spec)
    kind = spec.pop("type", "categorical" if "choices" in spec else None)
    when = spec.pop("when", None) or {}
    if not isinstance(when, Mapping):
        raise SpaceError(f"sweep.space.{key}.when: expected a mapping key -> allowed value(s), got {when!r}")
    when = {str(k): _as_list(v) for k, v in when.items()}
    try:
        if kind == "variants":  # every registered variant of a model family, found by modules.registry
            dist = CategoricalDistribution(list(_variants(key, spec.pop("exclude", []))))
        elif kind == "categorical":
            choices = spec.pop("choices")
            if not choices:
                raise SpaceError(f"sweep.space.{key}: empty choices")
            dist: BaseDistribution = CategoricalDistribution(list(choices))
        elif kind == "float":
            step = spec.pop("step", None)
            dist = FloatDistribution(
                float(spec.pop("low")), float(spec.pop("high")), log=bool(spec.pop("log", False)),
                step=None if step is None else float(step),
            )
        elif kind == "int":
            dist = IntDistribution(
                int(spec.pop("low")), int(spec.pop("high")), log=bool(spec.pop("log", False)),
                step=int(spec.pop("step", 1) or 1),
            )
        else:
            raise SpaceError(f"sweep.space.{key}: unknown type {kind!r} (valid: categorical, float, int, variants)")
    except KeyError as e:
        raise SpaceError(f"sweep.space.{key}: missing {e.args[0]!r} for type {kind}") from None
    except SpaceError:
        raise
    except (TypeError, ValueError) as e:
        raise SpaceError(f"sweep.space.{key}: {e}") from None
    if spec:
        raise SpaceError(f"sweep.space.{key}: unknown field(s) {sorted(spec)}")
    return Param(key=key, distribution=dist, when=when)


class SearchSpace:
    """An ordered list of (possibly conditional) parameters."""

    def __init__(self, params: list[Param]):
        self.params = params

    @classmethod
    def from_config(cls, space: Mapping[str, Any] | None) -> "SearchSpace":
        if not space:
            raise SpaceError("sweep.space is empty: nothing to search")
        if not isinstance(space, Mapping):
            raise SpaceError(f"sweep.space must be a mapping of override key -> distribution, got {type(space).__name__}")
        return cls([_parse_param(str(k), v) for k, v in space.items()])

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.params]

    def without(self, keys: set[str]) -> "SearchSpace":
        return SearchSpace([p for p in self.params if p.key not in keys])

    def suggest(self, trial: optuna.Trial, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Suggest every active parameter in order; ``fixed`` holds values the user pinned on the command line."""
        values: dict[str, Any] = dict(fixed or {})
        sampled: dict[str, Any] = {}
        for p in self.params:
            if not p.active(values):
                continue
            value = trial._suggest(p.key, p.distribution)  # same path as suggest_float/int/categorical
            values[p.key] = value
            sampled[p.key] = value
        return sampled


_BARE = re.compile(r"^[A-Za-z0-9_\-+./:]+$")


def format_value(value: Any) -> str:
    """Format a Python value for a Hydra override (``key=<value>``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    text = str(value)
    if _BARE.match(text) and text.lower() not in {"null", "true", "false", "nan", "inf", "-inf"}:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def to_overrides(params: Mapping[str, Any]) -> list[str]:
    return [f"{k}={format_value(v)}" for k, v in params.items()]
