"""Tensor Programs V's Figure 1 as a hypothesis on an lr-transfer store (issue 25 item 4): written before the runs,
judged from them. A report kind over the same points as analysis.lr_transfer (its load, curves, optima, transfer)
that writes one page, hypothesis.md, beside that report:

    python -m analysis.report mup-hypothesis lr-transfer-480 tracking_uri=sqlite:///study/lr-transfer-480/mlflow.db \
        out=reports/lr-transfer/480-steps previous=..

(`python -m analysis.lr_hypothesis tracking_uri=URI experiment=E out=DIR`, the older command, still works, and so do
its flags: `--tracking-uri URI --experiment E --out DIR`.)

Per optimizer, with w0 the narrowest width (mup's base, where mup is sp), w1 the widest, and the transferred lr
the best mup lr at w0 (lowest mean over seeds):
  (a) the mup optimum moves at most one grid step across widths: analysis.lr_transfer's transfer verdict of the
      mup panel (held / failed / not established);
  (b) at the transferred lr, mup at w1 is no worse than sp at its own best lr at w1, within the seed spread:
      held when mup's mean minus sp's best mean is at most the larger seed range of the two points and sp's
      optimum is interior; failed when it exceeds that range; otherwise (sp's optimum at the grid's edge, so sp
      may do better beyond it, or the point was not run) not established;
  (c) under mup, wider is better at every lr within one grid step of the transferred lr: held when, at each such
      lr, every width's mean is below the next narrower width's; failed when somewhere a wider width's mean is
      above a narrower one's by more than the larger seed range of the two; otherwise not established. This rule
      counts a step as better on its sign alone but as worse only beyond the seed range: the verdict's sentence
      says so, with how many steps are lower by more than their seed range and what the symmetric rule would say.
Losses are analysis.lr_transfer's final val loss in nats per token (not bits per byte); the sentences say so.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from ablations.cli import Command, CommandLineError, Option  # the one command-line parser: a leaf

from .engine import Context, Kind, Options, build, section
from .lr_transfer import EXPERIMENT, LABELS, UNIT, analysed, load_lr_transfer
from .store import AnalysisError

PAGE = "hypothesis.md"
# stated before the runs, word for word: the page's Hypothesis section
HYPOTHESIS = [
    ("h2", "Hypothesis (stated before the runs)"),
    ("p", """Tensor Programs V (Yang et al. 2022), Figure 1: under μP the best learning rate of the narrow model is the best
learning rate of the wide one, and at that lr the wide model is better; under the standard parametrization the
optimum drifts. Here, for AdamW, with w0 the narrowest width (μP's base width, where μP is SP) and w1 the widest:"""),
    ("ul", ["(a) the μP optimum moves at most one grid step across widths;",
            """(b) at the transferred lr (μP's best lr at w0) the μP model at w1 is no worse than SP tuned at w1, within the
  seed spread;""",
            "(c) under μP, wider is better at every lr within one grid step of the transferred lr."]),
    ("p", """Each part is judged **held**, **failed** or **not established** by the rules in `analysis/lr_hypothesis.py`,
fixed with this text before the runs."""),
]


def _point(cur: pd.DataFrame, o: str, p: str, w: int, lr: float) -> pd.Series | None:
    c = cur[(cur["optimizer"] == o) & (cur["parametrization"] == p) & (cur["width"] == w) & (cur["lr"] == lr)]
    return None if c.empty else c.iloc[0]


