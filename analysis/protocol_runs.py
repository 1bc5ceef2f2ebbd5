"""A verdict protocol's runs (`python -m sweeps.verdict`: tagged `verdict.*`) and their verdict table.

`select` splits the runs by stage, with the design they recorded before they ran: sizes (smallest budget first), arms
and families, the baseline arm, the declared Holm family and primary comparisons, whether a paired test was declared
(`ProtocolRuns`, the protocol kinds' extra in analysis/engine.py). `verdicts` compares every arm with the baseline at
each size from the seeds stage only; a report reads it once, through analysis.protocol.verdict_table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis import sequential_verdicts as sv
from analysis.stats import paired_t
from analysis.store import AnalysisError, RunSet
from analysis.verdict import VERDICT_METRIC, Margin, compare_pairs

STAGE_LR, STAGE_SEEDS = "lr", "seeds"


def is_protocol(runset: RunSet) -> bool:
    """Whether the matched runs come from the verdict protocol (any run tagged `verdict.protocol`)."""
    runs = runset.runs
    return "verdict.protocol" in runs and bool(runs["verdict.protocol"].notna().any())


def lr_key(v) -> float:
    """lrs compare by value, not by spelling ('0.006' param, '6e-03' tag): 6 significant digits."""
    v = float(v)
    return float(f"{v:.6g}") if math.isfinite(v) else math.nan


@dataclass
class ProtocolRuns:
    """The runs of one protocol, split by stage, with its sizes (smallest budget first), arms and families."""

    name: str
    runset: RunSet
    seeds: pd.DataFrame  # FINISHED seeds-stage runs with the required metrics: the statistics use only these
    lr: pd.DataFrame  # FINISHED lr-stage runs with the required metrics
    lr_failed: pd.DataFrame  # lr-stage runs that are not results (FAILED, KILLED, ...)
    sizes: list
    baseline: str
    arms: list  # baseline first, then by (family, name)
    family: dict  # arm -> family
    left_out: pd.DataFrame
    holm: str = "study"  # the declared Holm family (verdict.holm): study | size | arm-family
    holm_source: str = ""  # how it is known, in words
    primary_arms: tuple = ()  # () = every non-baseline arm
    primary_sizes: tuple = ()  # () = every size
    paired: bool = False  # a paired test declared before the runs (verdict.paired): arms share each seed's data

    def results(self) -> pd.DataFrame:
        """Every run that is a result, both stages (seeds first)."""
        return pd.concat([self.seeds, self.lr], ignore_index=True)


def declared(inc: pd.DataFrame) -> dict:
    """The Holm family and primary comparisons the runs recorded (verdict.holm, verdict.primary); the default when
    they recorded none (runs from before the tags): one family of every comparison. AnalysisError if they differ.
    `paired`: whether they recorded a paired test declared before the runs (verdict.paired = true)."""
    holm = sorted(set(inc.get("verdict.holm", pd.Series(dtype=object)).dropna().astype(str)))
    prim = sorted(set(inc.get("verdict.primary", pd.Series(dtype=object)).dropna().astype(str)))
    if len(holm) > 1 or len(prim) > 1:
        raise AnalysisError(f"the runs recorded different Holm families ({', '.join(holm + prim)}): one protocol "
                            "declares one family; report its runs of one declaration with filter=")
    paired = {"paired": "true" in set(inc.get("verdict.paired", pd.Series(dtype=object)).dropna().astype(str))}
    if not holm:
        return {"holm": "study", "holm_source": "not declared before the runs (no verdict.holm tag): the default, "
                                                "every comparison of the study in one family"} | paired
    parts = dict(kv.split("=", 1) for kv in (prim[0].split(";") if prim else []) if "=" in kv)

    def names(key):
        v = parts.get(key, "*")
        return () if v in ("*", "") else tuple(v.split(","))

    return {"holm": holm[0], "holm_source": "declared before the runs (verdict.holm, verdict.primary)",
            "primary_arms": names("arms"), "primary_sizes": names("sizes")} | paired


def select(runset: RunSet, baseline: str | None = None) -> ProtocolRuns:
    """The protocol's runs from a RunSet (AnalysisError when several protocols match or the baseline is unknown).
    Runs without protocol tags are left out, with the reason."""
    runs, inc = runset.runs, runset.included
    names = sorted(runs["verdict.protocol"].dropna().astype(str).unique())
    if len(names) > 1:
        raise AnalysisError(f"runs of {len(names)} verdict protocols match ({', '.join(names)}); report one with "
                            f"filter=\"tags.`verdict.protocol` = '{names[0]}'\"")
    name = names[0]
    lo = runset.left_out.copy()
    foreign = inc[inc["verdict.protocol"] != name]
    if len(foreign):
        extra = pd.DataFrame({"run_id": foreign["run_id"], "run_name": foreign["run_name"],
                              "variant": foreign["variant"], "seed": foreign["seed"], "status": foreign["status"],
                              "scope": "report", "reason": f"not a run of the verdict protocol `{name}`"})
        lo = pd.concat([lo, extra], ignore_index=True)
    inc = inc[inc["verdict.protocol"] == name].copy()
    missing = inc[inc["verdict.arm"].isna() | inc["verdict.size"].isna() | ~inc["verdict.stage"].isin(
        [STAGE_LR, STAGE_SEEDS])]
    if len(missing):
        extra = pd.DataFrame({"run_id": missing["run_id"], "run_name": missing["run_name"],
                              "variant": missing["variant"], "seed": missing["seed"], "status": missing["status"],
                              "scope": "report", "reason": "verdict.arm, verdict.size or verdict.stage tag missing"})
        lo = pd.concat([lo, extra], ignore_index=True)
        inc = inc.drop(missing.index)
    if len(lo):
        lo["seed"] = lo["seed"].astype("Int64")
        lo = lo.sort_values(["variant", "seed", "run_id"], na_position="last").reset_index(drop=True)
    inc["lr_value"] = inc["optim.lr"].map(lr_key)
    seeds = inc[inc["verdict.stage"] == STAGE_SEEDS].reset_index(drop=True)
    lr = inc[inc["verdict.stage"] == STAGE_LR].reset_index(drop=True)
    mine = runs[(runs["verdict.protocol"] == name) & (runs["verdict.stage"] == STAGE_LR)]
    lr_failed = mine[~mine["run_id"].isin(inc["run_id"])].assign(lr_value=lambda f: f["optim.lr"].map(lr_key))
    budgets = inc.groupby("verdict.size")["verdict.budget_flops"].first().map(
        lambda b: float(b) if b is not None else math.inf)
    sizes = sorted(budgets.index, key=lambda s: (budgets[s], s))
    family = {a: str(f) for a, f in inc.groupby("verdict.arm")["verdict.family"].first().items()}
    tagged = sorted(inc["verdict.baseline"].dropna().astype(str).unique())
    if baseline is None:
        if len(tagged) != 1:
            raise AnalysisError(f"the runs name {len(tagged)} baseline arms ({', '.join(tagged) or 'none'}); "
                                "choose one with baseline=ARM")
        baseline = tagged[0]
    if baseline not in family:
        raise AnalysisError(f"baseline arm {baseline!r} has no usable runs; arms: {', '.join(sorted(family))}")
    arms = [baseline] + sorted((a for a in family if a != baseline), key=lambda a: (family[a], a))
    return ProtocolRuns(name, runset, seeds, lr, lr_failed, sizes, baseline, arms, family, lo, **declared(inc))


def arm_lr(runs: pd.DataFrame) -> float:
    """The lr an arm's runs ran at (their `verdict.lr` tag, else the lr param); NaN when they differ."""
    tags = runs["verdict.lr"].dropna()
    vals = sorted({lr_key(v) for v in tags} or set(runs["lr_value"].dropna()))
    return vals[0] if len(vals) == 1 else math.nan


