"""The report engine: one context per report, sections that turn it into blocks, and kinds that list sections.

A report is built in three steps, the same for every kind (ablation, protocol, known results, ladder, lr transfer,
the μP hypothesis; analysis/report.py lists them, the one entry):

1. `Context`: where the report goes, the `Options` it was asked with, the matched runs and the report's results
   (`runs`), the facts every kind has (baseline, margin, n-gram floor, what was left out), one typed `extra` for
   what only its kind has, and a memo (`ctx.once(fn)`) so that a derived fact (histories, the verdict table, the
   scaling fits) is one function computed once however many sections read it. A kind's `load` fills it in.
2. Sections: functions `(ctx) -> list of blocks` registered with `@section("name")` in the module that owns them
   (analysis/ablation.py, protocol.py, lr_search.py, context.py, lr_transfer.py, lr_hypothesis.py,
   known_results.py, ladder_report.py, and the shared ones in analysis/common.py). A section may also write its
   machine-readable files (`ctx.write`, `ctx.figure`).
3. `Kind`: a title, a `load` step, an ordered tuple of section names and what the kind says of itself (the options
   its Regenerate command repeats, its arms for the floor table, the papers' directions). `build(kind, ctx)` removes
   the kind's own files from the folder (never anything else), loads, runs the sections in order and writes its
   page (index.md, and index.html).

Adding a report kind is one list of sections (see KNOWN_RESULTS in analysis/known_results.py), not a module of
builders. Blocks and number formats live in analysis/document.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from analysis.document import render_html, render_markdown

if TYPE_CHECKING:  # annotations only: these modules import this one
    import pandas as pd

    from analysis.ablation import Ablation
    from analysis.floor import Floor
    from analysis.lr_transfer import Study
    from analysis.protocol_runs import ProtocolRuns
    from analysis.store import RunSet
    from analysis.verdict import Margin

    Extra = Ablation | ProtocolRuns | Study

FIGURE_FORMATS = ("png", "svg", "pdf")
SECTIONS: dict[str, Callable] = {}


def section(name: str):
    """Register `fn(ctx) -> blocks` as the section `name` (one function per name)."""
    def register(fn):
        if name in SECTIONS and SECTIONS[name] is not fn:
            raise ValueError(f"two sections named {name!r}: {SECTIONS[name].__module__} and {fn.__module__}")
        SECTIONS[name] = fn
        return fn
    return register


@dataclass(frozen=True)
class Options:
    """What a report was asked for: the command's options, and the files they name (read before any run, so a bad
    file fails before anything is written). A kind's load reads these and never changes them."""

    query: str = ""  # the experiment name or MLflow filter
    tracking_uri: str = ""
    filter_string: str = ""
    formats: tuple = ("png",)
    baseline: str | None = None  # baseline=: the asked-for baseline (the load resolves ctx.baseline)
    margin: float | None = None  # margin=: the asked-for margin (the load resolves ctx.margin)
    paired_path: str | None = None  # paired=FILE, and its measurement (analysis.paired.load_paired)
    paired: dict | None = None
    plan_path: str | None = None  # plan=FILE, and its seed plan (analysis.seed_plan.load_plan)
    plan: dict | None = None
    held_out: str | None = None  # held_out=EXPERIMENT=STORE (the ladder kind)
    script: str = ""  # the script whose --report regenerates the page (lr transfer)
    previous: str | None = None  # an earlier report's folder, relative to the output, to show (μP hypothesis)
    sources: tuple = ()  # (name, path) of other committed reports a kind reads (known results), overriding defaults


