"""Composing conf/ outside `@hydra.main`, written once: `compose(overrides)` for one config, `config_dir()` around
several composes (Hydra's global state is initialised once for the with-block)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
VERSION_BASE = "1.3"  # the same as @hydra.main's in ablations/run.py


@contextlib.contextmanager
def config_dir(conf_dir: Path | str = CONF_DIR, job_name: str = "app") -> Iterator[None]:
    """Hydra initialised on `conf_dir` for the with-block, so `hydra.compose` works inside it."""
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base=VERSION_BASE,
                               job_name=job_name):
        yield


def compose(overrides: Sequence[str], conf_dir: Path | str = CONF_DIR, job_name: str = "app") -> DictConfig:
    """conf/config.yaml composed with `overrides`, as `python -m ablations.run <overrides>` would compose it."""
    from hydra import compose as hydra_compose

    with config_dir(conf_dir, job_name):
        return hydra_compose(config_name="config", overrides=list(overrides))
