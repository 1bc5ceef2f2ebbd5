"""Optuna storage for sweeps: RDB storage with heartbeats, a cross-worker trial-budget lock, stale-trial retries.

* ``sqlite:///optuna.db`` (default, beside MLflow's ``mlflow.db``) or ``postgresql://user@host/db`` (any number
  of workers on any number of machines) or any other SQLAlchemy URL Optuna's ``RDBStorage`` accepts.
* Heartbeats: a running trial records a heartbeat every ``heartbeat_interval`` seconds; a trial whose worker
  died (no heartbeat for ``grace_period`` seconds) is marked FAIL by the next worker that looks, and re-queued
  once (``RetryHeartbeatStaleTrialCallback(max_retry)``) with the same parameters.
* Budget lock: creating a trial (count finished + running + queued trials, then ``ask``) happens under a lock
  shared by all workers of a study (a PostgreSQL/MySQL advisory lock, or an ``flock`` on ``<db>.lock`` beside a
  SQLite file), so ``sweep.n_trials`` is an exact total, never overshot by racing workers.
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import ArgumentError, IntegrityError, ProgrammingError, SQLAlchemyError

from ablations.errors import one_line
from modules.errors import AblationsError

log = logging.getLogger("sweeps")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

try:  # Optuna >= 4.9
    from optuna.storages import RetryHeartbeatStaleTrialCallback as _RetryCallback
except ImportError:  # pragma: no cover - older Optuna
    from optuna.storages import RetryFailedTrialCallback as _RetryCallback


class StorageError(AblationsError, RuntimeError):
    """The storage URL is malformed or the database cannot be reached."""


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to print and to tag runs with)."""
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        if u.password:
            return u.render_as_string(hide_password=True)
        return url
    except ArgumentError:  # not a URL SQLAlchemy can parse: nothing to mask
        return url


def backend_of(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).get_backend_name()


def normalize_url(url: str) -> str:
    """``postgresql://`` means psycopg (v3) in SQLAlchemy 2.1 but psycopg2 in 2.0: pick the driver installed."""
    import importlib.util

    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.drivername == "postgresql":
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return u.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    return url


def check_url(url: str):
    """Parse ``url`` (an SQLAlchemy URL) or raise :class:`StorageError` with one line."""
    if not isinstance(url, str) or not url.strip():
        raise StorageError("sweep.storage is empty: give an SQLAlchemy URL such as sqlite:///optuna.db")
    try:
        from sqlalchemy.engine import make_url

        return make_url(url)
    except ArgumentError as e:
        raise StorageError(f"bad storage URL {url!r}: {one_line(e)} "
                           "(expected e.g. sqlite:///optuna.db or postgresql://user:pass@host:5432/db)") from None


def make_storage(
    url: str,
    heartbeat_interval: int | None = 60,
    grace_period: int | None = 180,
    max_retry: int | None = 1,
    on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> RDBStorage:
    """Open (creating tables if needed) the RDB storage at ``url``; raise :class:`StorageError` with one line."""
    u = check_url(url)
    backend = u.get_backend_name()
    shown = mask_url(url)
    url = normalize_url(url)
    engine_kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        db = u.database
        if db and db != ":memory:":
            parent = Path(db).expanduser().resolve().parent
            if not parent.is_dir():
                raise StorageError(f"bad storage URL {shown}: directory {parent} does not exist")
        # Several local workers on one SQLite file: wait for the write lock instead of failing at once.
        engine_kwargs["connect_args"] = {"timeout": 120}
    else:
        engine_kwargs["pool_pre_ping"] = True  # long trials: reconnect when the server dropped an idle connection
        if backend == "postgresql":
            engine_kwargs["connect_args"] = {"connect_timeout": 10}
    retry = None
    if heartbeat_interval:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            retry = _RetryCallback(max_retry=max_retry)
    callback = retry
    if on_stale is not None and retry is not None:
        def callback(study: optuna.Study, trial: FrozenTrial) -> None:  # noqa: F811
            on_stale(study, trial)
            retry(study, trial)
    kwargs: dict[str, Any] = {}
    if heartbeat_interval:
        kwargs = dict(heartbeat_interval=int(heartbeat_interval), grace_period=grace_period and int(grace_period))
        kwargs["heartbeat_stale_trial_callback"] = callback
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)
        except (SQLAlchemyError, ImportError, ValueError) as e:  # unreachable, bad credentials, no driver
            # Two workers creating Optuna's tables in a fresh database at once: the loser retries.
            race = isinstance(e, (IntegrityError, ProgrammingError)) and attempt < 2
            if not race:
                raise StorageError(f"cannot open Optuna storage {shown}: {one_line(e)}") from None
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")


