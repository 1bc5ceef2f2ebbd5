"""The commands against a real MLflow tracking server: `mlflow server` on 127.0.0.1 with a PostgreSQL backend store
(a fresh database on the tests' PostgreSQL, see tests/sweeps_testing.py) and proxied artifacts in a temporary folder
(`--artifacts-destination`), as docs/cluster.md starts it.

- one server outage (stopped mid-run and started again) met by two runs: a run killed like kill -9 that continues
  on "another machine" (an empty working directory, so no local checkpoint: `resume=auto` fetches the checkpoint
  the run logged as an artifact, reopens the same run) rides it out and logs each step once (MLflow's client
  retries), and `ablations.evaluate` then scores it from a third empty directory; a run with a short
  `tracking.max_outage_s` ends with one line, its checkpoint kept, left RUNNING, and `resume=auto` finishes the same
  run (the fast fakes of the same faults: tests/test_tracking_faults.py);
- two sweep workers on one study through Hydra's submitit launcher (`python -m sweeps.submit 2
  hydra/launcher=submitit_local`), one SIGKILLed mid-trial: its MLflow run ends KILLED (Optuna's heartbeat), the
  trial is retried, the study completes; `analysis.report` reads the server;
- `python -m ablations.run -m hydra/launcher=submitit_local norm=layernorm,rmsnorm`: two FINISHED runs, one per job.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import psutil
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from sweeps.storage import normalize_url
from sweeps_testing import ci, fresh_database, wait_for, worker_env
import warm_python

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
# MLflow's client retries a failed request with backoff factor * 2^n seconds (0, 2, 6, 14, 30, 62 s cumulative at
# factor 1; the default 2 doubles that): the window a server outage must fit in (docs/cluster.md)
RETRY_ENV = {"MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "7"}


class Server:
    """`mlflow server` in its own process group; stop() and start() again on the same port, store and artifacts."""

    def __init__(self, backend: str, root: Path):
        from pgtest import free_port

        self.backend, self.root, self.port = backend, root, free_port()
        self.proc: subprocess.Popen | None = None
        self.starts, self.served = 0, False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180) -> None:
        """Start the server and wait until /health answers. Its port was free when picked, but another process (an
        outgoing connection's ephemeral port, a server of the other test worker) can take it before mlflow binds:
        then the server exits at once ("address already in use") and, at a first start, a new port is picked, at a
        restart (which must keep its URL) the same one is tried again after a pause. Any other exit fails at once
        with the server's log, not after the timeout."""
        for attempt in range(4):
            self._spawn()
            log = self._wait_healthy(timeout)
            if log is None:
                self.served = True
                return
            if "address already in use" not in log or attempt == 3:
                raise AssertionError(f"mlflow server exited on port {self.port}:\n{log[-2000:]}")
            if not self.served:  # no client knows this URL yet
                from pgtest import free_port

                self.port = free_port()
            else:
                time.sleep(2)

    def _spawn(self) -> None:
        exe = Path(sys.executable).with_name("mlflow")
        self.starts += 1
        log = open(self.root / f"server-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [str(exe), "server", "--backend-store-uri", self.backend, "--artifacts-destination",
             str(self.root / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # MLflow 3's server otherwise starts ~7 job-queue (huey) processes, ~4.6 s of CPU each, for GenAI jobs
            # the harness never submits (docs/cluster.md)
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})

    def _wait_healthy(self, timeout: float) -> str | None:
        """None once /health answers; the server's log if it exited first; TimeoutError after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return (self.root / f"server-{self.starts}.log").read_text()
            if self.healthy():
                return None
            time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout}s waiting for mlflow server on port {self.port}")

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:  # noqa: S310 - local test server
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory, pg_server):
    """`mlflow server` on a fresh database of the session's PostgreSQL server (tests/conftest.py)."""
    from pgtest import create_database

    try:
        backend = create_database(pg_server, f"mlflow_test_{uuid.uuid4().hex[:10]}")
    except Exception as e:  # noqa: BLE001 - a server that is down: fail in CI, else skip
        msg = f"PostgreSQL is required for the tracking-server tests: {type(e).__name__}: {e}"
        if ci():
            pytest.fail(msg)
        pytest.skip(msg)
    srv = Server(backend, tmp_path_factory.mktemp("mlflow-server"))
    srv.start()
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


def test_a_port_taken_before_the_server_binds_it_is_replaced_at_once(tmp_path):
    """The port picked as free is taken by another process before mlflow binds it (CI lost a run to this: the
    server exited and the wait ran out its 180 s): a first start moves to another port; a server that exits for
    another reason fails at once with its log."""
    import socket

    srv = Server(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", srv.port))
        taken.listen()
        t0 = time.monotonic()
        srv.start(timeout=60)
        try:
            assert srv.port != taken.getsockname()[1] and srv.starts == 2 and srv.healthy()
        finally:
            srv.stop()
    assert time.monotonic() - t0 < 60
    bad = Server("notascheme://x", tmp_path / "bad")
    (tmp_path / "bad").mkdir()
    with pytest.raises(AssertionError, match="mlflow server exited"):
        bad.start(timeout=60)


def tiny(corpus, **extra) -> list[str]:
    args = {"model": "tiny", "data": "shakespeare", "data.path": str(corpus), "tokenizer": "char",
            "data.batch_size": 8, "data.val_windows": 8, "trainer.max_steps": 20, "trainer.val_check_interval": 10,
            "trainer.log_every_n_steps": 1, "checkpoint.every_n_steps": 5, "trainer.enable_progress_bar": "false",
            "generate.max_new_tokens": 8, "generate.bench_decode_tokens": 4, "generate.bench_prefill_tokens": 16,
            "tracking.peak_flops": "1e12", "tracking.system_metrics": "false", "trainer.precision": "32-true",
            "threads": 1}
    args.update(extra)
    return [f"{k}={v}" for k, v in args.items()]


def env_for(tmp_path: Path) -> dict[str, str]:
    return {**worker_env(tmp_path / "token-cache"), **RETRY_ENV, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


def cli(module: str, args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    """`python -m module args` in `cwd` (its own process group), output to `cwd`/out.log."""
    cwd.mkdir(parents=True, exist_ok=True)
    with open(cwd / "out.log", "w") as log:
        proc = warm_python.popen([sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = cwd / "out.log"
    return proc


def output(p: subprocess.Popen) -> str:
    return p.log.read_text()


def finish(p: subprocess.Popen, timeout: float = 400) -> str:
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise AssertionError(f"timed out after {timeout} s:\n{output(p)[-4000:]}") from None
    return output(p)


def until(predicate, proc: subprocess.Popen, timeout: float, what: str):
    """wait_for, failing at once (with its output) if `proc` exits first."""
    def check():
        if proc.poll() is not None:
            return "exited"
        return predicate()

    value = wait_for(check, timeout=timeout, interval=0.3, what=what)
    assert value != "exited", f"exited with {proc.returncode} before {what}:\n{output(proc)[-4000:]}"
    return value


def only_run(c: MlflowClient, experiment: str):
    exp = c.get_experiment_by_name(experiment)
    return c.search_runs([exp.experiment_id]) if exp else []


def test_one_outage_a_resumed_run_rides_it_out_a_bounded_run_ends_in_one_line(server, tmp_path, shakespeare_path):
    """Two runs meet one server outage (one stop and start of the server, the suite's costliest wait):

    - "resume": killed like kill -9 on machine A, resumed with `resume=auto` on machine B (an empty directory: the
      checkpoint comes from the run's artifacts), B rides out the outage (within the default tracking.max_outage_s)
      and finishes the same run with every logged step once; machine C (empty) evaluates it from the server;
    - "outage" (issue 27 item 8): tracking.max_outage_s=5, so the outage ends it with one line (exit 2, no traceback)
      within the bound plus terminate()'s min(30 s, 5 s), its checkpoint kept, left RUNNING (the server is still
      down when it ends); once the server is back, `resume=auto` continues it to FINISHED, each logged step once.
      The FAILED case (the store back within terminate()'s window) is tests/test_tracking_faults.py's.

    Both runs hold at a known step (tests/faults.py's `hold@`) until the server is stopped, so the outage falls
    inside their training on any machine."""
    env, c = env_for(tmp_path), MlflowClient(server.url)
    fault_env = {**env, "PYTHONPATH": str(REPO)}
    steps, every = 100, 5
    args = tiny(shakespeare_path, **{"tracking.uri": server.url, "tracking.experiment": "resume",
                                     "trainer.max_steps": steps, "trainer.log_every_n_steps": every,
                                     "checkpoint.every_n_steps": 25})
    e_steps, e_every = 60, 2
    e_args = tiny(shakespeare_path, **{"tracking.uri": server.url, "tracking.experiment": "outage",
                                       "trainer.max_steps": e_steps, "trainer.log_every_n_steps": e_every,
                                       "checkpoint.every_n_steps": 10, "tracking.max_outage_s": 5})
    # machine A: dies like kill -9 after step 32 (metrics logged through step 30, its checkpoint of step 25 logged
    # to the run as an artifact); meanwhile the bounded run starts and holds at step 20
    e = cli("tests.fault_run", ["hold@20", *e_args], tmp_path / "E", fault_env)
    a = cli("tests.fault_run", ["kill@32", *args], tmp_path / "A", fault_env)
    out_a = finish(a)
    assert a.returncode == 137, out_a[-3000:]
    (run,) = only_run(c, "resume")
    assert run.info.status == "RUNNING"
    assert "checkpoints/last.ckpt" in {f.path for f in c.list_artifacts(run.info.run_id, "checkpoints")}

    # machine B: an empty directory, resume=auto; it holds at step 40
    b = cli("tests.fault_run", ["hold@40", *args, "resume=auto"], tmp_path / "B", fault_env)
    held = [tmp_path / "B" / "held", tmp_path / "E" / "held"]
    until(lambda: held[1].exists(), e, timeout=240, what="the bounded run to reach step 20")
    until(lambda: held[0].exists(), b, timeout=240, what="the resumed run to reach step 40")
    (e_run,) = only_run(c, "outage")
    assert c.get_run(run.info.run_id).info.status == "RUNNING"
    t_stop = time.monotonic()
    server.stop()
    for f in held:
        f.unlink()  # both train on into the outage

    out_e = finish(e, timeout=180)
    ended = time.monotonic() - t_stop
    time.sleep(max(0.0, 5 - ended))
    server.start()  # a real restart: ~10-20 s more of outage for B on a busy machine
    outage = time.monotonic() - t_stop
    assert e.returncode == 2 and "Traceback" not in out_e, out_e[-4000:]
    (line,) = [ln for ln in out_e.splitlines() if ln.startswith("error: ")]
    assert line.startswith(f"error: tracking.uri={server.url}: no answer for "), line
    assert "(tracking.max_outage_s=5;" in line and "checkpoint is kept" in line and "resume=auto" in line
    assert ended < 5 + 5 + 30, ended  # the bound, terminate()'s min(30 s, max_outage_s), slack for a busy machine
    assert list((tmp_path / "E" / "checkpoints").rglob("last.ckpt"))
    assert c.get_run(e_run.info.run_id).info.status == "RUNNING"
    f = cli("ablations.run", [*e_args, "resume=auto"], tmp_path / "E", env)  # the same machine, its checkpoint

    out_b = finish(b)
    assert b.returncode == 0, out_b[-4000:]
    assert "resumed from step 25 (checkpoint checkpoints/" in out_b and f"of run {run.info.run_id})" in out_b
    (after,) = only_run(c, "resume")
    assert after.info.run_id == run.info.run_id and after.info.status == "FINISHED"
    assert after.data.tags["resumed_from_step"] == "25"
    loss = sorted(c.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: (m.timestamp, m.step))
    # every logged step once, in order: none lost in the outage, step 30 not logged again by the resumed run
    assert [m.step for m in loss] == list(range(every, steps + 1, every))
    gaps = [(y.timestamp - x.timestamp) / 1000 for x, y in zip(loss, loss[1:])]
    assert max(gaps) > 0.7 * outage, (max(gaps), outage)  # the outage fell inside the training, not after it
    for key in ("tokens_seen", "val/loss", "params"):
        hist = [m.step for m in sorted(c.get_metric_history(run.info.run_id, key), key=lambda m: m.timestamp)]
        assert hist == sorted(set(hist)), (key, hist)

    # machine C: evaluate the run from the server's artifacts alone, from an empty directory (in this process,
    # which holds no file of the run either: no third interpreter importing torch, Lightning and MLflow)
    from ablations.evaluate import main as evaluate

    (tmp_path / "C").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for k, v in env.items():
            mp.setenv(k, v)
        mp.chdir(tmp_path / "C")
        assert evaluate([f"run_id={run.info.run_id}", f"tracking.uri={server.url}", "eval.contexts=[32]",
                         "threads=1"]) == 0
    assert [m.step for m in c.get_metric_history(run.info.run_id, "eval/nonoverlap/bpb")] == [32]

    out_f = finish(f)
    assert f.returncode == 0, out_f[-4000:]
    (e_after,) = only_run(c, "outage")
    assert e_after.info.run_id == e_run.info.run_id and e_after.info.status == "FINISHED"
    e_loss = [m.step for m in sorted(c.get_metric_history(e_run.info.run_id, "train/loss"),
                                     key=lambda m: (m.timestamp, m.step))]
    assert e_loss == list(range(e_every, e_steps + 1, e_every))  # none lost in the outage, none logged twice


def _sweep_processes(root: psutil.Process) -> list[psutil.Process]:
    return [p for p in root.children(recursive=True) if "sweeps.run" in " ".join(p.cmdline())]


def test_sweep_workers_as_submitit_jobs_one_killed_then_a_report(server, tmp_path, shakespeare_path, capsys):
    env, c = env_for(tmp_path), MlflowClient(server.url)
    storage = fresh_database(server.backend)  # the study: another database on the same PostgreSQL
    n = 3
    worker_args = ["sweep=lr", f"sweep.storage={storage}", f"sweep.n_trials={n}", "sweep.study_name=ts",
                   "sweep.heartbeat_interval=1", "sweep.grace_period=5", "sweep.enqueue=[]", "sweep.pruner.name=none",
                   *tiny(shakespeare_path, **{"tracking.uri": server.url, "trainer.max_steps": 200,
                                              "trainer.val_check_interval": 200, "trainer.log_every_n_steps": 5,
                                              "checkpoint.every_n_steps": 1000})]
    sub = cli("sweeps.submit", [str(2), "hydra/launcher=submitit_local", "--", *worker_args], tmp_path / "sweep", env)
    study_url = normalize_url(storage)
    polled = optuna.storages.RDBStorage(study_url)  # one connection pool for the polling, not one per poll

    def both_training():
        try:
            running = [t for t in optuna.load_study(study_name="ts", storage=polled).get_trials()
                       if t.state == TrialState.RUNNING and "mlflow_run_id" in t.user_attrs]
        except KeyError:  # the study is not created yet
            return False
        return len(running) == 2 and all(c.get_metric_history(t.user_attrs["mlflow_run_id"], "train/loss")
                                         for t in running) and running

    try:
        running = until(both_training, sub, timeout=300, what="two trials training at once")
    finally:
        polled.engine.dispose()
    workers = _sweep_processes(psutil.Process(sub.pid))
    assert len(workers) == 2, [w.cmdline() for w in workers]
    workers[0].send_signal(signal.SIGKILL)  # mid-trial, no clean-up
    out = finish(sub, timeout=600)
    assert sub.returncode != 0 and "exited with status -9" in out, out[-4000:]  # the killed job is reported

    trials = optuna.load_study(study_name="ts", storage=study_url).get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    dead = [t for t in trials if t.state == TrialState.FAIL]
    assert len(dead) == 1 and dead[0].number in {t.number for t in running}
    assert "worker lost" in dead[0].user_attrs["fail_reason"]
    dead_run = c.get_run(dead[0].user_attrs["mlflow_run_id"])
    assert dead_run.info.status == "KILLED" and "worker lost" in dead_run.data.tags["failure_reason"]
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(done) == n and any(t.user_attrs.get("retry_of") == dead[0].number for t in done)
    for t in done:
        assert c.get_run(t.user_attrs["mlflow_run_id"]).info.status == "FINISHED"

    from analysis.report import main as report  # in this process: it only reads the server

    capsys.readouterr()
    assert report(["ts", "--tracking-uri", server.url, "--out", str(tmp_path / "report")]) == 0
    assert f"{n} runs of" in capsys.readouterr().out and (tmp_path / "report" / "index.md").is_file()


def test_submitit_local_multirun_lands_one_finished_run_per_job(server, tmp_path, shakespeare_path):
    env, c = env_for(tmp_path), MlflowClient(server.url)
    experiment = f"submitit-{uuid.uuid4().hex[:6]}"
    args = ["-m", "hydra/launcher=submitit_local", "norm=layernorm,rmsnorm",
            *tiny(shakespeare_path, **{"tracking.uri": server.url, "tracking.experiment": experiment})]
    p = cli("ablations.run", args, tmp_path / "multirun", env)
    out = finish(p)
    assert p.returncode == 0, out[-4000:]
    assert "Submitit 'local' sweep output dir" in out
    runs = only_run(c, experiment)
    assert sorted((r.data.tags["choice.norm"], r.info.status) for r in runs) == [
        ("layernorm", "FINISHED"), ("rmsnorm", "FINISHED")]
    assert len({r.data.tags["multirun_group"] for r in runs}) == 1
    # each job ran in its own process (submitit's local executor), not inside the launching one
    logs = list((tmp_path / "multirun").glob("multirun/*/*/.submitit/*/*_log.out"))
    assert len(logs) == 2 and all("[ablations] done:" in f.read_text() for f in logs)