@dataclass
class Context:
    """Everything one report reads, built once: where it goes, what was asked, the runs and the facts every kind
    has (baseline, margin, floor, what was left out); what only one kind has is its typed `extra`."""

    out: Path | None
    options: Options = field(default_factory=Options)
    kind: Kind | None = None  # the Kind being built (None for a notebook's context)
    runset: RunSet | None = None  # the matched runs (None for kinds that read their own store, e.g. lr transfer)
    runs: pd.DataFrame | None = None  # the report's results, one row per run (a kind's load narrows the runset)
    extra: Extra | None = None  # the kind's own facts (analysis.ablation.Ablation, analysis.protocol_runs.ProtocolRuns,
    #                             analysis.lr_transfer.Study)
    baseline: str | None = None  # what the load resolved from options.baseline
    margin: Margin | None = None  # ... and from options.margin and the runs' recorded margin
    floor: Floor | None = None  # the n-gram floor of the runs' data, when the store has one
    left_out: pd.DataFrame | None = None  # runs (and figure entries) left out, and why
    files: list = field(default_factory=list)  # every path written
    _memo: dict = field(default_factory=dict, repr=False)

    def once(self, fn: Callable):
        """fn(self), computed on first use and kept: every section that needs a derived fact calls this."""
        if fn not in self._memo:
            self._memo[fn] = fn(self)
        return self._memo[fn]

    @property
    def hist(self):
        from analysis.store import history_of

        return self.once(history_of)

    def write(self, name: str, text: str) -> Path:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        self.files.append(path)
        return path

    def write_csv(self, name: str, frame) -> Path:
        """A table as CSV, the same way in every report: no index, "\\n" line ends (same frame, same bytes)."""
        return self.write(name, frame.to_csv(index=False, lineterminator="\n"))

    def figure(self, fig, name: str, folder: str = "figures") -> str:
        """Save `fig` in every requested format under `folder`; returns the path the report links (first format)."""
        from analysis.plots import save_figure

        for ext in self.options.formats:
            self.files.append(save_figure(fig, self.out / folder / f"{name}.{ext}"))
        ext = self.options.formats[0]
        return f"{folder}/{name}.{ext}" if folder else f"{name}.{ext}"


@dataclass(frozen=True)
class Kind:
    """A report kind: how to load its context, its title, its sections in order, and the files it owns."""

    name: str
    load: Callable  # (ctx) -> None; raises AnalysisError when nothing can be written
    title: Callable  # (ctx) -> str, the HTML title
    sections: tuple
    summary: Callable = lambda ctx: []  # (ctx) -> lines the command prints
    exit_code: Callable = lambda ctx: 0  # (ctx) -> 0 written, 1 written but no usable run
    args: Callable = lambda ctx: []  # (ctx) -> the options the Regenerate command repeats, [(key, value)]
    floor_arms: Callable = lambda ctx: []  # (ctx) -> (label, mean val bpb) per arm, for the floor table
    expected: tuple = ()  # (arm, direction a paper found) for the kinds that check published findings
    files: tuple = ()  # top-level files it writes (removed before a rebuild)
    figures: tuple = ()  # figure names under figures/ (every format removed before a rebuild)
    html: bool = True
    page: str = "index.md"  # the page it writes


def clean(kind: Kind, out: Path) -> None:
    """Remove the files a previous build of this kind wrote (only its own: never wipe a folder)."""
    for name in kind.files:
        (out / name).unlink(missing_ok=True)
    for name in kind.figures:
        for ext in FIGURE_FORMATS:
            (out / "figures" / f"{name}.{ext}").unlink(missing_ok=True)


def blocks(kind: Kind, ctx: Context) -> list:
    """The kind's sections run in order over one context."""
    out: list = []
    for name in kind.sections:
        out.extend(SECTIONS[name](ctx))
    return out


def build(kind: Kind, ctx: Context) -> Context:
    """Load the context, write every file of the report into ctx.out, return the context (ctx.files sorted)."""
    ctx.kind = kind
    kind.load(ctx)
    ctx.out.mkdir(parents=True, exist_ok=True)
    clean(kind, ctx.out)
    doc = blocks(kind, ctx)
    ctx.write(kind.page, render_markdown(doc))
    if kind.html:
        ctx.write("index.html", render_html(doc, kind.title(ctx)))
    ctx.files.sort()
    return ctx