class BudgetLock:
    """A lock shared by every worker of one study (see module docstring). Re-entrant per process: no."""

    def __init__(self, url: str, study_name: str):
        from sqlalchemy.engine import make_url

        self.url = url
        self.study_name = study_name
        u = make_url(url)
        self.backend = u.get_backend_name()
        digest = hashlib.sha1(f"sweeps:{study_name}".encode()).digest()
        self._key = int.from_bytes(digest[:8], "big", signed=True)
        self._lock_path: Path | None = None
        self._engine = None
        if self.backend == "sqlite":
            if u.database and u.database != ":memory:":
                self._lock_path = Path(u.database).expanduser().resolve().with_name(Path(u.database).name + ".lock")
        elif self.backend in ("postgresql", "mysql", "mariadb"):
            import sqlalchemy
            from sqlalchemy.pool import NullPool

            self._engine = sqlalchemy.create_engine(normalize_url(url), poolclass=NullPool)
        self.warning = None if (self._lock_path or self._engine or self.backend == "sqlite") else (
            f"no cross-worker lock for {self.backend} storage: with several workers the study may overshoot "
            f"sweep.n_trials by up to one trial per extra worker")
        self._thread_lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._thread_lock:
            if self._lock_path is not None:
                if not self._lock_path.parent.is_dir():
                    raise StorageError(f"bad storage URL {mask_url(self.url)}: directory {self._lock_path.parent} "
                                       f"does not exist")
                with open(self._lock_path, "a+") as f:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                    try:
                        yield
                    finally:
                        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            elif self._engine is not None:
                import sqlalchemy

                try:
                    conn_cm = self._engine.connect()
                except SQLAlchemyError as e:
                    raise StorageError(f"cannot open Optuna storage {mask_url(self.url)}: "
                                       f"{one_line(e)}") from None
                with conn_cm as conn:
                    if self.backend == "postgresql":
                        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
                        conn.commit()
                        try:
                            yield
                        finally:
                            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                            conn.commit()
                    else:
                        name = f"sweeps:{self._key}"
                        conn.execute(sqlalchemy.text("SELECT GET_LOCK(:n, -1)"), {"n": name})
                        try:
                            yield
                        finally:
                            conn.execute(sqlalchemy.text("SELECT RELEASE_LOCK(:n)"), {"n": name})
            else:
                yield

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of (stale, FAIL) trials that were re-queued as a new trial."""
    out: set[int] = set()
    for t in trials:
        out.update(int(n) for n in t.system_attrs.get("retry_history", []) or [])
    return out


def budget_used(trials: list[FrozenTrial]) -> int:
    """Trials that count against ``n_trials``: every trial except those replaced by a retry."""
    return len(trials) - len(retried_numbers(trials) & {t.number for t in trials})


def storage_of(study: optuna.Study):
    """The study's storage itself: Optuna wraps an RDBStorage in a _CachedStorage (its ``_backend``)."""
    return getattr(study._storage, "_backend", study._storage)


def retry_callback(storage) -> Callable[[optuna.Study, FrozenTrial], None] | None:
    """What re-queues a FAIL trial with its params: the storage's stale-trial callback (the sweep's on_stale, then
    Optuna's retry, up to sweep.max_retry times; make_storage), None where heartbeats are off. `storage`: the
    RDBStorage itself (`storage_of`)."""
    if hasattr(storage, "get_heartbeat_stale_trial_callback"):
        return storage.get_heartbeat_stale_trial_callback()
    return storage.failed_trial_callback


def fail_stale_trials(study: optuna.Study, reason: str) -> list[int]:
    """Mark RUNNING trials whose heartbeat is stale as FAIL (with user attr ``fail_reason``), then run the
    storage's stale-trial callback (retry) for each. Returns their numbers. Safe to call from many workers."""
    storage = storage_of(study)
    get_ids = getattr(storage, "_get_stale_trial_ids", None)
    if not isinstance(storage, RDBStorage) or storage.heartbeat_interval is None or get_ids is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        return []
    failed: list[int] = []
    for trial_id in get_ids(study._study_id):
        try:
            storage.set_trial_user_attr(trial_id, "fail_reason", reason)
            if storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                failed.append(trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker got there first, or the trial just finished
    callback = retry_callback(storage)
    numbers = []
    for trial_id in failed:
        frozen = copy.deepcopy(storage.get_trial(trial_id))
        numbers.append(frozen.number)
        if callback is not None:
            callback(study, frozen)
    return numbers


class Heartbeat:
    """Record a trial's heartbeat now and then every ``interval`` seconds until stopped (a daemon thread)."""

    def __init__(self, storage: RDBStorage, trial_id: int):
        self.storage = storage
        self.trial_id = trial_id
        self.interval = storage.heartbeat_interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Heartbeat":
        if self.interval:
            self.storage.record_heartbeat(self.trial_id)
            self._thread = threading.Thread(target=self._run, name=f"optuna-heartbeat-{self.trial_id}", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except SQLAlchemyError as e:  # a transient DB error must not kill the trial; the next beat retries
                log.warning("heartbeat for trial id %s failed: %s", self.trial_id, one_line(e))

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
