"""MLflow plumbing: tracking URI, reachability check, run names/tags from Hydra, params, git state.

Only :class:`mlflow.MlflowClient` is used (no fluent global state), so several trainings can share a process.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError, TrackingError, one_line

DEFAULT_URI = "sqlite:///mlflow.db"
CHOICE_GROUPS = ("model", "position", "norm", "mlp", "attention", "tokenizer", "data")
# overrides that say where/how a job runs, not what it is: left out of `variant`
INFRA_PREFIXES = ("tracking.", "hydra.", "checkpoint.", "progress_every_n_steps", "trainer.devices", "trainer.accelerator", "trainer.strategy",
                  "trainer.num_nodes", "trainer.enable_progress_bar", "data.cache_dir", "data.path", "resume",
                  "experiment", "compile", "generate.")
NAME_SKIP_PREFIXES = ("tracking.", "hydra.", "resume", "experiment", "data.cache_dir", "data.path", "checkpoint.dir")


def tracking_uri(cfg: DictConfig | None = None) -> str:
    """`tracking.uri` when set (the command line wins), else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db."""
    uri = cfg.get("tracking", {}).get("uri") if cfg is not None else None
    return str(uri) if uri else os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite URI (`~` expanded), or None: another scheme, an in-memory or empty path."""
    if not urlparse(uri).scheme.lower().startswith("sqlite") or ":///" not in uri:
        return None
    path = uri.split(":///", 1)[1]
    return Path(path).expanduser() if path and path != ":memory:" else None


def check_reachable(uri: str, timeout: float = 10.0) -> None:
    """Fail fast (before any training) when the tracking store cannot be used."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        check_server(uri, timeout)
    elif scheme.startswith("sqlite"):
        db = _sqlite_file(uri)
        if db is not None:
            parent = db.resolve().parent
            if not parent.is_dir():
                raise TrackingError(f"tracking.uri={uri}: directory {parent} does not exist: create it or use "
                                    f"tracking.uri=sqlite:///mlflow.db")
            if not os.access(parent, os.W_OK):
                raise TrackingError(f"tracking.uri={uri}: directory {parent} is not writable: use another path")
    elif scheme in ("", "file"):
        path = Path(parsed.path if scheme == "file" else uri).expanduser()
        if not (path.is_dir() or path.parent.is_dir()):
            raise TrackingError(f"tracking.uri={uri}: {path.parent} does not exist: create it or use "
                                f"tracking.uri=sqlite:///mlflow.db")
    elif scheme.startswith(("postgresql", "mysql", "mssql")):
        pass  # the first client call below reports connection errors
    else:
        raise TrackingError(f"tracking.uri={uri}: unsupported scheme {scheme!r}: use sqlite:///FILE, http(s)://HOST "
                            f"or a database URI")


def check_server(uri: str, timeout: float = 10.0) -> None:
    """An MLflow server that answers: its /health, then one real API call (a server in front of a dead database
    still says OK on /health, and each API call may then take minutes to fail). Each is one request with a
    `timeout`, not MLflow's retry cycle (7 retries with backoff: minutes of silence before any message)."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:  # noqa: S310 - user's server
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except http.client.HTTPException as e:  # a listener that does not speak HTTP (ssh, a database port, ...)
        raise TrackingError(f"tracking.uri={uri} is not an HTTP server (it answered {one_line(e, 80)} on /health): "
                            f"give an MLflow server's host and port, or set tracking.uri=sqlite:///mlflow.db") from None
    except (urllib.error.URLError, OSError) as e:  # refused, unknown host, TLS, timed out
        raise TrackingError(f"tracking.uri={uri} is unreachable ({getattr(e, 'reason', e)}): start the server or set "
                            f"tracking.uri=sqlite:///mlflow.db (or unset MLFLOW_TRACKING_URI)") from None
    if status >= 400:
        raise TrackingError(f"tracking.uri={uri} answered HTTP {status} on /health: check the server "
                            f"(mlflow server ...) or set tracking.uri=sqlite:///mlflow.db")
    probe_api(uri, timeout)


