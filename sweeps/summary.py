"""What a worker prints when its share of a study is done: the trials by state, the budget used, the best trial
(or the Pareto front) with its MLflow run, and where to look further (optuna-dashboard, mlflow ui)."""
from __future__ import annotations

from typing import Any, Mapping

import optuna
from optuna.trial import TrialState

from sweeps.settings import SweepSettings
from sweeps.space import format_value
from sweeps.storage import budget_used, mask_url, normalize_url, retried_numbers


def fmt_params(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in params.items())


def summarize(study: optuna.Study, settings: SweepSettings) -> str:
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    counts = {s: sum(1 for t in trials if t.state == s) for s in TrialState}
    lost = len(retried)
    lines = [
        f"study '{study.study_name}' ({mask_url(settings.storage)}): "
        + ", ".join(f"{counts[s]} {s.name.lower()}" for s in
                    (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING))
        + (f" ({lost} failed trial(s) retried)" if lost else "")
        + f"; budget {budget_used(trials)}/{settings.n_trials}"
    ]
    names = [o.metric for o in settings.objectives]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if not complete:
        lines.append("no completed trial yet")
    elif len(names) == 1:
        best = study.best_trial
        lines.append(f"best trial {best.number}: {names[0]}={best.value:.6g}  {fmt_params(best.params)}  "
                     f"mlflow_run_id={best.user_attrs.get('mlflow_run_id')}")
    else:
        front = sorted(study.best_trials, key=lambda t: t.values[0])
        lines.append(f"Pareto front ({len(front)} trial(s); "
                     + ", ".join(f"{o.direction[:3]} {o.metric}" for o in settings.objectives) + "):")
        for t in front:
            vals = " ".join(f"{n}={v:.6g}" for n, v in zip(names, t.values))
            lines.append(f"  trial {t.number}: {vals}  {fmt_params(t.params)}  "
                         f"mlflow_run_id={t.user_attrs.get('mlflow_run_id')}")
    url = normalize_url(settings.storage)  # the driver SQLAlchemy can load here (postgresql+psycopg2://...)
    lines.append(f"dashboard: optuna-dashboard {mask_url(url)}    runs: mlflow ui (experiment "
                 f"'{study.user_attrs.get('mlflow_experiment')}')")
    return "\n".join(lines)
