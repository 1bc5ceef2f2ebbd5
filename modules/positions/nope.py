"""NoPE: no explicit positions at all; the causal mask alone lets the model infer order."""
from modules.positions.base import Position


class NoPosition(Position):
    pass
