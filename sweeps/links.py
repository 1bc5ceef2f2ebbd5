"""The MLflow side of a sweep: the tracking store checked before any trial, a trial's run found by its tags, its
page in the MLflow UI, and its final Optuna state written back as tags."""
from __future__ import annotations

import logging
import sys
from typing import Mapping

from mlflow.exceptions import MlflowException

from ablations.errors import one_line
from ablations.tracking import check_reachable, client, get_or_create_experiment
from modules.errors import AblationsError
from sweeps.errors import SweepError
from sweeps.storage import mask_url

log = logging.getLogger("sweeps")


class MlflowLinks:
    """Small MLflow client wrapper: find a trial's run by tags and tag its final Optuna state."""

    def __init__(self, uri: str, experiment: str | None):
        self.uri = uri
        self.experiment = experiment
        self._client = None

    @property
    def client(self):
        if self._client is None:
            self._client = client(self.uri)
        return self._client

    def check(self) -> None:
        """Fail fast (one line) when the tracking store cannot be used; creates its tables on first use."""
        try:
            check_reachable(self.uri)
        except AblationsError as e:  # ablations' TrackingError
            raise SweepError(str(e)) from None
        try:
            self.client.search_experiments(max_results=1)
            if self.experiment and self.client.get_experiment_by_name(self.experiment) is None:
                get_or_create_experiment(self.client, self.uri, self.experiment)
        except MlflowException as e:
            raise SweepError(f"MLflow tracking store {mask_url(self.uri)} cannot be used: {one_line(e)}") from None

    def find_run(self, study_name: str, number: int) -> str | None:
        try:
            exp = self.client.get_experiment_by_name(self.experiment) if self.experiment else None
            ids = [exp.experiment_id] if exp is not None else [e.experiment_id for e in self.client.search_experiments()]
            runs = self.client.search_runs(
                ids, filter_string=f"tags.`optuna.study` = '{study_name}' and tags.`optuna.trial` = '{number}'",
                order_by=["attributes.start_time DESC"], max_results=1)
            return runs[0].info.run_id if runs else None
        except MlflowException as e:
            log.debug("MLflow lookup failed: %s", e)
            return None

    def run_url(self, run_id: str) -> str | None:
        """The run's page in the MLflow UI, when tracking goes to an MLflow server (http/https)."""
        if not self.uri.startswith(("http://", "https://")):
            return None
        try:
            exp_id = self.client.get_run(run_id).info.experiment_id
            return f"{self.uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run_id}"
        except MlflowException:
            return None

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        try:
            for k, v in tags.items():
                self.client.set_tag(run_id, k, v)
        except MlflowException as e:
            print(f"warning: could not tag MLflow run {run_id}: {type(e).__name__}: {e}", file=sys.stderr)

    def kill_if_running(self, run_id: str, reason: str) -> None:
        try:
            run = self.client.get_run(run_id)
            if run.info.status == "RUNNING":
                self.client.set_tag(run_id, "failure_reason", reason)
                self.client.set_terminated(run_id, status="KILLED")
        except MlflowException as e:
            log.debug("could not end MLflow run %s: %s", run_id, e)
