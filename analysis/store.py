"""Read ablation runs from MLflow into pandas.

Only MLflow is read (never the training code), so this works on a store copied from another machine or on a
remote tracking server. Names follow docs/CONTRACTS.md ("MLflow record").
"""
from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from modules.errors import AblationsError  # the project's one error base (imports nothing else)

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"

# Step metrics (logged against the training step).
STEP_METRICS = ("train/loss", "val/loss", "val/bpb", "tokens_seen", "elapsed_sec", "tokens_per_sec", "mfu", "lr")
# Metrics logged once per run (their latest value is the value).
ONCE_METRICS = (
    "params",
    "params_non_embedding",
    "flops_per_token",
    "kv_cache_bytes_per_token",
    "prefill_tokens_per_sec",
    "decode_tokens_per_sec",
    "decode_tokens_per_sec_nocache",
    "kv_cache_bytes_measured",
    "final_val_loss",
    "final_val_bpb",
    "final_tokens_per_sec",
    "final_mfu",
)
# A finished run without these is not a result: it is left out of the report (with the reason).
REQUIRED_METRICS = ("final_val_loss", "final_val_bpb")
# Tags copied into the run frame (besides every `choice.*` tag).
RUN_TAGS = (
    "variant",
    "seed",
    "multirun_group",
    "git_commit",
    "git_dirty",
    "data_fingerprint",
    "tokenizer",
    "tokenizer_hash",
    "precision",
    "device",
    "device_name",
    "torch_version",
    "lightning_version",
    "num_threads",
    "mfu_peak_flops",
    "mfu_peak_source",
    "failure_reason",
    "pruned",
    "wall_sec",
)
# Tags of the verdict protocol (python -m sweeps.verdict; analysis/protocol.py reads them): which protocol, arm,
# family, baseline arm, model size and stage (`lr`: the lr grid at one seed; `seeds`: the seeds at the best lr) a
# run belongs to, its size's FLOP budget and (seeds stage) the lr it ran at and where it was searched.
VERDICT_TAGS = (
    "verdict.protocol",
    "verdict.arm",
    "verdict.family",
    "verdict.baseline",
    "verdict.size",
    "verdict.stage",
    "verdict.budget_flops",
    "verdict.lr",
    "verdict.lr_from",  # the size whose lr search chose it (verdict.lr.transfer_from)
    "verdict.margin",
    "verdict.margin_reason",
    "verdict.holm",
    "verdict.primary",
    "verdict.allow_dirty",
    "verdict.paired",  # "true": the verdict file declared a paired test before the runs (arms share seeds' data order)
    "verdict.match",  # "tokens": the arm trained the baseline's tokens at its size, not the size's FLOPs (absent: flops)
    # verdict.seeds: sequential: the design the seeds were added by (the report replays its looks)
    "verdict.sequential.first",
    "verdict.sequential.batch",
    "verdict.sequential.cap",
    "verdict.sequential.spending",
    "verdict.sequential.alpha",
)
# Counters logged every step whose latest value (the last step's) is what a run spent: compute and tokens.
LAST_STEP_METRICS = ("flops_seen", "tokens_seen", "budget_flops")
# Params read into the run frame (as floats): the learning rate the run trained at; the block size and val windows
# (which val targets val/bpb averages: the n-gram floor must match them).
RUN_PARAMS = ("optim.lr", "model.block_size", "data.val_windows")
CHOICE_PREFIX = "choice."
# Choices of the GPT-2 baseline (the harness defaults); used only to pick a default baseline variant.
BASELINE_CHOICES = {"position": "learned", "norm": "layernorm", "mlp": "gelu", "attention": "mha"}

_FILTER_RE = re.compile(r"(!=|>=|<=|=|<|>|\bI?LIKE\b|\bIN\b)", re.IGNORECASE)

log = logging.getLogger(__name__)


class AnalysisError(AblationsError):
    """A clear, user-facing problem with the input (bad URI, unknown experiment, bad filter, ...)."""


