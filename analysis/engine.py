"""The report engine: one context per report, sections that turn it into blocks, and kinds that list sections.

A report is built in three steps, the same for every kind (ablation, protocol, lr transfer, known results):

1. `Context`: the runs (an `analysis.store.RunSet`), where the report goes, the options it was asked with, and a
   memo (`ctx.once(fn)`) so that a derived fact (histories, the n-gram floor, the verdict table) is computed once
   however many sections read it. A kind's `load` fills in what it needs (the baseline, labels, margin, ...).
2. Sections: functions `(ctx) -> list of blocks` registered with `@section("name")` in the module that owns them
   (analysis/report.py, protocol.py, context.py, lr_transfer.py, known_results.py, forest.py, and the shared ones
   in analysis/common.py). A section may also write its machine-readable files (`ctx.write`, `ctx.figure`).
3. `Kind`: a title, a `load` step and an ordered tuple of section names. `build(kind, ctx)` removes the kind's own
   files from the folder (never anything else), loads, runs the sections in order and writes index.md (and
   index.html).

Adding a report kind is one list of sections (see KNOWN_RESULTS in analysis/known_results.py), not a module of
builders. Blocks and number formats live in analysis/document.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from analysis.document import render_html, render_markdown

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


@dataclass
class Context:
    """Everything one report reads, built once. Options a kind does not use stay at their defaults."""

    out: Path
    kind: object = None  # the Kind being built
    runset: object = None  # analysis.store.RunSet (None for kinds that read their own store, e.g. lr transfer)
    query: str = ""
    tracking_uri: str = ""
    filter_string: str = ""
    formats: tuple = ("png",)
    paired_path: str | None = None  # --paired FILE, and its measurement
    paired: dict | None = None
    plan_path: str | None = None  # --plan FILE (a verdict protocol's seed plan, analysis.seed_plan), and its plan
    plan: dict | None = None
    option_args: list = field(default_factory=list)  # options the Regenerate command repeats
    given_baseline: str | None = None  # what was asked for (--baseline, --margin) ...
    given_margin: float | None = None
    baseline: str | None = None  # ... and what the kind's load resolved
    margin: object = None  # analysis.verdict.Margin
    variants: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # variant -> short display label
    shared: list = field(default_factory=list)  # override words shared by every variant (dropped from labels)
    styles: dict = field(default_factory=dict)
    protocol: object = None  # the verdict protocol's runs and recorded design (analysis.protocol.ProtocolRuns)
    expected: dict = field(default_factory=dict)  # arm -> the direction a paper found (known-results report)
    sources: dict = field(default_factory=dict)  # other committed reports a kind reads (known results), by name
    study: object = None  # an lr-transfer study's points and design (analysis.lr_transfer.Study)
    table: object = None  # the per-variant table (ablation kind), the verdict table (protocol kind)
    floor: object = None  # analysis.floor.Floor of the runs' data, when the store has one
    floor_arms: list = field(default_factory=list)  # (label, mean val bpb) per arm, for the floor table
    left_out: object = None  # run-level and figure-level exclusions
    files: list = field(default_factory=list)
    _memo: dict = field(default_factory=dict, repr=False)

    def once(self, fn: Callable):
        """fn(self), computed on first use and kept: every section that needs a derived fact calls this."""
        if fn not in self._memo:
            self._memo[fn] = fn(self)
        return self._memo[fn]

    @property
    def included(self):
        return self.runset.included

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

    def figure(self, fig, name: str, folder: str = "figures") -> str:
        """Save `fig` in every requested format under `folder`; returns the path the report links (first format)."""
        from analysis.plots import save_figure

        for ext in self.formats:
            self.files.append(save_figure(fig, self.out / folder / f"{name}.{ext}"))
        return f"{folder}/{name}.{self.formats[0]}" if folder else f"{name}.{self.formats[0]}"


@dataclass(frozen=True)
class Kind:
    """A report kind: how to load its context, its title, its sections in order, and the files it owns."""

    name: str
    load: Callable  # (ctx) -> None; raises AnalysisError when nothing can be written
    title: Callable  # (ctx) -> str, the HTML title
    sections: tuple
    summary: Callable = lambda ctx: []  # (ctx) -> lines the command prints
    exit_code: Callable = lambda ctx: 0  # (ctx) -> 0 written, 1 written but no usable run
    files: tuple = ()  # top-level files it writes (removed before a rebuild)
    figures: tuple = ()  # figure names under figures/ (every format removed before a rebuild)
    html: bool = True


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
    kind.load(ctx)
    ctx.out.mkdir(parents=True, exist_ok=True)
    clean(kind, ctx.out)
    doc = blocks(kind, ctx)
    ctx.write("index.md", render_markdown(doc))
    if kind.html:
        ctx.write("index.html", render_html(doc, kind.title(ctx)))
    ctx.files.sort()
    return ctx
