"""The notebook API: an ablation report's loaded context, without writing a report.

    import analysis
    data = analysis.prepare("norms", tracking_uri="sqlite:///mlflow.db")
    ab = data.extra  # analysis.ablation.Ablation: variants, labels, shared, styles, table
    analysis.quality_figure(data.runs, ab.table, ab.styles, "kv_cache_bytes_per_token", labels=ab.labels)

The figures, tables and Markdown are the report's own functions (analysis/ablation.py, analysis/plots.py), so a
notebook shows what `python -m analysis.report` writes.
"""
from __future__ import annotations

from analysis.ablation import left_out_markdown, load_ablation, summary_markdown  # noqa: F401  (the API)
from analysis.engine import Context, Options
from analysis.store import RunSet, load_runs


def prepare(query: str, tracking_uri: str | None = None, baseline: str | None = None,
            filter_string: str = "", margin: float | None = None, runset: RunSet | None = None) -> Context:
    """The loaded context of an ablation report of `query` (experiment name or MLflow filter): runs, baseline,
    margin, what was left out, histories (`.hist`) and the kind's `Ablation` (`.extra`: labels, colours, the
    per-variant table). Raises AnalysisError when no run matched or the baseline has no usable runs. `margin`: the
    equivalence margin in bits/byte (default: the one the runs recorded, else none). `runset`: runs already loaded
    for this query."""
    runset = runset if runset is not None else load_runs(query, tracking_uri, filter_string)
    ctx = Context(out=None, runset=runset, options=Options(query=runset.query, tracking_uri=runset.tracking_uri,
                                                           filter_string=filter_string, baseline=baseline,
                                                           margin=margin))
    load_ablation(ctx)
    return ctx