def resolve_tracking_uri(uri: str | None = None) -> str:
    """`uri` if given, else `MLFLOW_TRACKING_URI`, else `sqlite:///mlflow.db` (in the current directory)."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def display_uri(uri: str) -> str:
    """The tracking URI without any user:password part (safe to print in a report)."""
    parts = urlsplit(uri)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return uri


def _check_local_store(uri: str) -> None:
    """Refuse a SQLite/file URI whose store does not exist (MLflow would silently create an empty one)."""
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and path != ":memory:" and not Path(path).exists():
            raise AnalysisError(f"no MLflow store at {path} (tracking URI {uri}); pass tracking_uri= or set "
                                "MLFLOW_TRACKING_URI")
    elif uri.startswith("file:") or "://" not in uri:
        path = re.sub(r"^file:(//)?", "", uri)
        if not Path(path).exists():
            raise AnalysisError(f"no MLflow store at {path} (tracking URI {uri})")


def _client(uri: str):
    logging.getLogger("alembic").setLevel(logging.WARNING)
    from mlflow.tracking import MlflowClient

    _check_local_store(uri)
    return MlflowClient(tracking_uri=uri)


def looks_like_filter(query: str) -> bool:
    """True when `query` reads as an MLflow search filter (has a comparison) rather than an experiment name."""
    return bool(_FILTER_RE.search(query))


@dataclass
class RunSet:
    """Runs matched by one query, split into results and runs left out (with the reason)."""

    tracking_uri: str
    query: str
    description: str
    experiments: dict[str, str] = field(default_factory=dict)  # experiment id -> name
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)  # every matched run, one row each
    included: pd.DataFrame = field(default_factory=pd.DataFrame)  # finished runs with the required metrics
    left_out: pd.DataFrame = field(default_factory=pd.DataFrame)  # run_id, run_name, variant, seed, status, scope, reason

    @property
    def variants(self) -> list[str]:
        return order_variants(self.included["variant"].unique()) if len(self.included) else []


def _search_all(client, experiment_ids: list[str], filter_string: str) -> list:
    from mlflow.entities import ViewType

    runs, token = [], None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _experiments(client) -> dict[str, str]:
    from mlflow.entities import ViewType

    out, token = {}, None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        out.update({e.experiment_id: e.name for e in page})
        token = page.token
        if not token:
            return out


def search_runs(query: str, tracking_uri: str | None = None, filter_string: str = ""):
    """Find runs for `query`: an experiment name, or else an MLflow filter string searched over all experiments.

    `filter_string` further restricts an experiment's runs. Returns (runs, experiments {id: name}, description).
    Raises AnalysisError for an unknown experiment or a malformed filter.
    """
    from mlflow.exceptions import MlflowException

    uri = resolve_tracking_uri(tracking_uri)
    client = _client(uri)
    try:
        experiments = _experiments(client)
        exp = client.get_experiment_by_name(query)
        if exp is not None and exp.lifecycle_stage == "active":
            ids = [exp.experiment_id]
            flt = filter_string
            description = f"experiment `{query}`" + (f" filtered by `{flt}`" if flt else "")
        elif looks_like_filter(query):
            ids = sorted(experiments)
            flt = f"{query} and {filter_string}" if filter_string else query
            description = f"runs matching `{flt}` in all experiments"
        else:
            known = ", ".join(sorted(experiments.values())) or "none"
            raise AnalysisError(f"no experiment named {query!r} at {display_uri(uri)} (experiments there: {known})")
        runs = _search_all(client, ids, flt) if ids else []
    except MlflowException as exc:
        raise AnalysisError(f"MLflow could not search {display_uri(uri)}: {exc.message}") from None
    return runs, experiments, description


def _to_float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _seed(tags: dict, params: dict):
    for raw in (tags.get("seed"), params.get("seed")):
        if raw is None:
            continue
        try:
            return int(float(raw))
        except (TypeError, ValueError):
            continue
    return pd.NA


def variant_name(tags: dict, run_name: str | None = None) -> str:
    """The variant of a run: its `variant` tag; else its `choice.*` tags; else its run name without `seed=`."""
    if tags.get("variant"):
        return tags["variant"]
    choices = sorted((k[len(CHOICE_PREFIX):], v) for k, v in tags.items() if k.startswith(CHOICE_PREFIX))
    if choices:
        return " ".join(f"{k}={v}" for k, v in choices)
    if run_name:
        words = [w for w in run_name.split() if not w.startswith("seed=")]
        if words:
            return " ".join(words)
    return "unlabelled"


def runs_frame(runs, experiments: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per MLflow run: ids, status, variant, seed, tags, choice.* tags, once-metrics (latest values)."""
    experiments = experiments or {}
    rows = []
    for run in runs:
        info, data = run.info, run.data
        tags, params, metrics = dict(data.tags), dict(data.params), dict(data.metrics)
        row = {
            "run_id": info.run_id,
            "run_name": info.run_name or tags.get("mlflow.runName", ""),
            "experiment": experiments.get(info.experiment_id, info.experiment_id),
            "status": info.status,
            "start_time": info.start_time,
            "end_time": info.end_time,
            "variant": variant_name(tags, info.run_name),
            "seed": _seed(tags, params),
        }
        for tag in RUN_TAGS:
            if tag not in ("variant", "seed"):
                row[tag] = tags.get(tag)
        for tag in VERDICT_TAGS:
            row[tag] = tags.get(tag)
        for key, value in tags.items():
            if key.startswith(CHOICE_PREFIX):
                row[key] = value
        for key in ONCE_METRICS + LAST_STEP_METRICS:
            row[key] = _to_float(metrics.get(key))
        for key in RUN_PARAMS:
            row[key] = _to_float(params.get(key))
        rows.append(row)
    columns = ["run_id", "run_name", "experiment", "status", "start_time", "end_time", "variant", "seed",
               *[t for t in RUN_TAGS if t not in ("variant", "seed")], *VERDICT_TAGS, *ONCE_METRICS,
               *LAST_STEP_METRICS, *RUN_PARAMS]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=columns)
    choice_cols = sorted(c for c in frame.columns if c.startswith(CHOICE_PREFIX))
    frame = frame[columns + choice_cols]
    frame["seed"] = frame["seed"].astype("Int64")
    return frame.sort_values(["variant", "seed", "start_time", "run_id"], na_position="last").reset_index(drop=True)


