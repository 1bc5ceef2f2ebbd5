"""Every report from MLflow, one command: `python -m analysis.report KIND QUERY [key=value ...]`.

    python -m analysis.report ablation norms out=reports/norms baseline=norm=layernorm
    python -m analysis.report protocol second-study tracking_uri=sqlite:///study/second-study/mlflow.db
    python -m analysis.report known-results known-results paired=FILE plan=FILE
    python -m analysis.report ladder known-results-ladder held_out=known-results=reports/known-results/mlflow.db.gz
    python -m analysis.report lr-transfer lr-transfer out=reports/lr-transfer
    python -m analysis.report mup-hypothesis lr-transfer-480 out=reports/lr-transfer/480-steps previous=..
    python -m analysis.report ablation norms format=[png,svg] filter="tags.seed != '2'"
    python -m analysis.report QUERY [kind=KIND]     # the older spelling: KIND defaults to auto

KIND: `auto` (protocol when the matched runs carry `verdict.protocol`, else ablation), `ablation`
(analysis/ablation.py), `protocol` (analysis/protocol.py), `known-results` (analysis/known_results.py), `ladder`
(analysis/ladder_report.py), `lr-transfer` (analysis/lr_transfer.py) and `mup-hypothesis` (analysis/lr_hypothesis.py).
QUERY is an MLflow experiment name, or else an MLflow search filter over all experiments (e.g.
"tags.choice.norm = 'rmsnorm'"). The tracking URI is `tracking_uri=`, else MLFLOW_TRACKING_URI, else
sqlite:///mlflow.db. Same runs in, same bytes out (no dates, sorted everything, fixed figure metadata, seeded
bootstraps).

Exit status: 0 report written; 1 report written but no run was usable (it lists what was left out and why);
2 nothing written: a bad command line / no experiment / no runs matched / bad filter / unknown baseline / missing
store.

Options are key=value (docs/commands.md); the older flags (`--tracking-uri U`, `--format svg` repeated, `--kind K`)
still work and print one line with the new spelling.
"""
from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

from ablations.cli import Command, CommandLineError, Option, listed  # the one command-line parser: a leaf

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
    unreadable paired= file, a protocol kind asked of runs that are no verdict protocol's, ...)."""
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
        raise AnalysisError(f"kind {kind}: the runs of {runset.description} carry no verdict.protocol tag; "
                            "report a verdict protocol's runs (python -m sweeps.verdict verdict=known-results)")
    if kind == "auto":
        kind = "protocol" if is_protocol(runset) else "ablation"
    if plan and kind == "ablation":
        raise AnalysisError(f"plan={plan}: the runs of {runset.description} carry no verdict.protocol tag; a seed "
                            "plan belongs to a verdict protocol's report (drop plan=)")
    options = replace(options, query=runset.query, tracking_uri=runset.tracking_uri)
    return build(KINDS[kind], Context(out=Path(out), options=options, runset=runset))


FORMATS = ("png", "svg", "pdf")
OPTION_NAME = re.compile(r"[A-Za-z_]\w*")  # what an option is called; a filter's left side has a dot, space or `


class ReportCommand(Command):
    """The report's command line: KIND and QUERY are bare words, and QUERY, an MLflow filter, may hold `=`
    ("tags.choice.norm = 'rmsnorm'"), so an argument with `=` is an option only when the text before it could name
    one; `parse` also checks what a line can be checked for before anything is read (the words, the kind, the
    figure formats, a held-out rung of a kind that reads none) and returns the words resolved: [KIND, QUERY]."""

    def parse(self, argv: list[str]) -> tuple[dict, list[str]]:
        values, words = super().parse(argv)
        for a in words:
            if a.startswith("-") or "=" in a and OPTION_NAME.fullmatch(a.partition("=")[0]):
                raise CommandLineError(self.unknown(a))
        values["format"] = tuple(str(f) for f in listed(values["format"]))
        bad = [f for f in values["format"] if f not in FORMATS]
        if bad or not values["format"]:
            raise CommandLineError(f"{self.module}: format={bad[0] if bad else '[]'}: choose {', '.join(FORMATS)} "
                                   "(several: format=[png,svg])")
        kind, query = kind_and_query(values, words)
        if values["held_out"] and kind != "ladder":
            raise CommandLineError(f"{self.module}: held_out={values['held_out']}: only the ladder kind reads a "
                                   f"held-out rung; use {self.name} ladder QUERY")
        return values, [kind, query]