def probe_api(uri: str, timeout: float) -> None:
    """One `experiments/search` (max_results=1) with the client's own credentials and TLS settings, no retries."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    what = f"tracking.uri={uri} answers /health but not its API"
    fix = "check the server's log and its backend store (the database behind mlflow server)"
    try:
        r = http_request(get_default_host_creds(uri), "/api/2.0/mlflow/experiments/search", "GET", max_retries=0,
                         backoff_factor=0, timeout=timeout, raise_on_status=False, params={"max_results": 1})
    except MlflowException as e:  # timed out, connection dropped
        timed_out = "timeout" in str(e).lower() or "timed out" in str(e).lower()
        reason = f"no answer to experiments/search within {timeout:g} s" if timed_out else one_line(e, 160)
        raise TrackingError(f"{what} ({reason}): {fix}") from None
    if r.status_code != 200:
        detail = " ".join(r.text.split())[:160]
        raise TrackingError(f"{what} (HTTP {r.status_code} on experiments/search: {detail}): {fix}")


def client(uri: str):
    """An MlflowClient for `uri`; a SQLite store is opened under a lock (`_sqlite_open_lock`), a new one made from
    the migrated template (`_new_sqlite_store`)."""
    from mlflow import MlflowClient

    with _sqlite_open_lock(uri):
        _new_sqlite_store(uri)
        return MlflowClient(tracking_uri=uri)  # making the client opens (and on first use migrates) the store


def _new_sqlite_store(uri: str) -> None:
    """A SQLite store that does not exist yet starts as a copy of an empty store this MLflow version migrated once
    (`_sqlite_template`): MLflow otherwise runs its whole chain of schema migrations for every new store, ~1 s of CPU
    each time (each study, sweep worker, test). The template holds no Default experiment, so MLflow, finding the
    tables but not it, creates it as on any new store (its artifact location below the cwd, its time now)."""
    db = _sqlite_file(uri)
    if db is None or not db.parent.is_dir() or db.exists() and db.stat().st_size > 0:
        return
    from .sources import atomic_write_bytes

    # whole or not at all (a copy beside it, renamed over it), under the open lock: no other process of ours opens
    # `db` meanwhile
    atomic_write_bytes(db, _sqlite_template().read_bytes())


def _sqlite_template() -> Path:
    """`<cache>/mlflow/empty-<version>.db`: an MLflow store migrated to this version's schema, its Default experiment
    deleted; made once per version and cache (a temporary file renamed into place, so concurrent makers are safe)."""
    import sqlite3

    import mlflow
    from mlflow import MlflowClient

    from .sources import default_cache_dir, temp_beside

    path = default_cache_dir() / "mlflow" / f"empty-{mlflow.__version__}.db"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = temp_beside(path)
    os.close(fd)
    try:
        MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments()  # creates and migrates it
        with contextlib.closing(sqlite3.connect(tmp)) as con, con:
            con.execute("DELETE FROM experiments WHERE experiment_id = 0")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


@contextlib.contextmanager
def _sqlite_open_lock(uri: str):
    """MLflow creates a new SQLite store's schema by running its migrations when the client is made, without a
    lock: two processes opening one new store at once (the workers of a sweep, two streams of a study) both
    migrate, and all but one die with 'duplicate column name'. Held here: an exclusive lock on DB.lock beside the
    database (nothing for other stores)."""
    import fcntl

    db = _sqlite_file(uri)
    if db is None or not db.parent.is_dir():
        yield  # nothing on disk to share (check_reachable reports a missing directory in one line)
        return
    with open(db.with_name(db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_server(uri: str) -> bool:
    """An MLflow tracking server (http/https): runs on other machines share it, local files they do not."""
    return urlparse(uri).scheme.lower() in ("http", "https")


def logs_checkpoints(mode, uri: str) -> bool:
    """`tracking.log_checkpoints`: true / false, or auto = true against a tracking server (the resumable checkpoint
    becomes the run's artifact `checkpoints/last.ckpt`, so `resume=auto` on another machine finds it)."""
    if mode in (None, "auto"):
        return is_server(uri)
    if isinstance(mode, bool):
        return mode
    raise TrackingError(f"tracking.log_checkpoints={mode!r}: use auto, true or false")


RUN_NAME_MAX = 250  # MLflow's runs.name column (VARCHAR(250): PostgreSQL/MySQL refuse longer, SQLite does not)


def fit_run_name(name: str) -> str:
    return name if len(name) <= RUN_NAME_MAX else name[:RUN_NAME_MAX - 3] + "..."


def logged_through(cl, run_id: str) -> dict[str, int]:
    """metric key -> the highest step the run has logged. MLflow cannot delete metric points, so a resumed run
    logs only later steps (see `drop_logged`): each step of its history once."""
    keys = cl.get_run(run_id).data.metrics
    return {k: max((m.step for m in cl.get_metric_history(run_id, k)), default=-1) for k in keys}


def drop_logged(metrics: list, through: dict[str, int]) -> list:
    """The mlflow.entities.Metric points of `metrics` past the steps `through` already holds."""
    return [m for m in metrics if m.step > through.get(m.key, -1)]


def get_or_create_experiment(cl, uri: str, name: str) -> str:
    exp = cl.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            cl.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:///"):  # keep artifacts beside the database, whatever the working directory
        db = Path(uri.split(":///", 1)[1]).expanduser().resolve()
        artifact_location = (db.parent / "mlartifacts").as_uri()
    from mlflow.exceptions import MlflowException

    try:
        return cl.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # created concurrently by another worker
        exp = cl.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(d, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, key))
            else:
                out[key] = json.dumps(v) if isinstance(v, (list, dict)) else str(v)
    return out


