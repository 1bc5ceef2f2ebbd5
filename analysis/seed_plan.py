"""The sds a verdict protocol's seeds were planned for: the JSON of `python -m sweeps.plan ... json=FILE`, read by
`python -m analysis.report ... plan=FILE` (issue 38). The planner chose each size's seed count so that a comparison
has power 0.8 at those sds; an arm whose observed seed sd exceeds its planned one had less power than planned, so
the verdict section flags it beside the verdicts (an inconclusive verdict there may be the plan's shortfall).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from analysis.document import fixed
from analysis.store import AnalysisError

ROW_KEYS = ("size", "arm", "primary", "sd_arm", "sd_baseline", "sd_source")
SD_AT = {"upper": "each pilot sd at its 80% upper confidence bound, plan.sd_at=upper",
         "estimate": "each pilot sd as estimated, plan.sd_at=estimate"}


def load_plan(path: str | Path) -> dict:
    """The plan in `path`, checked for the keys the report reads; AnalysisError (one line) otherwise."""
    again = "pass the file written by python -m sweeps.plan verdict=NAME json=FILE"
    try:
        res = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise AnalysisError(f"plan={path}: cannot read it ({exc.strerror}); {again}") from None
    except json.JSONDecodeError as exc:
        raise AnalysisError(f"plan={path}: not JSON ({exc.msg} at line {exc.lineno}); {again}") from None
    if not isinstance(res, dict) or res.get("tool") != "sweeps.plan" or not isinstance(res.get("rows"), list):
        raise AnalysisError(f"plan={path}: not a plan of python -m sweeps.plan (no tool/rows keys); {again}")
    for r in res["rows"]:
        missing = [k for k in ROW_KEYS if not isinstance(r, dict) or k not in r]
        if missing:
            raise AnalysisError(f"plan={path}: a row lacks {', '.join(missing)}; {again}")
    return res


def check_protocol(plan: dict | None, path: str | None, name: str) -> None:
    """AnalysisError (one line, before anything is written) when the plan is another protocol's."""
    if plan is not None and str(plan.get("protocol")) != str(name):
        raise AnalysisError(f"plan={path}: a plan of protocol {plan.get('protocol')!r}, these runs are {name!r}'s; "
                            f"pass the plan of {name!r} (python -m sweeps.plan verdict={name} json=FILE)")


def planned_sds(plan: dict, baseline: str) -> dict[tuple[str, str], float]:
    """(size, arm) -> the sd its seeds were planned for, the baseline's at every size with a primary comparison;
    secondary comparisons are left out (their seeds are plan.secondary_seeds, not planned from an sd)."""
    out: dict[tuple[str, str], float] = {}
    for r in plan["rows"]:
        if r["primary"]:
            out[(str(r["size"]), str(r["arm"]))] = float(r["sd_arm"])
            out.setdefault((str(r["size"]), baseline), float(r["sd_baseline"]))
    return out


def over_plan(table, plan: dict, baseline: str) -> list[dict]:
    """The rows of a verdict table (analysis.protocol.verdicts) whose seed sd exceeds the sd they were planned for:
    size, arm, observed sd, planned sd."""
    sds = planned_sds(plan, baseline)
    out = []
    for _, r in table.iterrows():
        want = sds.get((str(r["size"]), str(r["arm"])), math.nan)
        if math.isfinite(want) and math.isfinite(r["std"]) and r["std"] > want:
            out.append({"size": r["size"], "arm": r["arm"], "sd": float(r["std"]), "planned": want})
    return out


def plan_blocks(ctx, table) -> list:
    """One paragraph under the verdict table: which arms' seed sd exceeds the sd they were planned for (or that none
    does); nothing without plan=."""
    plan = ctx.options.plan
    if plan is None or table is None or not len(table):
        return []
    sd_from = (f"one sd given for every arm, plan.sd={plan['sd_given']:g}" if plan.get("sd_given") is not None
               else SD_AT.get(plan.get("sd_at"), f"plan.sd_at={plan.get('sd_at')}"))
    how = (f"`{ctx.options.plan_path}` (`python -m sweeps.plan`, {sd_from}: the sds at which each size's seed count "
           "gives the planned power)")
    over = over_plan(table, plan, ctx.baseline)
    if not over:
        return [("p", f"**Seed sds within the plan**: no arm's seed sd exceeds the sd its seeds were planned for, "
                      f"{how}.")]
    return [("p", f"**Seed sd above the plan's**, {how}: " + "; ".join(
        f"`{o['arm']}` at `{o['size']}`: {fixed(o['sd'])}, {o['sd'] / o['planned']:.2f}× its planned "
        f"{fixed(o['planned'])}" for o in over)
        + ". A comparison with a larger spread than planned had less power than planned, to detect a difference of "
          "±m or to show equivalence within it: an inconclusive verdict there may be the plan's shortfall.")]