def kind_and_query(values: dict, words: list[str]) -> tuple[str, str]:
    """(kind, query) from the bare words `[KIND] QUERY` and the older `kind=` (`--kind`)."""
    kinds = ("auto", *KINDS)
    if values["kind"] is not None and values["kind"] not in kinds:
        raise CommandLineError(f"analysis.report: kind={values['kind']}: choose one of {', '.join(kinds)}")
    if not words or len(words) > 2 or len(words) == 2 and (words[0] not in kinds or values["kind"] is not None):
        raise CommandLineError(f"analysis.report: expected [KIND] QUERY with KIND one of {', '.join(kinds)} (or "
                               f"QUERY kind=KIND), got {' '.join(words) or 'nothing'}")
    return (words[0], words[1]) if len(words) == 2 else (values["kind"] or "auto", words[0])


COMMAND = ReportCommand(
    "analysis.report", "[KIND] QUERY [key=value ...]", __doc__.split("\n\n")[2],
    options=(
        Option("out", "output folder (default: reports/<experiment>)", parse=str),
        Option("tracking_uri", "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
               parse=str),
        Option("filter", "extra MLflow filter string on the experiment's runs", "", str),
        Option("format", f"figure format(s), of {', '.join(FORMATS)}: format=svg, or several format=[png,svg]",
               "png", many=True),
        Option("baseline", "variant (ablation) or arm (protocol kinds) to compare against (default: a variant "
                           "named 'baseline', else the one closest to the GPT-2 choices, else the first by name; a "
                           "protocol's recorded baseline arm)", parse=str),
        Option("margin", "equivalence margin m in bits/byte for the verdicts (default: the one the runs recorded "
                         "before they ran, else none: no equivalence is tested)", parse=float),
        Option("paired", "a paired throughput measurement: the JSON of python -m ablations.paired json=FILE",
               parse=str),
        Option("plan", "a verdict protocol's seed plan: the JSON of python -m sweeps.plan verdict=NAME json=FILE; "
                       "the verdicts flag an arm whose seed sd exceeds the sd it was planned for", parse=str),
        Option("held_out", "ladder: the largest rung from another store's verdict protocol, EXPERIMENT=STORE "
                           "(STORE: a tracking URI or an SQLite file, .db or .db.gz), e.g. "
                           "held_out=known-results=reports/known-results/mlflow.db.gz", parse=str),
        Option("script", "lr-transfer: the script whose --report regenerates the page", "", str),
        Option("previous", "mup-hypothesis: an earlier lr-transfer report's folder, relative to out=, to show",
               parse=str),
        Option("kind", "the kind, the older spelling of KIND (QUERY kind=KIND)", parse=str)),
    positional="KIND QUERY",
    rest="none: QUERY, an MLflow filter, may hold `=` (\"tags.choice.norm = 'rmsnorm'\"); a NAME=VALUE whose NAME "
         "could be an option's is refused as an unknown option",
    notes=tuple(" ".join(p.split()) for p in __doc__.split("\n\n")[3:]),
    examples=tuple(line.strip().removeprefix("python -m analysis.report ").split("  #")[0].rstrip()
                   for line in __doc__.split("\n\n")[1].splitlines()))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        o, (kind, query) = COMMAND.parse_or_help(argv)
    except CommandLineError as exc:
        return COMMAND.fail(exc)  # nothing written
    out = o["out"] or str(Path("reports") / (re.sub(r"[^A-Za-z0-9_.-]+", "_", query).strip("_") or "report"))
    try:
        ctx = build_report(query, out, baseline=o["baseline"] or None, tracking_uri=o["tracking_uri"],
                           filter_string=o["filter"] or "", formats=o["format"], margin=o["margin"],
                           paired=o["paired"], kind=kind, plan=o["plan"], held_out=o["held_out"],
                           script=o["script"] or "", previous=o["previous"])
    except AnalysisError as exc:
        return COMMAND.fail(exc)
    print("\n".join(ctx.kind.summary(ctx)))
    code = ctx.kind.exit_code(ctx)
    if code and ctx.kind is ABLATION:
        print("analysis.report: no usable run (none finished with final_val_loss and final_val_bpb); the report "
              "lists what was left out", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
