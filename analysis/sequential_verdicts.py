"""The verdicts of a protocol that added its seeds sequentially (`verdict.seeds: sequential`, issue 36).

Such a study stopped giving an arm seeds once the group-sequential rule (analysis/sequential.py) decided its
comparison, so the error guarantee belongs to that rule: the fixed rule (Welch / TOST, Holm within the family) on
the seeds each arm got is no valid test, as the stopping rule chose those seeds. Here the report recomputes the
rule's own verdict from the store, by replaying the looks as the protocol ran them (sweeps/verdict.py,
`sequential_seeds`):

- sizes in the report's order (smallest budget first), and at each size the looks of the recorded design
  (`verdict.sequential.*`); the seeds of a size in the order the seeds stage adds them: 0, 1, 2, ... skipping the
  lr stage's seeds (`ProtocolSpec.seed_list`), the look at n seeds using the first n;
- at each look the baseline and every open comparison's arm contribute their first n seeds (a failed run counts
  as a seed without a value, as the protocol's `_wait_for_look` does), then `analysis.sequential.decided_at` (the
  function the protocol itself asks) says which comparisons of the size are decided; those get no more seeds;
- after the last size, each declared family is decided once more on everything the replay used
  (`decide_study`): the verdict, the look whose data crossed a boundary, and that boundary (the design's nominal
  level at alpha / r, and the t quantile it is at that look's Welch degrees of freedom).

Where the store and the rule disagree (an arm with more seeds than its stopping look, or fewer than a look the rule
needed, a baseline with more or fewer than its largest open comparison), the rule's verdict is still the one on
the seeds it would have used, and `mismatch_line` says so in one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.store import AnalysisError
from analysis.verdict import BETTER, INCONCLUSIVE, VERDICT_METRIC, WORSE, equivalent_label
from modules.errors import ConfigError
from analysis import sequential as q

if TYPE_CHECKING:
    from analysis.protocol_runs import ProtocolRuns

KEYS = ("first", "batch", "cap", "spending", "alpha")
COLUMNS = ["rule", "fixed_verdict", "stop_look", "stop_seeds", "at_cap", "crossed", "crossed_look", "crossed_p",
           "boundary_p", "boundary_t", "boundary_df", "boundary_share", "store_note"]


def recorded_design(seeds: pd.DataFrame) -> q.Design | None:
    """The design the seeds-stage runs recorded (verdict.sequential.*); None for a fixed seed count.
    AnalysisError when the runs recorded several designs or one the rule cannot run."""
    cols = [f"verdict.sequential.{k}" for k in KEYS]
    if not all(c in seeds for c in cols) or seeds[cols].dropna().empty:
        return None
    got = {k: sorted(set(seeds[c].dropna().astype(str))) for k, c in zip(KEYS, cols)}
    several = [f"{k}: {', '.join(v)}" for k, v in got.items() if len(v) != 1]
    if several:
        raise AnalysisError("the seeds-stage runs recorded different sequential designs (" + "; ".join(several)
                            + "): one protocol runs one design; report its runs of one design with filter=")
    raw = {k: v[0] for k, v in got.items()}
    try:
        return q.design_from({**{k: int(raw[k]) for k in ("first", "batch", "cap")}, "spending": raw["spending"],
                              "alpha": float(raw["alpha"])}, "the runs' verdict.sequential")
    except (ValueError, ConfigError) as e:
        raise AnalysisError(f"the runs recorded a sequential design the rule cannot replay: {e}") from None


def seed_order(p: ProtocolRuns, cap: int) -> list[int]:
    """The seeds stage's seeds in the order it adds them: 0, 1, 2, ... skipping the lr stage's seeds (the lr runs
    in the store name them), the first `cap`."""
    lr_seeds = pd.concat([p.lr["seed"], p.lr_failed["seed"]]) if len(p.lr_failed) else p.lr["seed"]
    skip = {int(s) for s in pd.to_numeric(lr_seeds, errors="coerce").dropna()}
    return [s for s in range(cap + len(skip)) if s not in skip][:cap]


def store_values(p: ProtocolRuns) -> dict[tuple[str, str, int], float]:
    """(arm, size, seed) -> final val bpb of the seeds stage; NaN for a seed whose runs all FAILED or were KILLED
    (the protocol counted such a seed as run, without a value)."""
    runs = p.runset.runs
    ended = runs[(runs["verdict.protocol"] == p.name) & (runs["verdict.stage"] == "seeds")
                 & runs["status"].isin(["FAILED", "KILLED"]) & runs["seed"].notna()]
    values = {(str(r["verdict.arm"]), str(r["verdict.size"]), int(r["seed"])): math.nan for _, r in ended.iterrows()}
    for _, r in p.seeds.iterrows():  # a finished run wins over a failed attempt
        values[(str(r["verdict.arm"]), str(r["verdict.size"]), int(r["seed"]))] = float(r[VERDICT_METRIC])
    return values


@dataclass
class Replay:
    stop: dict = field(default_factory=dict)      # (size, arm) -> the look (0-based) the rule stopped it at
    open_: dict = field(default_factory=dict)     # (size, arm) -> never decided: the last look its seeds reached
    baseline: dict = field(default_factory=dict)  # size -> the last look the baseline ran at
    used: dict = field(default_factory=dict)      # the values the rule used: (arm, size, seed) -> val bpb


def replay(values, families: dict, sizes: list, baseline: str, orders: dict, design: q.Design,
           margin: float) -> Replay:
    """The protocol's seeds stage on the store's values, look by look (module docstring). families: (size, arm)
    -> the declared family's name, for every comparison of the protocol (with seeds or not: the rule counts it)."""
    members = family_members(families)
    looks, out = design.looks(), Replay()

    def reached(arm, size, k):  # the store has every seed look k needs, of the arm and the baseline
        return all((a, size, s) in values for a in (arm, baseline) for s in orders[size][:looks[k]])

    for size in sizes:
        mine = {tuple(members[families[(size, a)]]) for (s, a) in families if s == size}
        open_ = [a for (s, a) in families if s == size and any(k[:2] == (a, size) for k in values)]
        for k, n in enumerate(looks):
            if not open_:
                break
            for arm in [baseline, *open_]:
                out.used.update({(arm, size, s): values[(arm, size, s)] for s in orders[size][:n]
                                 if (arm, size, s) in values})
            out.baseline[size] = k
            closed = q.decided_at(out.used, mine, size, baseline, orders, design, margin)
            out.stop.update({(size, a): k for a in open_ if a in closed})
            open_ = [a for a in open_ if a not in closed]
        for a in open_:
            out.open_[(size, a)] = max((k for k in range(len(looks)) if reached(a, size, k)), default=-1)
    return out


