"""The model configuration: one validated dataclass, built from the same dicts Hydra hands to `GPT`.

Every check happens here, at construction, so a bad sweep point fails in microseconds (before any weights
exist) with a one-line `ValueError` that names the field, the value and what would have been valid.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

# The variant names of each family. The registries in modules/{positions,norms,mlps,attention}/ are keyed by
# exactly these names (a test checks that they agree); they live here so validation needs no torch modules.
POSITIONS = ("learned", "rope", "alibi", "nope", "sinusoidal")
NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("pre", "post")
MLPS = ("gelu", "relu2", "swiglu", "geglu")
ATTENTIONS = ("mha", "gqa", "mqa", "sliding", "mla")


def _fail(field_name: str, value, expected: str):
    raise ValueError(f"invalid {field_name}={value!r}: {expected}")


def _check_int(field_name: str, value, lo: int = 1, hi: int | None = None) -> int:
    # bool is an int subclass; `n_layer: true` in a YAML is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(field_name, value, "expected an integer")
    if value < lo or (hi is not None and value > hi):
        _fail(field_name, value, f"expected an integer in [{lo}, {hi if hi is not None else 'inf'}]")
    return value


def _check_choice(field_name: str, value, choices) -> str:
    if value not in choices:
        _fail(field_name, value, f"choose one of {', '.join(choices)}")
    return value


def _family_dict(family: str, value, cls) -> dict:
    """Accept a name ("rope"), a mapping ({"name": "rope", "base": 500}) or a ready dataclass."""
    if isinstance(value, cls):
        return asdict(value)
    if isinstance(value, str):
        return {"name": value}
    if not isinstance(value, Mapping):
        _fail(family, value, "expected a variant name or a mapping with a 'name' key")
    d = {str(k): v for k, v in value.items()}
    allowed = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - allowed)
    if unknown:
        _fail(f"{family}.{unknown[0]}", d[unknown[0]], f"unknown key; valid keys are {', '.join(sorted(allowed))}")
    if "name" not in d:
        _fail(f"{family}.name", None, "missing")
    return d


@dataclass(frozen=True)
class PositionConfig:
    name: str = "learned"
    base: float = 10000.0  # RoPE frequency base; only rope reads it

    def __post_init__(self):
        _check_choice("position.name", self.name, POSITIONS)
        if isinstance(self.base, bool) or not isinstance(self.base, (int, float)) or not self.base > 1:
            _fail("position.base", self.base, "expected a number > 1")


@dataclass(frozen=True)
class NormConfig:
    name: str = "layernorm"
    placement: str = "pre"   # pre: x + f(norm(x)); post: norm(x + f(x)) (the original Transformer)
    qk_norm: bool = False    # normalise queries and keys per head before the dot product
    eps: float = 1e-5

    def __post_init__(self):
        _check_choice("norm.name", self.name, NORMS)
        _check_choice("norm.placement", self.placement, PLACEMENTS)
        if not isinstance(self.qk_norm, bool):
            _fail("norm.qk_norm", self.qk_norm, "expected true or false")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0 < self.eps < 1:
            _fail("norm.eps", self.eps, "expected a number in (0, 1)")


@dataclass(frozen=True)
class MLPConfig:
    name: str = "gelu"
    hidden: int | None = None  # None: 4d for gelu/relu2, ~8/3 d (multiple of 8) for the gated ones

    def __post_init__(self):
        _check_choice("mlp.name", self.name, MLPS)
        if self.hidden is not None:
            _check_int("mlp.hidden", self.hidden)


@dataclass(frozen=True)
class AttentionConfig:
    name: str = "mha"
    n_kv_head: int | None = None      # gqa (required), sliding (None: n_head); mha/mqa fix it themselves
    window: int | None = None         # sliding only: each query sees itself and the W-1 previous tokens
    kv_latent_dim: int | None = None  # mla only: width d_c of the cached latent (None: n_embd // 2)
    rope_dim: int | None = None       # mla only: width of the decoupled key part shared by all heads (None: hs // 2)

    def __post_init__(self):
        _check_choice("attention.name", self.name, ATTENTIONS)
        for key, owner in (("window", "sliding"), ("kv_latent_dim", "mla"), ("rope_dim", "mla")):
            if getattr(self, key) is not None and self.name != owner:
                _fail(f"attention.{key}", getattr(self, key), f"only used by attention={owner}; leave it null")
        if self.n_kv_head is not None:
            _check_int("attention.n_kv_head", self.n_kv_head)
            if self.name == "mla":
                _fail("attention.n_kv_head", self.n_kv_head, "mla has no kv heads (it caches a latent); leave it null")
        if self.name == "gqa" and self.n_kv_head is None:
            _fail("attention.n_kv_head", None, "gqa needs an integer number of key/value heads")
        if self.name == "mqa" and self.n_kv_head not in (None, 1):
            _fail("attention.n_kv_head", self.n_kv_head, "mqa always has exactly 1 key/value head")
        if self.name == "sliding":
            if self.window is None:
                _fail("attention.window", None, "sliding needs an integer window >= 1")
            _check_int("attention.window", self.window)
        if self.kv_latent_dim is not None:
            _check_int("attention.kv_latent_dim", self.kv_latent_dim)
        if self.rope_dim is not None:
            _check_int("attention.rope_dim", self.rope_dim, lo=0)


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    position: PositionConfig = field(default_factory=PositionConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True

    def __post_init__(self):
        # Families may arrive as names or dicts (Hydra with _convert_: all); normalise them to dataclasses.
        for key, cls in (("position", PositionConfig), ("norm", NormConfig), ("mlp", MLPConfig),
                         ("attention", AttentionConfig)):
            value = getattr(self, key)
            if not isinstance(value, cls):
                object.__setattr__(self, key, cls(**_family_dict(key, value, cls)))
        _check_int("vocab_size", self.vocab_size)
        _check_int("block_size", self.block_size)
        _check_int("n_layer", self.n_layer)
        _check_int("n_head", self.n_head)
        _check_int("n_embd", self.n_embd)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            _fail("dropout", self.dropout, "expected a number in [0, 1)")
        for key in ("bias", "tie_weights"):
            if not isinstance(getattr(self, key), bool):
                _fail(key, getattr(self, key), "expected true or false")
        if self.n_embd % self.n_head:
            _fail("n_embd", self.n_embd, f"must be divisible by n_head={self.n_head}")
        hs = self.head_size
        if self.n_head % self.n_kv_head:
            _fail("attention.n_kv_head", self.n_kv_head, f"must divide n_head={self.n_head} (choose a divisor)")
        if self.attention.name == "mla":
            if self.kv_latent_dim > self.n_embd:
                _fail("attention.kv_latent_dim", self.kv_latent_dim,
                      f"expected an integer in [1, n_embd={self.n_embd}] (a latent wider than d compresses nothing)")
            if self.position.name == "rope" and (self.rope_dim == 0 or self.rope_dim % 2):
                _fail("attention.rope_dim", self.rope_dim,
                      "rotary embeddings rotate pairs of dimensions; expected an even integer >= 2")
        elif self.position.name == "rope" and hs % 2:
            _fail("n_embd", self.n_embd,
                  f"head size n_embd/n_head={hs} is odd; rope rotates pairs of dimensions, so it must be even")

    # ---- derived sizes: the single source of truth for the model and for accounting ----
    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        a = self.attention
        if a.name == "mqa":
            return 1
        if a.name in ("gqa", "sliding") and a.n_kv_head is not None:
            return a.n_kv_head
        return self.n_head  # mha, sliding without n_kv_head, mla (every head gets its own up-projected K/V)

    @property
    def window(self) -> int | None:
        return self.attention.window if self.attention.name == "sliding" else None

    @property
    def kv_latent_dim(self) -> int:
        a = self.attention.kv_latent_dim
        return self.n_embd // 2 if a is None else a

    @property
    def rope_dim(self) -> int:
        """MLA's decoupled key width; 0 outside MLA."""
        if self.attention.name != "mla":
            return 0
        a = self.attention.rope_dim
        return self.head_size // 2 if a is None else a

    @property
    def mlp_hidden(self) -> int:
        if self.mlp.hidden is not None:
            return self.mlp.hidden
        if self.mlp.name in ("swiglu", "geglu"):
            # A gated MLP has three d x h matrices instead of two, so h = 2/3 * 4d keeps the parameter count
            # (and FLOPs) of the 4d GELU MLP; rounded to a multiple of 8 for friendlier matmul shapes.
            return max(8, 8 * round(8 * self.n_embd / 3 / 8))
        return 4 * self.n_embd

    @classmethod
    def from_dict(cls, d) -> "GPTConfig":
        """From a dict / DictConfig as passed to GPT (Hydra's `_target_`/`_convert_` keys are ignored)."""
        if isinstance(d, GPTConfig):
            return d
        if not isinstance(d, Mapping):
            raise ValueError(f"invalid config={d!r}: expected a mapping or a GPTConfig")
        d = {str(k): v for k, v in d.items() if not str(k).startswith("_")}
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - allowed)
        if unknown:
            _fail(unknown[0], d[unknown[0]], f"unknown key; valid keys are {', '.join(sorted(allowed))}")
        missing = [k for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd") if k not in d]
        if missing:
            _fail(missing[0], None, "missing")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def build_config(**kwargs) -> GPTConfig:
    """Validate a model config without building any weights, e.g. to reject a sweep point early."""
    return GPTConfig.from_dict(kwargs)
