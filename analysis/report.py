"""Every report from MLflow, one command: `python -m analysis.report KIND QUERY [options]`.

    python -m analysis.report ablation norms --out reports/norms --baseline norm=layernorm
    python -m analysis.report protocol second-study --tracking-uri sqlite:///study/second-study/mlflow.db
    python -m analysis.report known-results known-results --paired FILE --plan FILE
    python -m analysis.report ladder known-results-ladder --held-out known-results=reports/known-results/mlflow.db.gz
    python -m analysis.report lr-transfer lr-transfer --out reports/lr-transfer
    python -m analysis.report mup-hypothesis lr-transfer-480 --out reports/lr-transfer/480-steps --previous ..
    python -m analysis.report QUERY [--kind KIND]     # the older spelling: KIND defaults to auto

KIND: `auto` (protocol when the matched runs carry `verdict.protocol`, else ablation), `ablation`
(analysis/ablation.py), `protocol` (analysis/protocol.py), `known-results` (analysis/known_results.py), `ladder`
(analysis/ladder_report.py), `lr-transfer` (analysis/lr_transfer.py) and `mup-hypothesis` (analysis/lr_hypothesis.py).
QUERY is an MLflow experiment name, or else an MLflow search filter over all experiments (e.g.
"tags.choice.norm = 'rmsnorm'"). The tracking URI is `--tracking-uri`, else MLFLOW_TRACKING_URI, else
sqlite:///mlflow.db. Same runs in, same bytes out (no dates, sorted everything, fixed figure metadata, seeded
bootstraps).

Exit status: 0 report written; 1 report written but no run was usable (it lists what was left out and why);
2 nothing written: no experiment / no runs matched / bad filter / unknown baseline / missing store.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

from analysis.ablation import ABLATION
from analysis.engine import Context, Options, build
from analysis.known_results import KNOWN_RESULTS
from analysis.ladder_report import LADDER
from analysis.lr_hypothesis import MUP_HYPOTHESIS
from analysis.lr_transfer import LR_TRANSFER
from analysis.paired import load_paired
from analysis.protocol import PROTOCOL
from analysis.protocol_runs import is_protocol
from analysis.seed_plan import load_plan
from analysis.store import AnalysisError, display_uri, load_runs

KINDS = {k.name: k for k in (ABLATION, PROTOCOL, KNOWN_RESULTS, LADDER, LR_TRANSFER, MUP_HYPOTHESIS)}
OF_PROTOCOL = ("protocol", "known-results", "ladder")  # kinds that read a verdict protocol's runs
OWN_STORE = ("lr-transfer", "mup-hypothesis")  # kinds that read their study's runs themselves (no RunSet)


def build_report(query: str, out: str | Path, baseline: str | None = None, tracking_uri: str | None = None,
                 filter_string: str = "", formats=("png",), margin: float | None = None,
                 paired: str | None = None, kind: str = "auto", plan: str | None = None,
                 held_out: str | None = None, script: str = "", previous: str | None = None) -> Context:
    """Read the runs, write every file of the report into `out`, return its context (`.kind` says which report).
    Raises AnalysisError when nothing can be written (no such experiment, no runs, unknown baseline, bad margin,
    unreadable --paired file, a protocol kind asked of runs that are no verdict protocol's, ...)."""
    options = Options(query=query, tracking_uri=tracking_uri or "", filter_string=filter_string,
                      formats=tuple(formats), baseline=baseline, margin=margin, paired_path=paired,
                      paired=load_paired(paired) if paired else None,  # a bad file fails before anything is read
                      plan_path=plan, plan=load_plan(plan) if plan else None, held_out=held_out, script=script,
                      previous=previous)
    if kind in OWN_STORE:
        return build(KINDS[kind], Context(out=Path(out), options=options))
    runset = load_runs(query, tracking_uri, filter_string)
    if runset.runs.empty:
        raise AnalysisError(f"no runs for {runset.description} at {display_uri(runset.tracking_uri)}; "
                            "nothing written")
    if kind in OF_PROTOCOL and not is_protocol(runset):
        raise AnalysisError(f"--kind {kind}: the runs of {runset.description} carry no verdict.protocol tag; "
                            "report a verdict protocol's runs (python -m sweeps.verdict verdict=known-results)")
    if kind == "auto":
        kind = "protocol" if is_protocol(runset) else "ablation"
    if plan and kind == "ablation":
        raise AnalysisError(f"--plan {plan}: the runs of {runset.description} carry no verdict.protocol tag; a seed "
                            "plan belongs to a verdict protocol's report (drop --plan)")
    options = replace(options, query=runset.query, tracking_uri=runset.tracking_uri)
    return build(KINDS[kind], Context(out=Path(out), options=options, runset=runset))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0],
                                usage="%(prog)s [KIND] QUERY [options]",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("words", nargs="+", metavar="KIND QUERY",
                   help=f"the report kind ({', '.join(['auto', *KINDS])}; default auto) and the MLflow experiment "
                        "name or search filter")
    p.add_argument("--kind", default=None, choices=("auto", *KINDS), help="the kind, older spelling of KIND")
    p.add_argument("--out", default=None, help="output folder (default: reports/<experiment>)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--filter", default="", help="extra MLflow filter string on the experiment's runs")
    p.add_argument("--format", action="append", choices=("png", "svg", "pdf"), dest="formats",
                   help="figure format(s); repeatable (default: png)")
    p.add_argument("--baseline", default=None,
                   help="variant (ablation) or arm (protocol kinds) to compare against (default: a variant named "
                        "'baseline', else the one closest to the GPT-2 choices, else the first by name; a protocol's "
                        "recorded baseline arm)")
    p.add_argument("--margin", type=float, default=None,
                   help="equivalence margin m in bits/byte for the verdicts (default: the one the runs recorded "
                        "before they ran, else none: no equivalence is tested)")
    p.add_argument("--paired", default=None, metavar="FILE",
                   help="a paired throughput measurement: the JSON of python -m ablations.paired --json FILE")
    p.add_argument("--plan", default=None, metavar="FILE",
                   help="a verdict protocol's seed plan: the JSON of python -m sweeps.plan verdict=NAME json=FILE; "
                        "the verdicts flag an arm whose seed sd exceeds the sd it was planned for")
    p.add_argument("--held-out", default=None, metavar="EXPERIMENT=STORE",
                   help="ladder: the largest rung from another store's verdict protocol (STORE: a tracking URI or "
                        "an SQLite file, .db or .db.gz), e.g. known-results=reports/known-results/mlflow.db.gz")
    p.add_argument("--script", default="", help="lr-transfer: the script whose --report regenerates the page")
    p.add_argument("--previous", default=None,
                   help="mup-hypothesis: an earlier lr-transfer report's folder, relative to --out, to show")
    return p


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if len(args.words) > 2 or (len(args.words) == 2 and (args.words[0] not in ("auto", *KINDS) or args.kind)):
        ap.error(f"expected [KIND] QUERY with KIND one of {', '.join(['auto', *KINDS])} (or QUERY --kind KIND), "
                 f"got {' '.join(args.words)}")
    kind, query = (args.words if len(args.words) == 2 else [args.kind or "auto", args.words[0]])
    if args.held_out and kind != "ladder":
        print(f"analysis.report: error: --held-out {args.held_out}: only the ladder kind reads a held-out rung; "
              "use python -m analysis.report ladder QUERY", file=sys.stderr)
        return 2
    out = args.out or str(Path("reports") / (re.sub(r"[^A-Za-z0-9_.-]+", "_", query).strip("_") or "report"))
    try:
        ctx = build_report(query, out, baseline=args.baseline, tracking_uri=args.tracking_uri,
                           filter_string=args.filter, formats=tuple(args.formats or ("png",)),
                           margin=args.margin, paired=args.paired, kind=kind, plan=args.plan,
                           held_out=args.held_out, script=args.script, previous=args.previous)
    except AnalysisError as exc:
        print(f"analysis.report: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(ctx.kind.summary(ctx)))
    code = ctx.kind.exit_code(ctx)
    if code and ctx.kind is ABLATION:
        print("analysis.report: no usable run (none finished with final_val_loss and final_val_bpb); the report "
              "lists what was left out", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
