"""The model configuration: one validated dataclass, built from the same dicts Hydra hands to `GPT`.

The four families (position, norm, mlp, attention) are each the chosen variant's own `Options` dataclass, so the
keys a YAML may set, their validation and every derived size come from the variant's one file (modules/registry.py
finds it). Every check happens here, at construction, so a bad sweep point fails in microseconds (before any
weights exist) with a one-line ConfigError (a ValueError) that names the field, the value and what would have been
valid.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from modules.options import VariantOptions, check_bool, check_choice, check_int, check_number, fail
from modules.parametrization import PARAMETRIZATIONS, MupOptions, check_mup, mup_heads
from modules.registry import FAMILIES, names, variant

DEFAULTS = {"position": "learned", "norm": "layernorm", "mlp": "gelu", "attention": "mha"}


def _family_options(family: str, value) -> VariantOptions:
    """Accept a name ("rope"), a mapping ({"name": "rope", "base": 500}) or a ready Options object."""
    if isinstance(value, VariantOptions):
        value = asdict(value)
    elif isinstance(value, str):
        value = {"name": value}
    elif not isinstance(value, Mapping):
        fail(family, value, "expected a variant name or a mapping with a 'name' key")
    d = {str(k): v for k, v in value.items()}
    if "name" not in d:
        fail(f"{family}.name", None, "missing")
    if not isinstance(d["name"], str) or d["name"] not in names(family):
        fail(f"{family}.name", d["name"], f"choose one of {', '.join(names(family))}")
    options = variant(family, d["name"]).Options
    allowed = {f.name for f in fields(options)}
    unknown = sorted(set(d) - allowed)
    if unknown:
        key = unknown[0]
        owners = [n for n in names(family) if key in {f.name for f in fields(variant(family, n).Options)}]
        hint = f" ({key} is used by {', '.join(f'{family}={o}' for o in owners)})" if owners else ""
        fail(f"{family}.{key}", d[key],
             f"unknown key for {family}={d['name']}; valid keys are {', '.join(sorted(allowed))}{hint}")
    return options(**d)


def _mup_options(value) -> MupOptions:
    if value is None:
        return MupOptions()
    if isinstance(value, MupOptions):
        return value
    if not isinstance(value, Mapping):
        fail("mup", value, "expected a mapping like {base_width: 64}")
    d = {str(k): v for k, v in value.items()}
    unknown = sorted(set(d) - {f.name for f in fields(MupOptions)})
    if unknown:
        fail(f"mup.{unknown[0]}", d[unknown[0]],
             f"unknown key; valid keys are {', '.join(f.name for f in fields(MupOptions))}")
    return MupOptions(**d)


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    position: VariantOptions = DEFAULTS["position"]
    norm: VariantOptions = DEFAULTS["norm"]
    mlp: VariantOptions = DEFAULTS["mlp"]
    attention: VariantOptions = DEFAULTS["attention"]
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True
    parametrization: str = "sp"  # sp: GPT-2's; mup: Tensor Programs V relative to mup.base_width (parametrization.py)
    # under mup with mup.width_grows=heads (the default), n_head is replaced by n_embd / mup.head_dim at construction
    mup: MupOptions | Mapping | None = None

    def __post_init__(self):
        # Families may arrive as names or dicts (Hydra with _convert_: all); make each its variant's Options.
        for family in FAMILIES:
            object.__setattr__(self, family, _family_options(family, getattr(self, family)))
        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            check_int(key, getattr(self, key))
        check_number("dropout", self.dropout, 0, 1, lo_open=False)
        check_bool("bias", self.bias)
        check_bool("tie_weights", self.tie_weights)
        check_choice("parametrization", self.parametrization, PARAMETRIZATIONS)
        object.__setattr__(self, "mup", _mup_options(self.mup))
        if self.parametrization == "mup":  # width grows by heads: n_head follows n_embd (parametrization.py)
            n_head, mup = mup_heads(self)
            object.__setattr__(self, "n_head", n_head)
            object.__setattr__(self, "mup", mup)
        if self.n_embd % self.n_head:
            fail("n_embd", self.n_embd, f"must be divisible by n_head={self.n_head}")
        # cross-family checks, asked of each variant (attention first: rope's check reads its rotary width); a
        # variant that cannot run under a parametrization refuses it here
        for family in ("attention", "position", "norm", "mlp"):
            self.variant(family).validate(self)
        if self.parametrization == "mup":
            check_mup(self)

    def variant(self, family: str) -> type:
        """The class of the chosen variant of a family, e.g. cfg.variant("attention")."""
        return variant(family, getattr(self, family).name)

    # ---- derived sizes: the single source of truth for the model and for accounting ----
    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        return self.variant("attention").n_kv_head(self)

    @property
    def window(self) -> int | None:
        return self.variant("attention").window(self)

    @property
    def rotary_dim(self) -> int:
        return self.variant("attention").rotary_dim(self)

    @property
    def mlp_hidden(self) -> int:
        return self.mlp.hidden if self.mlp.hidden is not None else self.variant("mlp").default_hidden(self)

    @classmethod
    def from_dict(cls, d) -> "GPTConfig":
        """From a dict / DictConfig as passed to GPT (Hydra's `_target_`/`_convert_` keys are ignored)."""
        if isinstance(d, GPTConfig):
            return d
        if not isinstance(d, Mapping):
            fail("config", d, "expected a mapping or a GPTConfig")
        d = {str(k): v for k, v in d.items() if not str(k).startswith("_")}
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - allowed)
        if unknown:
            fail(unknown[0], d[unknown[0]], f"unknown key; valid keys are {', '.join(sorted(allowed))}")
        missing = [k for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd") if k not in d]
        if missing:
            fail(missing[0], None, "missing")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def build_config(**kwargs) -> GPTConfig:
    """Validate a model config without building any weights, e.g. to reject a sweep point early."""
    return GPTConfig.from_dict(kwargs)