# ---------------------------------------------------------------------------------------------------- statistics
def _params(runs: pd.DataFrame) -> float:
    v = runs["params"].astype(float)
    v = v[np.isfinite(v)]
    return float(v.iloc[0]) if len(v) else math.nan


def family_of(p: ProtocolRuns, size: str, arm: str) -> str:
    """The Holm family a comparison belongs to, as the protocol declared it (`verdict.holm`, `verdict.primary`):
    `study` (every primary comparison), `size <s>`, `<family> at <s>`; the non-primary ones form `secondary`."""
    if (p.primary_arms and arm not in p.primary_arms) or (p.primary_sizes and size not in p.primary_sizes):
        return "secondary"
    if p.holm == "size":
        return f"size {size}"
    if p.holm == "arm-family":
        return f"{p.family[arm]} at {size}"
    return "study"


def verdicts(p: ProtocolRuns, margin: Margin) -> pd.DataFrame:
    """One row per (size, arm) of the seeds stage; every non-baseline arm against the baseline at that size, its
    p-values Holm-adjusted within its declared family (`family_of`), its Δ with a 95% Welch CI."""
    m = VERDICT_METRIC
    groups: dict = {}
    for size in p.sizes:
        at = p.seeds[p.seeds["verdict.size"] == size]
        base = at.loc[at["verdict.arm"] == p.baseline, m].astype(float)
        for a in p.arms:
            if a != p.baseline and (at["verdict.arm"] == a).any():
                vals = at.loc[at["verdict.arm"] == a, m].astype(float)
                groups.setdefault(family_of(p, size, a), {})[(size, a)] = (vals, base)
    results = {}
    for name, pairs in groups.items():
        res = compare_pairs(pairs, margin.value)
        for key, r in zip(pairs, res.itertuples()):
            results[key] = r._asdict() | {"holm_family": name, "holm_family_size": len(pairs)}
    rows = []
    for size in p.sizes:
        at = p.seeds[p.seeds["verdict.size"] == size]
        base = at[at["verdict.arm"] == p.baseline]
        base_params = _params(base)
        for a in p.arms:
            arm_runs = at[at["verdict.arm"] == a]
            if a == p.baseline and len(base):
                rows.append(_row(size, a, p.family[a], base, base_params, m) | {"margin": margin.value,
                                                                               "verdict": "baseline"})
            elif (size, a) in results:
                r = results[(size, a)]
                rows.append(_row(size, a, p.family[a], arm_runs, base_params, m) | {
                    k: r[k] for k in ("delta", "ci_low", "ci_high", "p_welch", "p_holm", "p_tost", "p_tost_holm",
                                      "tost_ci_low", "tost_ci_high", "holm_family", "holm_family_size", "margin",
                                      "verdict")})
    table = pd.DataFrame(rows, columns=VERDICT_COLUMNS)
    table = with_paired(p, table) if p.paired else table
    design = sv.recorded_design(p.seeds)
    if design is None:
        return table
    # seeds added sequentially: the verdict is the stopping rule's, replayed (analysis/sequential_verdicts.py)
    families = {(s, a): family_of(p, s, a) for s in p.sizes for a in p.arms if a != p.baseline}
    return sv.apply(p, table, margin.value, families, design)


