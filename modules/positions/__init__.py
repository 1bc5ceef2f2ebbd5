"""Position schemes by name."""
from modules.positions.alibi import ALiBiPosition
from modules.positions.base import Position, apply_rotary
from modules.positions.learned import LearnedPosition
from modules.positions.nope import NoPosition
from modules.positions.rope import RotaryPosition
from modules.positions.sinusoidal import SinusoidalPosition

REGISTRY = {
    "learned": LearnedPosition,
    "rope": RotaryPosition,
    "alibi": ALiBiPosition,
    "nope": NoPosition,
    "sinusoidal": SinusoidalPosition,
}


def build_position(cfg) -> Position:
    return REGISTRY[cfg.position.name](cfg)


__all__ = ["REGISTRY", "Position", "apply_rotary", "build_position"]
