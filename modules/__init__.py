"""A pure-torch GPT whose every part (position, norm, MLP, attention) is swappable by name.

The names below load lazily, so `import modules.errors` (the project's error base, which analysis/ uses too) does
not import torch or the model code.
"""

__all__ = ["GPTConfig", "build_config"]


def __getattr__(name):
    if name in __all__:
        from modules import config

        return getattr(config, name)
    raise AttributeError(f"module 'modules' has no attribute {name!r}")
