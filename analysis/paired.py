"""The paired throughput section of a report: the JSON of `python -m ablations.paired --json FILE`.

Throughput measured per run (`final_tokens_per_sec`) comes from runs made at different times on a possibly shared
machine; only arms timed side by side in one process (interleaved rounds) support a speed comparison. This module
reads such a measurement (it never imports the training code) and renders it as report blocks.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from analysis.store import AnalysisError

UNPAIRED = "runs made at different times (not paired)"
ARM_KEYS = ("name", "median_tokens_per_sec", "ratio", "ratio_ci_low", "ratio_ci_high", "tokens_per_sec", "params")


def load_paired(path: str | Path) -> dict:
    """The measurement in `path`, checked for the keys the report shows; AnalysisError (one line) otherwise."""
    p = Path(path)
    try:
        res = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AnalysisError(f"--paired {path}: cannot read it ({exc.strerror}); pass the file written by "
                            "python -m ablations.paired --json FILE") from None
    except json.JSONDecodeError as exc:
        raise AnalysisError(f"--paired {path}: not JSON ({exc.msg} at line {exc.lineno}); pass the file written by "
                            "python -m ablations.paired --json FILE") from None
    if not isinstance(res, dict) or res.get("tool") != "ablations.paired" or not isinstance(res.get("arms"), list):
        raise AnalysisError(f"--paired {path}: not a measurement of python -m ablations.paired (no tool/arms keys)")
    for a in res["arms"]:
        missing = [k for k in ARM_KEYS if not isinstance(a, dict) or k not in a]
        if missing:
            raise AnalysisError(f"--paired {path}: an arm lacks {', '.join(missing)}; re-run python -m "
                                "ablations.paired --json FILE")
    return res


def _ratio(a: dict, reference: str) -> str:
    if a["name"] == reference:
        return "reference"
    lo, hi = a["ratio_ci_low"], a["ratio_ci_high"]
    ci = "" if lo is None or not math.isfinite(lo) else f" [{lo:.3f}, {hi:.3f}]"
    return f"×{a['ratio']:.3f}{ci}"


def paired_blocks(res: dict | None, path: str | None) -> list:
    """Report blocks: the paired table and how it was measured; without a file, where to get one."""
    b: list = [("h2", "Paired throughput")]
    if res is None:
        b.append(("p", "No paired measurement was given. Per-run tokens/s in this report are from "
                       f"{UNPAIRED}: they are not a speed comparison. Measure one with `python -m ablations.paired "
                       "ARM=OVERRIDES ...` (every arm in one process, interleaved rounds) and pass its JSON with "
                       "`--paired FILE`."))
        return b
    ref = res.get("reference", res["arms"][0]["name"])
    b.append(("p", f"From `{path}`: every arm built in one process and timed in {res.get('rounds')} interleaved "
                   f"rounds of {res.get('steps_per_round')} training steps (forward, backward, clipping, AdamW) of "
                   f"{res.get('tokens_per_step')} tokens each; model `{res.get('model')}`, "
                   f"{res.get('precision')} on {res.get('device')} ({res.get('device_name')}, {res.get('threads')} "
                   f"threads), torch {res.get('torch')}; load average {res.get('load_average_start')} → "
                   f"{res.get('load_average_end')}. Ratio: per round, arm tokens/s ÷ `{ref}` tokens/s in the same "
                   "round; geometric mean over rounds with a 95% t interval on the log ratios. Command: "
                   f"`{res.get('command', 'python -m ablations.paired')}`."))
    rows = [[f"`{a['name']}`", "`" + (" ".join(a.get("overrides", [])) or "(defaults)") + "`", f"{a['params']:,}",
             f"{a['median_tokens_per_sec']:,.0f}",
             f"{min(a['tokens_per_sec']):,.0f} – {max(a['tokens_per_sec']):,.0f}", _ratio(a, ref)]
            for a in res["arms"]]
    b.append(("table", ["arm", "overrides", "params", "tokens/s (median over rounds)", "range over rounds",
                        f"ratio to `{ref}` [95% CI]"], rows))
    return b
