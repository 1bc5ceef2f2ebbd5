"""The n-gram floor in MLflow and in the reports.

`python -m sweeps.floor ... log=true` records one MLflow run per (data, tokenizer, val windows) in the experiment
`ngram-floor` (FLOOR_EXPERIMENT) of the same store as the study: tags `floor.*` say what it was fitted and scored on,
metrics `ngram/bpb_order<n>` give its bpb per order. A report finds the floor whose data fingerprint, tokenizer,
block size and val windows equal its runs' (`find_floor`) and shows it beside the arms (`floor_blocks`); when the
best model is not below the trigram floor it says so at the top (`headline`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

FLOOR_EXPERIMENT = "ngram-floor"
FLOOR_METRIC = "ngram/bpb_order{n}"
TRIGRAM = 3
FLOOR_COMMAND = "python -m sweeps.floor experiment=NAME log=true tracking.uri=URI"


@dataclass(frozen=True)
class Floor:
    bpb: dict  # order -> bpb
    run_id: str
    scope: str  # windows | full
    smoothing: str
    data: str  # data.name
    tokenizer: str
    block_size: str
    val_windows: str
    n_train: str
    n_targets: str

    def describe(self) -> str:
        where = (f"the val targets the models are scored on ({self.val_windows} windows of {self.block_size} "
                 "targets, context cut at each window's start)" if self.scope == "windows"
                 else "every val token (context cut at the split's start)")
        return (f"count-based n-gram models with {self.smoothing} smoothing (Chen & Goodman 1998), fitted on the "
                f"train split ({self.n_train} `{self.tokenizer}` tokens of `{self.data}`) and scored on {where}: "
                f"{self.n_targets} targets, in bits per byte as val/bpb")


def floor_tags(meta: dict) -> dict:
    return {f"floor.{k}": str(v) for k, v in meta.items()}


def find_floor(uri: str, data_fingerprint, tokenizer, block_size=None, val_windows=None) -> Floor | None:
    """The newest finished floor run of this data and tokenizer in the store (preferring scope=windows with the same
    block size and val windows); None when the store has none."""
    from mlflow.tracking import MlflowClient

    cl = MlflowClient(tracking_uri=uri)
    exp = cl.get_experiment_by_name(FLOOR_EXPERIMENT)
    if exp is None or data_fingerprint is None:
        return None
    runs = cl.search_runs([exp.experiment_id], f"tags.`floor.data_fingerprint` = '{data_fingerprint}' and "
                                               f"tags.`floor.tokenizer` = '{tokenizer}' and "
                                               "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"])

    def rank(r):
        t = r.data.tags
        same = t.get("floor.scope") == "windows" and t.get("floor.block_size") == str(block_size) and \
            t.get("floor.val_windows") == str(val_windows)
        return 0 if same else (1 if t.get("floor.scope") == "full" else 2)

    if not runs:
        return None
    best = sorted(runs, key=rank)[0]  # stable: newest first within a rank
    t, m = best.data.tags, best.data.metrics
    bpb = {int(k.rsplit("order", 1)[1]): float(v) for k, v in m.items() if k.startswith("ngram/bpb_order")}
    return Floor(dict(sorted(bpb.items())), best.info.run_id, t.get("floor.scope", "?"), t.get("floor.smoothing", "?"),
                 t.get("floor.data", "?"), t.get("floor.tokenizer", "?"), t.get("floor.block_size", "?"),
                 t.get("floor.val_windows", "?"), t.get("floor.n_train", "?"), t.get("floor.n_targets", "?"))


def floor_for_runs(uri: str, runs: pd.DataFrame) -> Floor | None:
    """The floor matching the data of `runs` (one data fingerprint and tokenizer; None when they mix several)."""
    if not len(runs):
        return None
    keys = runs[["data_fingerprint", "tokenizer"]].dropna().drop_duplicates()
    if len(keys) != 1:
        return None
    fp, tok = keys.iloc[0]
    block = _one(runs, "model.block_size")
    windows = _one(runs, "data.val_windows")
    return find_floor(uri, fp, tok, block, windows)


def _one(runs: pd.DataFrame, col: str):
    if col not in runs:
        return None
    vals = runs[col].dropna().unique()
    return (int(vals[0]) if float(vals[0]).is_integer() else vals[0]) if len(vals) == 1 else None


def floor_line(floor: Floor | None) -> list[str]:
    """The floor in one line of a report command's summary (none without a floor)."""
    return [] if floor is None else ["n-gram floor (bpb by order): " + ", ".join(f"{n}: {v:.4f}"
                                                                             for n, v in floor.bpb.items())]


def headline(floor: Floor | None, best_bpb: float, best_label: str) -> list:
    """Report blocks for the top: a bold warning when the best model does not beat the trigram floor."""
    if floor is None or TRIGRAM not in floor.bpb or not np.isfinite(best_bpb):
        return []
    tri = floor.bpb[TRIGRAM]
    if best_bpb >= tri:
        return [("p", f"**The best model does not beat the trigram floor**: {best_label} scores {best_bpb:.4f} "
                      f"bits/byte against {tri:.4f} for a count-based trigram model on the same val targets "
                      f"(+{best_bpb - tri:.4f}). These runs measure how fast an arm picks up local statistics, "
                      "not which architecture is better (see [n-gram floor](#n-gram-floor)).")]
    return [("p", f"The best model ({best_label}, {best_bpb:.4f} bits/byte) is {tri - best_bpb:.4f} bits/byte below "
                  f"the trigram floor ({tri:.4f}; see [n-gram floor](#n-gram-floor)).")]


def floor_blocks(floor: Floor | None, arms: list[tuple[str, float]], command: str) -> list:
    """The n-gram floor section: bpb per order, and each arm's mean val bpb against the best order below it."""
    b: list = [("h2", "n-gram floor")]
    if floor is None:
        b.append(("p", "No n-gram floor is recorded in this store for these runs' data and tokenizer. Compute and "
                       f"record it with `{command}`."))
        return b
    b.append(("p", "A floor every model should beat: " + floor.describe() + f" (MLflow run `{floor.run_id}` in "
                   f"experiment `{FLOOR_EXPERIMENT}`)."))
    b.append(("table", ["order", "val bpb"], [[str(n), f"{v:.4f}"] for n, v in floor.bpb.items()]))
    if arms:
        rows = []
        for label, v in arms:
            below = [str(n) for n, f in floor.bpb.items() if v < f]
            tri = floor.bpb.get(TRIGRAM, math.nan)
            rows.append([label, f"{v:.4f}", "n/a" if not np.isfinite(tri) else f"{v - tri:+.4f}",
                         ", ".join(below) or "none"])
        b.append(("table", ["arm", "mean val bpb", "Δ vs trigram floor", "orders it beats"], rows))
    return b
