"""The lr schedules of the `optim` config group: a multiplier of optim.lr for every optimizer step.

    optim.schedule=cosine  linear warm-up, then a cosine from 1 down to min_lr / lr at max_steps (GPT-2, nanoGPT).
    optim.schedule=wsd     warm-up-stable-decay: linear warm-up, the peak held, then a linear decay to min_lr / lr
                           over the last optim.decay_frac of the steps (Hu et al. 2024, "MiniCPM"; Hagele et al. 2024,
                           "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations", which finds a
                           20% cool-down matches cosine; modded-nanogpt and nanochat decay linearly to ~0).

The warm-up is optim.warmup_steps, or optim.warmup_frac of max_steps when that is set: a fraction keeps the warm-up
the same share of every run of a compute ladder, whose step counts differ by size and arm.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from .errors import ConfigError

SCHEDULES = ("cosine", "wsd")


def warmup_steps(o: Mapping, max_steps: int) -> int:
    """optim.warmup_frac of max_steps (rounded, at least 1 when the fraction is > 0), else optim.warmup_steps."""
    frac = o.get("warmup_frac")
    if frac is None:
        return int(o.get("warmup_steps", 0))
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
        raise ConfigError(f"invalid optim.warmup_frac={frac!r}: a fraction of trainer.max_steps in [0, 1), e.g. 0.02 "
                          f"(or null to use optim.warmup_steps)")
    return max(1, round(frac * max_steps)) if frac > 0 else 0


def schedule_name(o: Mapping) -> str:
    name = o.get("schedule", "cosine")
    if name not in SCHEDULES:
        raise ConfigError(f"invalid optim.schedule={name!r}: choose one of {', '.join(SCHEDULES)}")
    return name


def decay_frac(o: Mapping) -> float:
    frac = o.get("decay_frac", 0.2)
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ConfigError(f"invalid optim.decay_frac={frac!r}: the share of trainer.max_steps the wsd schedule "
                          f"decays over, in (0, 1], e.g. 0.2")
    return float(frac)


def lr_lambda(warmup_steps: int, max_steps: int, lr: float, min_lr: float, schedule: str = "cosine",
              decay_frac: float = 0.2) -> Callable[[int], float]:
    """Multiplier of `lr` at optimizer step `step` (0-based): warm-up to 1 over warmup_steps, then `schedule` down to
    min_lr / lr at max_steps (and held there after)."""
    floor = min_lr / lr if lr > 0 else 0.0
    decay_start = max(warmup_steps, max_steps - round(decay_frac * max_steps))  # wsd: the first decaying step

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if step >= max_steps:
            return floor
        if schedule == "wsd":
            if step < decay_start:
                return 1.0
            progress = (step - decay_start) / max(1, max_steps - decay_start)
            return floor + (1.0 - floor) * (1.0 - progress)
        progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
        return floor + 0.5 * (1.0 - floor) * (1.0 + math.cos(math.pi * progress))

    return f


def build_lr_lambda(o: Mapping, max_steps: int) -> Callable[[int], float]:
    """The schedule that optim config `o` asks for over `max_steps` steps (checked: a bad value is one ConfigError)."""
    lr = float(o["lr"])
    return lr_lambda(warmup_steps(o, max_steps), max_steps, lr, float(o.get("min_lr", 0.0)), schedule_name(o),
                     decay_frac(o))