def family_members(families: dict) -> dict:
    """family name -> its comparisons [(arm, size), ...], as analysis.sequential takes them."""
    members: dict = {}
    for (size, arm), name in families.items():
        members.setdefault(name, []).append((arm, size))
    return members


def outcomes(rep: Replay, families: dict, baseline: str, orders: dict, design: q.Design, margin: float) -> dict:
    """(size, arm) -> the rule's columns (COLUMNS but rule, fixed_verdict, store_note): every declared family
    decided on the values the replay used."""
    from scipy import stats

    looks, out = design.looks(), {}
    for fam in family_members(families).values():
        d, (delta, p_diff, p_equiv, df) = q.decide_study(rep.used, fam, baseline, orders, design, margin)
        two, one = q.level_table(design, len(fam))
        code = q.verdict_codes(d, np.nan_to_num(delta))[0]
        for j, (arm, size) in enumerate(fam):
            stop = rep.stop.get((size, arm), rep.open_.get((size, arm)))
            if stop is None:
                continue  # no seeds at this size
            row = {"stop_look": stop + 1, "stop_seeds": looks[stop] if stop >= 0 else 0,
                   "at_cap": (size, arm) not in rep.stop and stop == len(looks) - 1,
                   "verdict": [equivalent_label(margin), BETTER, WORSE, INCONCLUSIVE][code[j]],
                   "crossed": "", "crossed_look": math.nan, "crossed_p": math.nan, "boundary_p": math.nan,
                   "boundary_t": math.nan, "boundary_df": math.nan, "boundary_share": math.nan}
            if d.reject_equiv[0, j]:  # the verdict is equivalence whenever E was rejected
                k, r = int(d.equiv_look[0, j]), int(d.equiv_row[0, j])
                row |= {"crossed": "equivalence", "crossed_p": p_equiv[0, j, k], "boundary_p": one[r, k],
                        "boundary_t": float(stats.t.isf(one[r, k], df[0, j, k]))}
            elif d.reject_diff[0, j]:
                k, r = int(d.diff_look[0, j]), int(d.diff_row[0, j])
                row |= {"crossed": "difference", "crossed_p": p_diff[0, j, k], "boundary_p": two[r, k],
                        "boundary_t": float(stats.t.isf(two[r, k] / 2, df[0, j, k]))}
            if row["crossed"]:
                row |= {"crossed_look": k + 1, "boundary_df": df[0, j, k], "boundary_share": r}
            out[(size, arm)] = row
    return out


