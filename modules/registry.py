"""The variant registry: every module file in modules/{positions,norms,mlps,attention}/ that defines a variant
registers it with `@register(family, name)`, and the registry imports each family's package on first use, so a
new variant is one new file: nothing else lists the names.

    names("norm")            -> ("dyt", "layernorm", ...)   (every registered name, sorted)
    variant("norm", "dyt")   -> the class; its `Options` dataclass is the family config `cfg.norm`
"""
from __future__ import annotations

import importlib
import pkgutil

FAMILIES = ("position", "norm", "mlp", "attention")
_PACKAGES = {"position": "modules.positions", "norm": "modules.norms", "mlp": "modules.mlps",
             "attention": "modules.attention"}
_VARIANTS: dict[str, dict[str, type]] = {f: {} for f in FAMILIES}
_discovered: set[str] = set()


def register(family: str, name: str):
    """Class decorator: `@register("norm", "dyt")` makes the class the variant `norm=dyt`."""
    if family not in _VARIANTS:
        raise ValueError(f"invalid family={family!r}: choose one of {', '.join(FAMILIES)}")

    def deco(cls):
        other = _VARIANTS[family].get(name)
        if other is not None and other is not cls:
            raise ValueError(f"invalid {family} name={name!r}: already registered by {other.__module__}")
        cls.name = name
        _VARIANTS[family][name] = cls
        return cls
    return deco


def _discover(family: str) -> dict[str, type]:
    if family not in _discovered:
        package = importlib.import_module(_PACKAGES[family])
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        _discovered.add(family)
    return _VARIANTS[family]


def names(family: str) -> tuple[str, ...]:
    """The registered variant names of a family, sorted."""
    if family not in _VARIANTS:
        raise ValueError(f"invalid family={family!r}: choose one of {', '.join(FAMILIES)}")
    return tuple(sorted(_discover(family)))


def variant(family: str, name: str) -> type:
    found = _discover(family) if family in _VARIANTS else None
    if found is None:
        raise ValueError(f"invalid family={family!r}: choose one of {', '.join(FAMILIES)}")
    if name not in found:
        from modules.errors import ConfigError
        raise ConfigError(f"invalid {family}.name={name!r}: choose one of {', '.join(sorted(found))}")
    return found[name]
