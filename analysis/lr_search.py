"""The lr search of a verdict protocol: per size and arm, final val bpb of the lr stage at every lr of the grid, the
chosen lr (the one the seeds ran at) and whether it sits at an edge of the grid. The lr stage only chooses the lr:
the winner of a search is biased low, so its runs never enter the verdicts (analysis/protocol.py).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.document import fixed, sci
from analysis.engine import Context, section
from analysis.protocol_runs import ProtocolRuns, arm_lr, lr_key
from analysis.verdict import VERDICT_METRIC


def lr_search(p: ProtocolRuns) -> tuple[pd.DataFrame, list]:
    """Per (size, arm): final val bpb of the lr stage at each lr tried, the mean over its seeds as the protocol
    chooses (`verdict.lr.seeds`; NaN: not tried; failed runs in `failed`), the chosen lr (the seeds stage's
    `verdict.lr`; without seeds runs, the lr stage's best), whether it is at an edge of the grid, and where an lr
    searched at another size came from (`verdict.lr_from`). Returns (table, sorted grid of every lr tried)."""
    grid = sorted(set(p.lr["lr_value"].dropna()) | set(p.lr_failed["lr_value"].dropna()))
    rows = []
    for size in p.sizes:
        for arm in p.arms:
            lr_runs = p.lr[(p.lr["verdict.size"] == size) & (p.lr["verdict.arm"] == arm)]
            bad = p.lr_failed[(p.lr_failed["verdict.size"] == size) & (p.lr_failed["verdict.arm"] == arm)]
            seeds = p.seeds[(p.seeds["verdict.size"] == size) & (p.seeds["verdict.arm"] == arm)]
            if not len(lr_runs) and not len(bad) and not len(seeds):
                continue
            tried = sorted(set(lr_runs["lr_value"].dropna()) | set(bad["lr_value"].dropna()))
            by_lr = lr_runs.groupby("lr_value")[VERDICT_METRIC].mean().astype(float)
            n_seeds = int(lr_runs.groupby("lr_value")["seed"].nunique().max()) if len(lr_runs) else 0
            source = seeds["verdict.lr_from"].dropna() if "verdict.lr_from" in seeds else pd.Series(dtype=str)
            lr_from = str(source.iloc[0]) if len(source) and str(source.iloc[0]) != size else ""
            chosen = arm_lr(seeds) if len(seeds) else (float(by_lr.idxmin()) if len(by_lr) else math.nan)
            best = float(by_lr.idxmin()) if len(by_lr) else math.nan
            edge = ""
            if np.isfinite(chosen) and len(tried) > 1:
                edge = "lowest" if chosen == tried[0] else ("highest" if chosen == tried[-1] else "")
            row = {"size": size, "arm": arm, "chosen_lr": chosen, "lr_stage_best": best, "edge": edge,
                   "lr_seeds": n_seeds, "lr_from": lr_from,
                   "tried": ";".join(f"{v:g}" for v in tried),
                   "failed": ";".join(f"{v:g}" for v in sorted(bad["lr_value"].dropna()))}
            for lr in grid:
                row[f"bpb@{lr:g}"] = float(by_lr.get(lr, math.nan))
            rows.append(row)
    return pd.DataFrame(rows), grid


@section("protocol.lr")
def lr_section(ctx: Context) -> list:
    p = ctx.extra
    lrs, grid = lr_search(p)
    ctx.write_csv("lr_search.csv", lrs)
    b: list = [("h2", "lr search")]
    if not len(lrs):
        b.append(("p", "No lr-stage runs."))
        return b
    n = sorted({int(v) for v in lrs["lr_seeds"] if v})
    per = "one seed per lr" if n == [1] else f"mean over {'/'.join(map(str, n))} seeds per lr (the protocol's choice)"
    b.append(("p", f"Final val bpb of the lr stage ({per}) at each lr of the grid; **bold ✓**: the lr "
                   "the seeds ran at (the chosen lr); `failed`: the run did not finish; blank: not tried. An lr "
                   "at an edge of the grid may not be the optimum: it may lie outside the grid."))
    rows, edges = [], []
    for _, r in lrs.iterrows():
        cells = []
        failed = {float(v) for v in str(r["failed"]).split(";") if v}
        for lr in grid:
            v = r[f"bpb@{lr:g}"]
            cell = fixed(v) if np.isfinite(v) else ("failed" if lr_key(lr) in failed else "")
            if np.isfinite(r["chosen_lr"]) and lr_key(lr) == r["chosen_lr"] and cell:
                cell = f"**{cell}** ✓"
            cells.append(cell)
        note = ""
        if r["edge"]:
            note = f"chosen lr is the {r['edge']} tried: the optimum may lie outside the grid"
            edges.append(f"`{r['arm']}` at `{r['size']}`")
        if r["lr_from"]:
            note = f"lr searched at `{r['lr_from']}` (verdict.lr.transfer_from), not here"
        if np.isfinite(r["lr_stage_best"]) and np.isfinite(r["chosen_lr"]) and r["lr_stage_best"] != r["chosen_lr"]:
            note = (note + "; " if note else "") + f"the lr stage's best is {r['lr_stage_best']:g}"
        rows.append([f"`{r['size']}`", f"`{r['arm']}`", *cells, sci(r["chosen_lr"]), note])
    b.append(("table", ["size", "arm", *[f"lr {lr:g}" for lr in grid], "chosen lr", "note"], rows))
    if edges:
        b.append(("p", f"**At an edge of the grid** ({len(edges)} of {len(lrs)}): " + ", ".join(edges) + "."))
    b.append(("p", "Machine-readable: `lr_search.csv`."))
    return b