def store_notes(rep: Replay, values, baseline: str, orders: dict, design: q.Design) -> dict:
    """(size, arm) -> where the store disagrees with the rule, in words ("" where it agrees); the baseline's under
    (size, baseline)."""
    looks, notes = design.looks(), {}

    def seeds(arm, size):
        return sorted(s for (a, at, s) in values if (a, at) == (arm, size))

    def compare(arm, size, k, what):
        need, have = orders[size][:looks[k]], seeds(arm, size)
        missing, extra = sorted(set(need) - set(have)), sorted(set(have) - set(need))
        parts = [f"{len(have)} seed(s) in the store, {what} look {k + 1} ({looks[k]} seeds)"]
        if missing:
            parts.append(f"seed(s) {', '.join(map(str, missing))} missing")
        if extra:
            parts.append(f"seed(s) {', '.join(map(str, extra))} beyond it, not used")
        return ": ".join([parts[0], "; ".join(parts[1:])]) if missing or extra else ""

    for (size, arm), k in rep.stop.items():
        notes[(size, arm)] = compare(arm, size, k, "the rule stopped it at")
    for size, arm in rep.open_:  # never decided: the rule needed every seed to the cap
        notes[(size, arm)] = compare(arm, size, len(looks) - 1, "open to the cap, the rule needed")
    for size, k in rep.baseline.items():
        notes[(size, baseline)] = compare(baseline, size, k, "the largest open comparison reached")
    return notes


def apply(p: ProtocolRuns, table: pd.DataFrame, margin: float, families: dict, design: q.Design) -> pd.DataFrame:
    """The verdict table with the sequential rule's verdict in `verdict` (the fixed rule's kept, descriptive, in
    `fixed_verdict`) and the rule's columns (COLUMNS)."""
    orders = {size: seed_order(p, design.cap) for size in p.sizes}
    values = store_values(p)
    rep = replay(values, families, p.sizes, p.baseline, orders, design, margin)
    rule = outcomes(rep, families, p.baseline, orders, design, margin)
    notes = store_notes(rep, values, p.baseline, orders, design)
    table = table.copy()
    table["rule"] = "sequential"
    table["fixed_verdict"] = table["verdict"]
    for c in COLUMNS[2:]:
        table[c] = "" if c in ("crossed", "store_note") else math.nan
    table["at_cap"] = False
    for i, r in table.iterrows():
        key = (r["size"], r["arm"])
        if r["verdict"] != "baseline" and key in rule:
            for c, v in rule[key].items():
                table.at[i, c] = v
        table.at[i, "store_note"] = notes.get(key, "")
    table["fixed_verdict"] = table["fixed_verdict"].where(table["verdict"] != "baseline", "")
    return table


# ---------------------------------------------------------------------------------------------------- the report
def decided_sequentially(table: pd.DataFrame) -> bool:
    return "rule" in table and bool((table["rule"] == "sequential").any())


