"""Position schemes: one module file each, registered by name (see modules/registry.py)."""
from modules.positions.base import Position, apply_rotary


def build_position(cfg) -> Position:
    from modules.registry import variant
    return variant("position", cfg.position.name)(cfg)


__all__ = ["Position", "apply_rotary", "build_position"]
