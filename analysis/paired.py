"""The paired throughput section of a report: the JSON of `python -m ablations.paired json=FILE`.

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
        raise AnalysisError(f"paired={path}: cannot read it ({exc.strerror}); pass the file written by "
                            "python -m ablations.paired json=FILE") from None
    except json.JSONDecodeError as exc:
        raise AnalysisError(f"paired={path}: not JSON ({exc.msg} at line {exc.lineno}); pass the file written by "
                            "python -m ablations.paired json=FILE") from None
    if not isinstance(res, dict) or res.get("tool") != "ablations.paired" or not isinstance(res.get("arms"), list):
        raise AnalysisError(f"paired={path}: not a measurement of python -m ablations.paired (no tool/arms keys)")
    for a in res["arms"]:
        missing = [k for k in ARM_KEYS if not isinstance(a, dict) or k not in a]
        if missing:
            raise AnalysisError(f"paired={path}: an arm lacks {', '.join(missing)}; re-run python -m "
                                "ablations.paired json=FILE")
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
                       "`paired=FILE`."))
        return b
    ref = res.get("reference", res["arms"][0]["name"])
    n = res.get("processes", 1)
    where = f"in each of {n} fresh processes, one after another," if n > 1 else "in one process"
    ratio = (f"per process, the geometric mean of its rounds' paired ratios (arm tokens/s ÷ `{ref}` tokens/s in the "
             f"same round); here the geometric mean of the {n} processes' ratios with a 95% t interval over them, "
             "which includes what varies between processes (memory layout, the machine's load over minutes)"
             if n > 1 else f"per round, arm tokens/s ÷ `{ref}` tokens/s in the same round; geometric mean over rounds "
             "with a 95% t interval on the log ratios")
    b.append(("p", f"From `{path}`: every arm built {where} and timed in {res.get('rounds')} interleaved "
                   f"rounds of {res.get('steps_per_round')} training steps (forward, backward, clipping, AdamW) of "
                   f"{res.get('tokens_per_step')} tokens each; model `{res.get('model')}`, "
                   f"{res.get('precision')} on {res.get('device')} ({res.get('device_name')}, {res.get('threads')} "
                   f"threads), torch {res.get('torch')}{_commit(res)}; load average "
                   f"{_load(res.get('load_average_start'))} → {_load(res.get('load_average_end'))}. Ratio: "
                   f"{ratio}. Command: "
                   f"`{res.get('command', 'python -m ablations.paired')}`."))
    if res.get("path_rule"):
        kernels = "; ".join(f"{k}: {v}" for k, v in (res.get("kernels") or {}).items())
        cold = [a["warmup_sec"]["compile"] for a in res["arms"] if "compile" in (a.get("warmup_sec") or {})]
        b.append(("p", f"Implementation: {res['path_rule']} (column *path*)"
                       + (f"; eager uses {kernels}" if kernels else "")
                       + (f". Compiling (the first {res.get('warmup_steps')} steps of each compiled candidate, "
                          f"inductor's on-disk caches as this process found them): {min(cold):.0f}–{max(cold):.0f} s "
                          "per arm" if cold else "") + "."))
    rows = [[f"`{a['name']}`", "`" + (" ".join(a.get("overrides", [])) or "(defaults)") + "`", f"{a['params']:,}",
             _path(a), f"{a['median_tokens_per_sec']:,.0f}",
             f"{min(a['tokens_per_sec']):,.0f} – {max(a['tokens_per_sec']):,.0f}", _flops(a, res["arms"], ref),
             _ratio(a, ref)]
            for a in res["arms"]]
    median = "median of the processes' medians" if n > 1 else "median over rounds"
    b.append(("table", ["arm", "overrides", "params", "path", f"tokens/s ({median})", "range over rounds",
                        f"FLOPs/token ÷ `{ref}`'s", f"ratio to `{ref}` [95% CI]"], rows))
    return b + history_blocks(res.get("history") or [], ref)


def _flops(a: dict, arms: list[dict], reference: str) -> str:
    """The arm's counted FLOPs per token over the reference's: the tokens/s ratio its arithmetic alone would give
    is the inverse."""
    ref = next(r for r in arms if r["name"] == reference)
    if not a.get("flops_per_token") or not ref.get("flops_per_token"):
        return "–"
    return f"{a['flops_per_token'] / ref['flops_per_token']:.3f}"


def _path(a: dict) -> str:
    """The implementation an arm ran on, and the probe that chose it (ablations.paired --path fastest)."""
    path = a.get("path") or ("compile" if a.get("compiled") else "eager")
    probe = a.get("probe")
    return path if not probe else f"{path} (compile/eager ×{probe['compile_over_eager']:.3f} in the probe)"


def history_blocks(history: list[dict], ref: str) -> list:
    """Earlier measurements of these arms, kept beside the new one (ablations.paired --history): each one's
    machine, precision, implementation and ratios, newest first."""
    if not history:
        return []
    names = list(dict.fromkeys(a["name"] for h in history for a in h["arms"]))
    cols = [f"{h.get('date') or 'undated'}{_commit(h)}: {h.get('device_name')}, {h.get('precision')}, "
            f"{'paths: ' + h['path_rule'] if h.get('path_rule') else 'as configured (eager unless compile=true)'}"
            for h in history]
    rows = [[f"`{n}`", *(next((_ratio(a, ref) for a in h["arms"] if a["name"] == n), "–") for h in history)]
            for n in names]
    return [("p", "Earlier measurements of these arms (kept, not replaced; newest first): the ratio to "
                  f"`{ref}` [95% CI] in each. Their commands: " +
                  "; ".join(f"`{h.get('command')}`" for h in history) + "."),
            ("table", ["arm", *cols], rows)]


def _commit(res: dict) -> str:
    """", commit 1234abc" for a measurement that recorded the code it measured (ablations.paired since 2026-12-04)."""
    commit = res.get("git_commit")
    return f", commit {commit[:7]}{commit[40:]}" if commit else ""


def _load(value) -> str:
    """A load average as the report prints it (2 decimals; "n/a" where the platform has none)."""
    return "n/a" if value is None else f"{value:.2f}"