PAIRED_COLUMNS = ["paired_n", "paired_delta", "paired_ci_low", "paired_ci_high", "correlation"]


def with_paired(p: ProtocolRuns, table: pd.DataFrame) -> pd.DataFrame:
    """The verdict table with the paired difference of each comparison (stats.paired_t over the seeds the arm and
    the baseline share at that size: same seed, same data order) and the correlation the pairing exploits."""
    rows = []
    for _, r in table.iterrows():
        at = p.seeds[p.seeds["verdict.size"] == r["size"]]

        def by_seed(arm):
            runs = at[at["verdict.arm"] == arm]
            return pd.Series(runs[VERDICT_METRIC].astype(float).to_numpy(), index=runs["seed"].astype(int))

        res = paired_t(by_seed(r["arm"]), by_seed(p.baseline)) if r["verdict"] != "baseline" else {}
        rows.append([res.get("n", 0), res.get("delta", math.nan), res.get("ci_low", math.nan),
                     res.get("ci_high", math.nan), res.get("correlation", math.nan)])
    return pd.concat([table, pd.DataFrame(rows, columns=PAIRED_COLUMNS, index=table.index)], axis=1)


VERDICT_COLUMNS = ["size", "arm", "family", "n_seeds", "seeds", "lr", "mean", "std", "params", "params_baseline",
                   "params_differ", "tokens", "delta", "ci_low", "ci_high", "p_welch", "p_holm", "p_tost", "p_tost_holm",
                   "tost_ci_low", "tost_ci_high", "holm_family", "holm_family_size", "margin", "verdict"]


def _row(size, arm, fam, runs: pd.DataFrame, base_params: float, m: str) -> dict:
    vals = runs[m].astype(float)
    params = _params(runs)
    return {"size": size, "arm": arm, "family": fam, "n_seeds": len(runs),
            "seeds": ";".join(str(int(s)) for s in sorted(runs["seed"].dropna())), "lr": arm_lr(runs),
            "mean": float(vals.mean()), "std": float(vals.std(ddof=1)) if len(vals) > 1 else math.nan,
            "params": params, "params_baseline": base_params,
            "tokens": float(runs["tokens_seen"].astype(float).median()) if len(runs) else math.nan,
            "params_differ": bool(np.isfinite(params) and np.isfinite(base_params) and params != base_params),
            "delta": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p_welch": math.nan,
            "p_holm": math.nan, "p_tost": math.nan, "p_tost_holm": math.nan, "tost_ci_low": math.nan,
            "tost_ci_high": math.nan, "holm_family": "", "holm_family_size": 0}