def part_b(cur: pd.DataFrame, opt: pd.DataFrame, o: str) -> tuple[str, str]:
    """(verdict, sentence) of (b) for optimizer o."""
    mo, so = (opt[(opt["optimizer"] == o) & (opt["parametrization"] == p)] for p in ("mup", "sp"))
    w0, w1 = int(mo["width"].min()), int(mo["width"].max())
    lr = float(mo[mo["width"] == w0]["best_lr"].iloc[0])
    mup = _point(cur, o, "mup", w1, lr)
    sp = so[so["width"] == w1]
    if mup is None or sp.empty:
        return "not established", f"no μP run at width {w1} and lr {lr:.3g}, or no SP run at width {w1}"
    sp, own = sp.iloc[0], mo[mo["width"] == w1].iloc[0]
    diff, tol = mup["mean"] - sp["loss"], max(mup["hi"] - mup["lo"], sp["spread"])
    verdict = "failed" if not diff <= tol else "held" if sp["interior"] else "not established"
    edge = "" if sp["interior"] else " (SP's optimum is at the grid's edge)"
    # μP at its own best lr at w1 tells a failure of transfer (the lr) from a shortfall of μP at that width (any lr)
    gap = own["loss"] - sp["loss"]
    at_own = (" (the transferred lr is μP's own best there)" if own["best_lr"] == lr else
              f"; at its own best lr {own['best_lr']:.3g} μP reaches {own['loss']:.3f}, {gap:+.3f} from SP")
    return verdict, (f"at width {w1} (final val loss, {UNIT}), μP at the transferred lr {lr:.3g} reaches "
                     f"{mup['mean']:.3f}, SP at its best lr {sp['best_lr']:.3g} {sp['loss']:.3f}{edge}: μP minus SP "
                     f"{diff:+.3f} against a seed range of {tol:.3f}{at_own}")


def part_c(cur: pd.DataFrame, opt: pd.DataFrame, o: str) -> tuple[str, str]:
    """(verdict, sentence) of (c) for optimizer o: each pair of neighbouring widths at each lr within one step of
    the transferred lr is better (wider mean lower), worse (higher by more than the seed range) or unclear."""
    c = cur[(cur["optimizer"] == o) & (cur["parametrization"] == "mup")]
    mo = opt[(opt["optimizer"] == o) & (opt["parametrization"] == "mup")]
    step = int(mo.sort_values("width")["step"].iloc[0])
    widths = sorted(c["width"].unique())
    found, parts, beyond = [], [], 0
    for s in (step - 1, step, step + 1):
        at = c[c["step"] == s].set_index("width")
        if len(at) < len(widths):
            found.append("missing")
        if at.empty:
            continue
        ws = [w for w in widths if w in at.index]
        parts.append(f"lr {at['lr'].iloc[0]:.3g}: " + " → ".join(f"{at.loc[w, 'mean']:.3f}" for w in ws))
        for a, b in zip(ws, ws[1:]):
            rise = at.loc[b, "mean"] - at.loc[a, "mean"]
            tol = max(at.loc[a, "hi"] - at.loc[a, "lo"], at.loc[b, "hi"] - at.loc[b, "lo"])
            found.append("better" if rise < 0 else "worse" if rise > tol else "unclear")
            beyond += bool(rise < -tol)
    verdict = "failed" if "worse" in found else "held" if set(found) == {"better"} else "not established"
    return verdict, (f"mean final val loss ({UNIT}) from the narrowest to the widest width at each lr, "
                     + "; ".join(parts) + asymmetry(found, beyond, verdict))


def asymmetry(found: list[str], beyond: int, verdict: str) -> str:
    """(c)'s rule, fixed before the runs, counts a step as better on its sign alone but as worse only beyond the
    seed range; kept as fixed (a rule changed after the data is a forking path), and stated beside the verdict with
    what the symmetric rule (better also only beyond the seed range) would say."""
    steps = [f for f in found if f != "missing"]
    lower = steps.count("better")
    symmetric = "failed" if "worse" in found else "held" if beyond == len(found) else "not established"
    return (f" (the rule counts a step as better on its sign alone but as worse only beyond the seed range: "
            f"{lower} of {len(steps)} steps lower, {beyond} by more than their seed range"
            + ("" if symmetric == verdict else f"; better only beyond the seed range too would make (c) {symmetric}")
            + ")")


