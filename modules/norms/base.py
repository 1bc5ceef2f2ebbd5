"""What every normalisation layer shares: the family's options (where it sits, whether q/k get one too) and its
checks; its parameters are counted from the module itself (modules/accounting.py). Placement (pre/post) is
applied by the GPT block; QK-norm by the attention."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from modules.options import VariantOptions, check_bool, check_choice, check_number


@dataclass(frozen=True)
class NormOptions(VariantOptions):
    placement: str = "pre"   # pre: x + f(norm(x)); post: norm(x + f(x)) (the original Transformer)
    qk_norm: bool = False    # normalise queries and keys per head before the dot product

    family = "norm"

    def __post_init__(self):
        check_choice(self.key("placement"), self.placement, ("pre", "post"))
        check_bool(self.key("qk_norm"), self.qk_norm)


@dataclass(frozen=True)
class EpsNormOptions(NormOptions):
    """Norms that divide by a statistic keep it away from zero with eps (layernorm, rmsnorm: inside the root)."""
    eps: float = 1e-5

    def __post_init__(self):
        super().__post_init__()
        check_number(self.key("eps"), self.eps, 0, 1)


class Norm(nn.Module):
    """A norm of width `dim`, built from the GPTConfig (its options are cfg.norm; cfg.bias is the model's)."""
    Options = NormOptions

    @classmethod
    def validate(cls, cfg) -> None:
        """Checks that involve the rest of the model."""
