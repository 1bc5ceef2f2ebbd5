"""The one table of a report's runs: its results, one row per run, with the columns every fact reads named the same
in every kind, whatever tags the kind's runs carry.

    arm, size, stage   the comparison a run belongs to (a verdict protocol: its verdict.* tags; an ablation: its
                       variant without its ladder overrides, those overrides, and the seeds stage: an ablation has
                       no lr stage, every result is one seed of its variant)
    is_baseline        whether the run is one of the baseline's
    seed, lr           its seed and learning rate (NaN when not recorded)
    compute            the training FLOPs it spent (analysis.scaling.run_compute)
    commit, machine    the git commit (" (dirty)" with uncommitted changes) and device_name it ran at
and the MLflow columns it came with (final metrics, params, ...). A kind's load builds it with `run_table` and puts
it in `ctx.runs`; scaling, provenance and the floor read these names only.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.scaling import run_compute

COLUMNS = ("arm", "size", "stage", "is_baseline", "seed", "lr", "compute", "commit", "machine")


def commits(frame: pd.DataFrame) -> pd.Series:
    """Each run's git commit, " (dirty)" when it ran with uncommitted changes."""
    dirty = frame["git_dirty"].astype(str).str.lower() == "true"
    return frame["git_commit"].fillna("(not recorded)").astype(str) + np.where(dirty, " (dirty)", "")


def run_table(frame: pd.DataFrame, arm, size, stage, is_baseline) -> pd.DataFrame:
    """`frame` (runs from analysis.store) with the table's columns set: arm, size, stage and is_baseline as the kind
    reads them (a Series over the frame's index, or one value), the rest the same rule for every kind."""
    return frame.assign(arm=arm, size=size, stage=stage, is_baseline=is_baseline,
                        lr=frame["optim.lr"].astype(float), compute=run_compute(frame), commit=commits(frame),
                        machine=frame["device_name"].fillna("(not recorded)").astype(str))