def judge(cur: pd.DataFrame, opt: pd.DataFrame, tr: pd.DataFrame) -> list[tuple[str, str, str, str]]:
    """(optimizer, part, verdict, sentence) for every optimizer with both parametrizations."""
    out = []
    for o in sorted(set(opt["optimizer"])):
        if not {"sp", "mup"} <= set(opt.loc[opt["optimizer"] == o, "parametrization"]):
            continue
        t = tr[(tr["optimizer"] == o) & (tr["parametrization"] == "mup")].iloc[0]
        out.append((o, "a", t["verdict"], t["statement"].replace("**", "").rstrip(".")))
        out.append((o, "b", *part_b(cur, opt, o)))
        out.append((o, "c", *part_c(cur, opt, o)))
    return out


def page_blocks(judged: list[tuple[str, str, str, str]], previous: str | None) -> list:
    """The page: the hypothesis, its verdict per part and optimizer (`judge`), and the earlier study's figure."""
    b: list = [("h1", "Tensor Programs V's Figure 1 on this study"),
               ("p", "Generated by `python -m analysis.report mup-hypothesis` from the study's MLflow store (the same points "
                     "as [index.md](index.md)); `scripts/lr_transfer_rerun.sh --report` regenerates both pages byte "
                     "for byte from the committed `mlflow.db.gz`. Do not edit by hand."),
               *HYPOTHESIS, ("h2", "Verdict"),
               ("ul", [f"**({part}) {verdict}** for {LABELS.get(o, o)}: {sentence}."
                       for o, part, verdict, sentence in judged])]
    if previous:
        b += [("h2", "The study before"),
              ("p", f"[The 120-step study]({previous}/index.md) (issue 18: 4 heads at every width, the head size "
                    "growing with the width under μP, AdamW and Muon):"),
              ("img", "the earlier study's figure", f"{previous}/lr_transfer.svg")]
    return b


@section("mup.page")
def page_section(ctx: Context) -> list:
    return page_blocks(judge(*ctx.once(analysed)), ctx.options.previous)


MUP_HYPOTHESIS = Kind("mup-hypothesis", load_lr_transfer, lambda ctx: "Tensor Programs V's Figure 1 on this study",
                      ("mup.page",), files=(PAGE,), html=False, page=PAGE,
                      summary=lambda ctx: [str(ctx.out / PAGE)])


COMMAND = Command(
    "analysis.lr_hypothesis", "out=DIR [key=value ...]",
    "The older command of `python -m analysis.report mup-hypothesis EXPERIMENT`, which an earlier page names: writes "
    "hypothesis.md, Tensor Programs V's Figure 1 judged on an lr-transfer store, into out=.",
    options=(Option("tracking_uri", "MLflow tracking URI (default: $MLFLOW_TRACKING_URI)", parse=str),
             Option("experiment", "MLflow experiment", EXPERIMENT, str),
             Option("out", "the report folder: writes hypothesis.md there (required)", parse=str),
             Option("previous", "an earlier report's folder, relative to out=, to show", parse=str)),
    examples=("tracking_uri=sqlite:///study/lr-transfer-480/mlflow.db experiment=lr-transfer-480 "
              "out=reports/lr-transfer/480-steps previous=..",))


def main(argv: list[str] | None = None) -> int:
    """`python -m analysis.lr_hypothesis`: kept so that the command an earlier page names (`--tracking-uri URI
    --experiment E --out DIR`) still runs; analysis.report's mup-hypothesis kind is the same build."""
    try:
        o, _ = COMMAND.parse_or_help(list(sys.argv[1:] if argv is None else argv))
        if not o["out"]:
            raise CommandLineError("out=DIR is required: the report folder to write hypothesis.md into")
        options = Options(query=o["experiment"], tracking_uri=o["tracking_uri"] or "", previous=o["previous"])
        ctx = build(MUP_HYPOTHESIS, Context(out=Path(o["out"]), options=options))
    except (CommandLineError, AnalysisError) as e:
        return COMMAND.fail(e)
    print("\n".join(MUP_HYPOTHESIS.summary(ctx)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
