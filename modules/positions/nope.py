"""NoPE: no explicit positions at all; the causal mask alone lets the model infer order."""
from modules.positions.base import Position
from modules.registry import register


@register("position", "nope")
class NoPosition(Position):
    pass
