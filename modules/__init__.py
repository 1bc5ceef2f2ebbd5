"""A pure-torch GPT whose every part (position, norm, MLP, attention) is swappable by name."""
from modules.config import GPTConfig, build_config

__all__ = ["GPTConfig", "build_config"]