METHOD = ("Final val bpb (bits/byte, lower is better), mean ± std over the seeds each arm got (ddof=1). **Verdict**: "
          "the sequential rule's (analysis/sequential.py), recomputed here from the store by replaying its looks as "
          "the protocol ran them (analysis/sequential_verdicts.py): at each look every open comparison's arm and the "
          "baseline use their first n seeds (0, 1, 2, ... skipping the lr seeds), Welch's test and TOST are read "
          "against the design's boundary at that look (the alpha-spending level, as a t quantile at the look's "
          "degrees of freedom) at α / r, r the comparisons of the declared family still holding a hypothesis, and a "
          "decided comparison stops. *better* / *worse*: the difference crossed its boundary; *equivalent within "
          "±m*: TOST crossed; *inconclusive*: neither by the cap (or by the last look the store has seeds for). "
          "**stopped at**: the look it stopped at and its seeds; **boundary crossed**: the test, its look, its p "
          "and the nominal level it crossed (the t boundary, its df, and α / r). The Δ, its Welch CI and the p "
          "columns are the fixed rule's on every seed each arm got (the baseline's too): **descriptive, not the "
          "test**, since a stopping rule chose those seeds. lr: the arm's best lr (the seeds ran at it). params: "
          "whether the arm's parameter count differs from the baseline's.")


def rule_paragraph(design_text: str) -> str:
    """The paragraph saying which rule decided the verdicts."""
    return (design_text + ". Each comparison stopped getting seeds once the sequential rule decided it "
            "(analysis/sequential.py), so the verdicts below are that rule's, replayed from the store: its family-wise "
            "error bound is the design's. The fixed rule's p-values beside them are descriptive only (on seeds a "
            "stopping rule chose, a fixed-n test has no error guarantee).")


def mismatch_line(table: pd.DataFrame) -> str:
    """One line naming every comparison (and baseline) whose seeds in the store differ from the rule's; "" if none."""
    bad = [f"`{r['arm']}` at `{r['size']}`: {r['store_note']}" for _, r in table.iterrows() if r["store_note"]]
    if not bad:
        return ""
    return ("**The store and the rule disagree** (the verdicts use the seeds the rule would have used): "
            + "; ".join(bad) + ".")


def stop_text(r) -> str:
    if not np.isfinite(r["stop_look"]):
        return ""
    if r["stop_look"] == 0:
        return "no look: the store lacks the first look's seeds"
    where = f"look {int(r['stop_look'])} ({int(r['stop_seeds'])} seeds)"
    if r["crossed"]:
        return where
    return f"cap, {where}" if r["at_cap"] else f"open at {where}: the store has no more seeds"


def boundary_text(r) -> str:
    if not r["crossed"]:
        return "none crossed"
    test = "Welch" if r["crossed"] == "difference" else "TOST"
    t = f"|t| ≥ {r['boundary_t']:.2f}" if r["crossed"] == "difference" else f"both t beyond ±{r['boundary_t']:.2f}"
    share = "α" if r["boundary_share"] == 1 else f"α/{int(r['boundary_share'])}"
    return (f"{r['crossed']}, look {int(r['crossed_look'])}: {test} p {r['crossed_p']:.2g} ≤ {r['boundary_p']:.3g} "
            f"({t} at {r['boundary_df']:.1f} df; {share})")


def table_columns(headers: list, rows: list, table: pd.DataFrame) -> tuple[list, list]:
    """The fixed rule's verdict table turned into the sequential one: its p columns labelled descriptive, the
    verdict the rule's, with the look it stopped at and the boundary it crossed after it."""
    relabel = {h: f"{h}, descriptive" for h in ("p (Welch)", "p (Holm)", "p (TOST, Holm)")}
    relabel["Δ vs baseline [95% Welch CI]"] = "Δ vs baseline [95% Welch CI], descriptive"
    at = headers.index("verdict")
    out_headers = [relabel.get(h, h) for h in headers]
    out_headers[at + 1:at + 1] = ["stopped at", "boundary crossed"]
    out_rows = []
    for row, (_, r) in zip(rows, table.iterrows()):
        extra = ["", ""] if r["verdict"] == "baseline" else [stop_text(r), boundary_text(r)]
        out_rows.append([*row[:at + 1], *extra, *row[at + 1:]])
    return out_headers, out_rows