def _status_reason(row) -> str:
    status = row["status"]
    if status == "FAILED":
        reason = row.get("failure_reason")
        return f"run FAILED ({reason})" if reason else "run FAILED"
    if status == "KILLED":
        return "run KILLED (pruned by the sweep)" if str(row.get("pruned")).lower() == "true" else "run KILLED"
    return f"run still {status} (not finished)"


def _identity(frame: pd.DataFrame) -> pd.Series:
    """What makes two finished runs the same measurement: experiment, variant and seed (a run in another experiment
    is another measurement, not a re-run: a query spanning experiments keeps both); for a run of the verdict
    protocol also its protocol, arm, size, stage and lr (the lr stage runs one seed at several lrs)."""
    def one(row) -> str:
        parts = [str(row.get("experiment")), str(row["variant"]), str(row["seed"])]
        if pd.notna(row.get("verdict.protocol")):
            parts += [str(row.get(t)) for t in ("verdict.protocol", "verdict.arm", "verdict.size", "verdict.stage")]
            parts.append(repr(row.get("optim.lr")))
        return "\x1f".join(parts)
    return frame.apply(one, axis=1) if len(frame) else pd.Series([], dtype=str)


def split_runs(frame: pd.DataFrame, required=REQUIRED_METRICS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split a run frame into (included, left_out).

    Included: FINISHED runs whose required metrics are present and finite; of several finished runs with the same
    variant and seed (for runs of the verdict protocol: and protocol, arm, size, stage and lr) only the newest is
    kept. Every other run gets a row in left_out with the reason.
    """
    left = []

    def leave(row, reason):
        left.append({"run_id": row["run_id"], "run_name": row["run_name"], "variant": row["variant"],
                     "seed": row["seed"], "status": row["status"], "scope": "report", "reason": reason})

    keep = []
    for _, row in frame.iterrows():
        if row["status"] != "FINISHED":
            leave(row, _status_reason(row))
            continue
        missing = [m for m in required if not math.isfinite(_to_float(row.get(m)))]
        if missing:
            leave(row, "missing metric " + ", ".join(missing))
            continue
        keep.append(row)
    included = pd.DataFrame(keep, columns=frame.columns)
    if len(included):
        included = included.sort_values(["start_time", "run_id"], ascending=False)
        key = _identity(included)
        dup = key.duplicated(keep="first") & included["seed"].notna()
        newest = dict(zip(key[~dup], included.loc[~dup, "run_id"]))
        for i, row in included[dup].iterrows():
            leave(row, f"superseded by newer run {newest[key[i]]} with the same variant and seed"
                       + (" (and protocol size, stage and lr)" if pd.notna(row.get("verdict.protocol")) else ""))
        included = included[~dup]
        included = included.sort_values(["variant", "seed", "run_id"]).reset_index(drop=True)
    left_out = pd.DataFrame(left, columns=["run_id", "run_name", "variant", "seed", "status", "scope", "reason"])
    if len(left_out):
        left_out["seed"] = left_out["seed"].astype("Int64")
        left_out = left_out.sort_values(["variant", "seed", "run_id"], na_position="last").reset_index(drop=True)
    return included, left_out


def load_runs(query: str, tracking_uri: str | None = None, filter_string: str = "") -> RunSet:
    """Load the runs of an experiment name (or of an MLflow filter string) and split off what is not a result."""
    uri = resolve_tracking_uri(tracking_uri)
    runs, experiments, description = search_runs(query, uri, filter_string)
    frame = runs_frame(runs, experiments)
    included, left_out = split_runs(frame)
    return RunSet(tracking_uri=uri, query=query, description=description, experiments=experiments,
                  runs=frame, included=included, left_out=left_out)


def metric_histories(run_ids, keys=STEP_METRICS, tracking_uri: str | None = None) -> pd.DataFrame:
    """Long frame (run_id, key, step, value, timestamp) of the step metrics of `run_ids`, sorted.

    When a step was logged twice (e.g. after a resume) the later value is kept.
    """
    client = _client(resolve_tracking_uri(tracking_uri))
    rows = []
    for run_id in sorted(set(run_ids)):
        for key in keys:
            for m in client.get_metric_history(run_id, key):
                rows.append((run_id, key, int(m.step), float(m.value), int(m.timestamp)))
    hist = pd.DataFrame(rows, columns=["run_id", "key", "step", "value", "timestamp"])
    if hist.empty:
        return hist
    hist = hist.sort_values(["run_id", "key", "step", "timestamp"])
    hist = hist.drop_duplicates(["run_id", "key", "step"], keep="last")
    return hist.reset_index(drop=True)


def history_of(ctx) -> pd.DataFrame:
    """The step-metric histories of a report's results (analysis/engine.py: read once, as `ctx.hist`)."""
    included = ctx.runs
    if not len(included):
        return pd.DataFrame(columns=["run_id", "key", "step", "value", "timestamp"])
    return metric_histories(included["run_id"], tracking_uri=ctx.runset.tracking_uri)


def _interp_extrapolate(x, xp, fp):
    """np.interp inside [xp[0], xp[-1]], linear extrapolation from the end segments outside (NaN with one point)."""
    import numpy as np

    x = np.asarray(x, dtype=float)
    if len(xp) == 1:
        return np.where(x == xp[0], fp[0], np.nan)
    y = np.interp(x, xp, fp)
    lo, hi = x < xp[0], x > xp[-1]
    y[lo] = fp[0] + (x[lo] - xp[0]) * (fp[1] - fp[0]) / (xp[1] - xp[0])
    y[hi] = fp[-1] + (x[hi] - xp[-1]) * (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
    return y


def curves(hist: pd.DataFrame, y: str, x: str = "step") -> pd.DataFrame:
    """Per-run curve of metric `y` against `x` (`step`, `tokens_seen` or `elapsed_sec`): columns run_id, step, x, y.

    `tokens_seen` / `elapsed_sec` are interpolated (linearly in step) at the steps where `y` was logged, so they need
    not be logged at exactly the same steps. Runs without `y` or `x` are absent.
    """
    import numpy as np

    out = []
    ys = hist[hist["key"] == y]
    for run_id, part in ys.groupby("run_id", sort=True):
        steps = part["step"].to_numpy()
        if x == "step":
            xs = steps
        else:
            ref = hist[(hist["run_id"] == run_id) & (hist["key"] == x)]
            if ref.empty:
                continue
            xs = _interp_extrapolate(steps, ref["step"].to_numpy(dtype=float), ref["value"].to_numpy(dtype=float))
            xs = np.maximum(xs, 0.0)  # counters: never negative when extrapolated back to step 0
        cols = {"run_id": run_id, "step": steps, x: xs} if x != "step" else {"run_id": run_id, "step": steps}
        out.append(pd.DataFrame(cols | {y: part["value"].to_numpy(dtype=float)}))
    if not out:
        return pd.DataFrame(columns=list(dict.fromkeys(["run_id", "step", x, y])))
    frame = pd.concat(out, ignore_index=True)
    return frame[np.isfinite(frame[x]) & np.isfinite(frame[y])].reset_index(drop=True)


def order_variants(variants, baseline: str | None = None) -> list[str]:
    """Deterministic variant order: the baseline first, then by name."""
    names = sorted({str(v) for v in variants})
    if baseline in names:
        names.remove(baseline)
        names.insert(0, baseline)
    return names


def variant_labels(included: pd.DataFrame) -> tuple[dict[str, str], list[str]]:
    """Short display labels: each variant's `key=value` words minus those shared by every variant of the results.

    Returns ({variant: label}, shared words). A variant left with no word of its own (e.g. the defaults) is named by
    the `choice.*` tags that differ between the variants, else `(defaults)`. Labels are for figures and tables;
    the full `variant` tag stays the key (and is in the CSV files).
    """
    names = sorted({str(v) for v in included["variant"]})
    if not names:
        return {}, []
    words = {v: v.split() for v in names}
    shared = set(words[names[0]]).intersection(*(set(w) for w in words.values())) if len(names) > 1 else set()
    choice_cols = sorted(c for c in included.columns if c.startswith(CHOICE_PREFIX))
    varying = [c for c in choice_cols if included[c].astype(str).nunique() > 1]
    labels = {}
    for v in names:
        label = " ".join(w for w in words[v] if w not in shared)
        if not label:
            rows = included[included["variant"] == v]
            label = " ".join(f"{c[len(CHOICE_PREFIX):]}={rows[c].iloc[0]}" for c in varying
                             if len(rows) and rows[c].nunique() == 1) or "(defaults)"
        labels[v] = label
    if len(set(labels.values())) < len(labels):  # never merge two variants under one label
        return {v: v for v in names}, []
    return labels, [w for w in words[names[0]] if w in shared]


def shorten(variant: str, shared) -> str:
    """`variant` without the words shared by all variants of the results (for runs outside the results)."""
    shared = set(shared)
    return " ".join(w for w in str(variant).split() if w not in shared) or str(variant)


def default_baseline(included: pd.DataFrame) -> str | None:
    """A variant named `baseline`; else the one whose choice.* tags match most GPT-2 baseline choices; else the first
    by name."""
    if included.empty:
        return None
    variants = order_variants(included["variant"].unique())
    if "baseline" in variants:
        return "baseline"

    def score(v):
        rows = included[included["variant"] == v]
        s = 0
        for group, choice in BASELINE_CHOICES.items():
            col = CHOICE_PREFIX + group
            if col in rows and (rows[col] == choice).all():
                s += 1
        return s

    return max(variants, key=lambda v: (score(v), -variants.index(v)))