def config_params(cfg: DictConfig) -> dict[str, str]:
    c = OmegaConf.to_container(cfg, resolve=True)
    c.pop("hydra", None)
    c.pop("resume", None)  # a resumed run logs the same params as the run it continues
    return {k: v[:6000] for k, v in flatten(c).items()}


def log_params(cl, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    existing = cl.get_run(run_id).data.params
    items = [Param(k, v) for k, v in params.items() if k not in existing]
    for i in range(0, len(items), 100):
        cl.log_batch(run_id, params=items[i:i + 100])


def git_state() -> dict[str, str]:
    root = Path(__file__).resolve().parents[1]

    def git(*args):
        try:
            r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
            return r.stdout.strip() if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    out = {"git_commit": commit or "unknown", "git_dirty": "unknown" if status is None else str(bool(status)).lower()}
    # which uncommitted changes: two dirty runs with the same git_diff_hash ran the same code
    diff = git("diff", "HEAD", "--no-color", "--no-ext-diff") if status else ""
    out["git_diff_hash"] = "unknown" if diff is None else (
        hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else "clean")
    return out


def _override_key(o: str) -> str:
    return o.split("=", 1)[0].lstrip("+~")


def hydra_info(cfg: DictConfig) -> tuple[str | None, dict[str, str]]:
    """Run name and tags from Hydra (the CLI's HydraConfig, or a compose(..., return_hydra_config=True) config)."""
    overrides, choices, group = None, {}, None
    if "hydra" in cfg:  # composed with return_hydra_config=True (e.g. a sweep trial): this config's own record
        h = cfg.hydra
        overrides = list(OmegaConf.select(h, "overrides.task", default=[]) or [])
        choices = dict(OmegaConf.select(h, "runtime.choices", default={}) or {})
    else:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():  # else: no Hydra context (a caller composed the config itself)
            hc = HydraConfig.get()
            overrides = list(hc.overrides.task)
            choices = dict(hc.runtime.choices)
            if hc.mode == RunMode.MULTIRUN:
                sweep_dir = str(Path(hc.sweep.dir).resolve())
                group = (f"{Path(hc.sweep.dir).as_posix().replace('/', '_')}-"
                         f"{hashlib.sha1(sweep_dir.encode()).hexdigest()[:8]}")
    tags: dict[str, str] = {}
    for g in CHOICE_GROUPS:
        # the family groups carry their own name: exact even when the caller composed the config itself
        v = OmegaConf.select(cfg, f"{g}.name", default=None) if g != "model" else None
        v = v if v is not None else choices.get(g)
        if v is not None:
            tags[f"choice.{g}"] = str(v)
    if group:
        tags["multirun_group"] = group
    name = None
    if overrides is not None:
        named = [o for o in overrides if not _override_key(o).startswith(NAME_SKIP_PREFIXES)]
        name = " ".join(named) or "default"
        variant = [o for o in named if _override_key(o) != "seed" and not _override_key(o).startswith(INFRA_PREFIXES)]
        tags["variant"] = " ".join(variant) or "baseline"
    return name, tags


# ----------------------------------------------------------------------------------------------------------------
# bounded calls: a store that stops answering ends the run within a stated time, not MLflow's retry cycle
# (MLFLOW_HTTP_REQUEST_MAX_RETRIES=7 with backoff 2: ~4 min per call, plus up to 120 s per request that hangs)

DEFAULT_MAX_OUTAGE_S = 300.0
END_TIMEOUT_S = 30.0  # terminate(): the tags and the status of a run that ends, all together


def max_outage_s(tracking_cfg) -> float:
    """`tracking.max_outage_s`, checked: how long a run waits for a store that stopped answering."""
    v = tracking_cfg.get("max_outage_s", DEFAULT_MAX_OUTAGE_S)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise ConfigError(f"tracking.max_outage_s={v!r} must be a positive number of seconds, e.g. 300")
    return float(v)


def call_within(seconds: float, fn, *args, **kwargs):
    """fn(*args, **kwargs), or TimeoutError when it has not returned within `seconds`. It runs in a daemon thread:
    an HTTP request in MLflow's retries cannot be cancelled, so one that outlives the bound is left to end (or to
    die with the process) on its own."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name="ablations-tracking-call")
    t.start()
    t.join(max(0.0, seconds))
    if t.is_alive():
        raise TimeoutError(f"no answer within {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def transient(e: Exception) -> bool:
    """A failure that may pass (the server down, restarting, overloaded; SQLite locked): worth retrying. A
    refusal (bad request, unknown run, no permission) is not."""
    from mlflow.exceptions import MlflowException

    return isinstance(e, TimeoutError) or (isinstance(e, MlflowException) and
                                           (e.get_http_status_code() >= 500 or e.get_http_status_code() == 429))


class OutageBound:
    """The tracking calls a training run makes (metrics, checkpoint uploads), through `call`: a store that stops
    answering is retried until `max_outage_s` after the first call it left unanswered, then the run ends with one
    TrackingError line. A refusal is raised at once, as MLflow raised it."""

    def __init__(self, uri: str, max_outage_s: float = DEFAULT_MAX_OUTAGE_S, pause_s: float = 2.0):
        self.uri, self.max_outage_s, self.pause_s = uri, float(max_outage_s), float(pause_s)
        self.down_since: float | None = None  # time.monotonic() at the start of the first failed call

    def call(self, fn, *args, **kwargs):
        start = time.monotonic()
        deadline = (self.down_since or start) + self.max_outage_s
        while True:
            try:
                out = call_within(deadline - time.monotonic(), fn, *args, **kwargs)
                self.down_since = None
                return out
            except Exception as e:  # noqa: BLE001 - sorted by transient(); the rest re-raised as they came
                if not transient(e):
                    raise
                self.down_since = self.down_since or start
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TrackingError(
                        f"tracking.uri={self.uri}: no answer for {time.monotonic() - self.down_since:.0f} s "
                        f"(tracking.max_outage_s={self.max_outage_s:g}; {one_line(e, 160)}): the run's checkpoint "
                        f"is kept; when the store is back, continue with resume=auto") from None
                time.sleep(min(self.pause_s, left))


def terminate(cl, run_id: str, status: str, reason: str | None = None, extra_tags: dict | None = None,
              timeout: float = END_TIMEOUT_S) -> None:
    """End a run (never leave it RUNNING while its store answers): the tags, then the status, retried (SQLite may
    be locked by another worker, a server may be restarting) for `timeout` seconds in all. A store that does not
    answer in time: TrackingError, and the run stays as the store last had it (RUNNING)."""
    deadline = time.monotonic() + timeout
    stop_system_metrics(run_id, timeout=min(10.0, timeout / 4))  # its last samples go in while still RUNNING
    tags = {**({"failure_reason": reason[:5000]} if reason else {}), **(extra_tags or {})}

    def end():
        for k, v in tags.items():
            cl.set_tag(run_id, k, v)
        cl.set_terminated(run_id, status=status)

    bound = OutageBound(cl.tracking_uri, max_outage_s=max(0.0, deadline - time.monotonic()), pause_s=0.5)
    try:
        bound.call(end)
    except TrackingError:
        raise TrackingError(f"tracking.uri={cl.tracking_uri}: could not mark run {run_id} {status} within "
                            f"{timeout:g} s (the store did not answer): it stays RUNNING; resume=auto continues "
                            f"it") from None


def get_run(cl, run_id: str, uri: str):
    """The MLflow run `run_id`, or a one-line TrackingError that names the id and the store searched."""
    from mlflow.exceptions import MlflowException

    try:
        return cl.get_run(run_id)
    except MlflowException:  # a bad or unknown id
        raise TrackingError(f"run_id={run_id} not found in {uri}: check the id, or pass tracking.uri=") from None


# ----------------------------------------------------------------------------------------------------------------
# system metrics (CPU, memory, disk, network; GPU utilisation and memory where nvidia-ml-py finds a GPU)

_MONITORS: dict = {}  # run_id -> the SystemMetricsMonitor logging into it (this process only)


def start_system_metrics(tracking_cfg, uri: str, run_id: str) -> None:
    """Log MLflow's system metrics (`system/cpu_utilization_percentage`, `system/system_memory_usage_megabytes`,
    `system/gpu_0_utilization_percentage`, ...) into the run every `tracking.system_metrics_interval` seconds,
    unless `tracking.system_metrics=false`. MLflow's own switch (`log_system_metrics`) only covers fluent
    `start_run`; the harness creates its runs with MlflowClient, so the monitor is started here for the run id."""
    if not tracking_cfg.get("system_metrics", True) or run_id in _MONITORS:
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    interval = float(tracking_cfg.get("system_metrics_interval") or 10)
    # resume_logging: a resumed run continues its system/ steps instead of overwriting step 0..
    mon = SystemMetricsMonitor(run_id, sampling_interval=interval, resume_logging=True, tracking_uri=uri)
    mon.start()
    _MONITORS[run_id] = mon


def stop_system_metrics(run_id: str, timeout: float = 10.0) -> None:
    """Stop the run's monitor (if any) and log one last sample covering the time since its last one: MLflow's
    loop drops an unfinished interval, so a run shorter than one interval would otherwise get no system metrics.
    Within `timeout` seconds: a monitor stuck in MLflow's retries (the store down) is left behind, unlogged."""
    mon = _MONITORS.pop(run_id, None)
    if mon is None or mon._process is None:
        return
    import logging

    from mlflow.exceptions import MlflowException

    deadline = time.monotonic() + timeout
    thread = mon._process
    mon._shutdown_event.set()
    thread.join(timeout)
    for m in mon.monitors:  # psutil's CPU percentage is since the previous call: the unfinished interval
        m.clear_metrics()
    mon.collect_metrics()

    def publish():
        mon.publish_metrics(mon.aggregate_metrics())
        mon.mlflow_logger.flush()

    try:
        if thread.is_alive():
            raise TimeoutError(f"its monitor did not stop within {timeout:g} s")
        call_within(deadline - time.monotonic(), publish)
    except (MlflowException, TimeoutError) as e:  # the store went away: the training result stands without them
        logging.getLogger("ablations").warning("could not log system metrics of run %s: %s", run_id,
                                               one_line(e, 200))
    mon._process = None
