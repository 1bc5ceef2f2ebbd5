"""Analysis of ablation runs: reads MLflow only (never the training code), so it works on a copied store too.

Main entry points: `python -m analysis.report KIND ...` (analysis/report.py); in Python (analysis/notebook.py),
`analysis.prepare()` (the loaded context of an ablation report: runs, per-variant table, colours, histories), the
figure functions `quality_figure` / `loss_curves_figure`, and `pareto_front` / `welch`. Every report is a kind (a list of sections) built over one
`Context` (analysis/engine.py). Names are imported lazily (so `python -m analysis.report` runs cleanly).
"""
from importlib import import_module

_NAMES = {
    "analysis.engine": ("Context", "Kind", "section"),
    "analysis.plots": ("loss_curves_figure", "quality_figure", "save_figure", "variant_styles"),
    "analysis.notebook": ("left_out_markdown", "prepare", "summary_markdown"),
    "analysis.report": ("build_report",),
    "analysis.stats": ("pareto_front", "variant_table", "welch"),
    "analysis.store": ("AnalysisError", "RunSet", "curves", "load_runs", "metric_histories", "resolve_tracking_uri",
                       "split_runs", "variant_labels"),
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")
