"""``python -m sweeps.plan verdict=NAME --simulate [studies=10000] [sim_seed=0] [...the planner's keys]``

The error rates and cost of a protocol's group-sequential design (verdict.sequential; analysis/sequential.py), shown
before any run: `studies` simulated studies of the declared family (its largest Holm family of primary comparisons),
each arm's seeds normal at the planner's spread (plan.sd_at: the estimate or its 80% upper bound) around a true
difference Δ, the baseline's at its own, under

  * the global null (every Δ = 0): the family-wise error, the difference tests' kind;
  * the equivalence null (every |Δ| = margin, signs alternating): the equivalence tests' kind;
  * the mixed partial null (alternate arms at Δ = 0 and at the margin's edge): both kinds at once, where today's
    fixed rule (two Holm families at the cap) errs most;
  * the planned Δ (every Δ = -margin): the power to detect, and (global null) to show equivalence at Δ = 0;
  * the pilot's own Δ per arm, when the pilot has the protocol's arms (a study re-planned from its own runs).

Each prints the family-wise error (some true hypothesis rejected) with its 95% Wilson interval, the wrong verdicts,
the fixed rule's two, the verdicts decided, the expected and 95th-percentile seeds per arm and of the baseline, and
the seeds stage's expected and 95th-percentile core-minutes (from the pilot's measured run time) and core-minutes
per decided row, with the lr stage's estimate added.
"""
from __future__ import annotations

import math

import numpy as np

from analysis import sequential as q

STUDIES = 10_000


def family_rows(p, rows: list[dict]) -> list[dict]:
    """The plan rows of the declared family the simulation draws: the largest Holm family of primary comparisons."""
    groups: dict = {}
    for r in rows:
        if not p.is_primary(r["arm"], r["size"]):
            continue
        fam = next(a.family for a in p.arms if a.name == r["arm"])
        key = {"study": (), "size": (r["size"],), "arm-family": (fam, r["size"])}[p.holm]
        groups.setdefault(key, []).append(r)
    return max(groups.values(), key=len)


def scenarios(p, fam: list[dict], observed: dict[str, float] | None) -> list[tuple[str, np.ndarray]]:
    m, M = len(fam), p.margin
    out = [("global null (every Δ 0)", np.zeros(m)),
           (f"equivalence null (|Δ| {M:g})", M * np.where(np.arange(m) % 2, -1.0, 1.0)),
           (f"mixed partial null (Δ 0 / ±{M:g})", q.mixed_null(m, M)),
           (f"planned Δ (every Δ -{M:g})", np.full(m, -M))]
    if observed and all(r["arm"] in observed for r in fam):
        out.append(("the pilot's Δ per arm", np.array([observed[r["arm"]] for r in fam])))
    return out


def observed_deltas(runs, p) -> dict[str, float]:
    """arm -> mean val bpb minus the baseline's, pooled over sizes, from the pilot's runs (empty without them)."""
    if runs is None or p.baseline not in set(runs["arm"]):
        return {}
    means = runs.groupby("arm")["final_val_bpb"].mean()
    return {a: float(means[a] - means[p.baseline]) for a in means.index if a != p.baseline}


def render(p, s: dict, rows: list[dict], runs, lr_core_s: float, studies: int = STUDIES, seed: int = 0) -> list[str]:
    """The simulation's lines (the module docstring)."""
    design = p.sequential
    fam = family_rows(p, rows)
    tag = "_upper" if s["sd_at"] == "upper" else ""
    sd = np.array([_sd(r, "sd_arm", "df_arm", tag) for r in fam])
    sd_base = _sd(fam[0], "sd_baseline", "df_baseline", tag)
    run_s = np.array([r["run_s"] for r in fam])
    base_s = fam[0]["baseline_run_s"]
    lines = [f"simulated: {design.text()}",
             f"{studies:,} studies of the family of {len(fam)} comparisons ({', '.join(r['arm'] for r in fam)}; Holm "
             f"scope {p.holm}), each arm's seeds ~ N(Δ, sd) with sd at its {'80% upper bound' if tag else 'estimate'} "
             f"({', '.join(f'{x:.4f}' for x in sd)}; baseline {sd_base:.4f}); margin ±{p.margin:g}; lr stage "
             f"{lr_core_s / 60:.1f} core-min (the plan's estimate) in the per-row cost",
             f"{'scenario':34} {'FWER [95% CI]':>23} {'wrong':>6} {'fixed':>6} {'fixedW':>6} {'decided':>7} "
             f"{'seeds':>5} {'p95':>3} {'base':>5} {'core-min':>8} {'p95':>6} {'per row':>7}"]
    power = {}
    for name, deltas in scenarios(p, fam, observed_deltas(runs, p)):
        r = q.simulate(design, deltas, sd, p.margin, sd_base=sd_base, studies=studies, seed=seed)
        fwer, lo, hi = q.rate(r["false"])
        decided = (r["codes"] != q.INCONCLUSIVE).sum(1)  # (S,)
        core = (r["seeds"] * run_s).sum(1) + r["baseline_seeds"] * base_s  # (S,) seconds
        per_row = (core.mean() + lr_core_s) / decided.mean() / 60 if decided.mean() > 0 else math.inf
        lines.append(f"{name:34} {fwer:7.4f} [{lo:.4f}, {hi:.4f}] {r['wrong'].mean():6.4f} "
                     f"{r['fixed_false'].mean():6.4f} {r['fixed_wrong'].mean():6.4f} {decided.mean():7.2f} "
                     f"{r['seeds'].mean():5.2f} {np.percentile(r['seeds'], 95):3.0f} {r['baseline_seeds'].mean():5.2f} "
                     f"{core.mean() / 60:8.1f} {np.percentile(core, 95) / 60:6.1f} {per_row:7.1f}")
        if name.startswith("planned"):
            power["detect"] = float((r["codes"] == q.BETTER).mean())
        if name.startswith("global"):
            power["equivalence"] = float((r["codes"] == q.EQUIVALENT).mean())
    lines.append(f"power: better at Δ = -{p.margin:g} {power['detect']:.3f}; equivalent at Δ = 0 "
                 f"{power['equivalence']:.3f} (per comparison)")
    lines.append("(FWER: some true hypothesis rejected (Δ = 0 called different, |Δ| >= margin called equivalent); wrong: "
                 "some verdict the truth contradicts; fixed / fixedW: the same for today's fixed rule at the cap, two "
                 "Holm families; decided: verdicts per study that are not inconclusive; seeds, p95: per arm; base: the "
                 "baseline's; core-min: the seeds stage; per row: (seeds stage + lr stage) core-min per decided row)")
    return lines


def _sd(row: dict, key: str, df_key: str, tag: str) -> float:
    from analysis.power import sd_upper

    sd = row[key]
    return sd_upper(sd, row[df_key]) if tag and row[df_key] else sd
