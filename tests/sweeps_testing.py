"""Helpers shared by the sweeps tests (tests/test_sweeps_*.py): tiny training overrides, PostgreSQL, dashboard."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import warm_python

REPO = Path(__file__).resolve().parents[1]


def tiny_overrides(corpus: Path | str, max_steps: int = 20, val_every: int = 10) -> list[str]:
    """A trial that trains the tiny model for a few steps on a local corpus, quickly and offline."""
    return [
        "model=tiny", "data=shakespeare", f"data.path={corpus}", f"trainer.max_steps={max_steps}",
        f"trainer.val_check_interval={val_every}", "data.batch_size=8", "data.val_windows=8",
        "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=5", "generate.max_new_tokens=8",
        "generate.bench_decode_tokens=4", "generate.bench_prefill_tokens=16", "checkpoint.every_n_steps=1000",
        "tracking.peak_flops=1e12", "trainer.precision=32-true",  # bf16 autocast is slower for a model this small
    ]


def ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def postgres_server() -> Iterator[str]:
    """Yield a server URL: $ABLATIONS_TEST_POSTGRES_URL, else a throwaway cluster started here (stopped after).

    Raises :class:`pgtest.PostgresUnavailable` when neither works."""
    url = os.environ.get("ABLATIONS_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    import pgtest

    cluster = pgtest.start()
    try:
        yield cluster.url()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.datadir.parent, ignore_errors=True)


def fresh_database(server_url: str) -> str:
    from pgtest import create_database

    return create_database(server_url, f"sweeps_test_{uuid.uuid4().hex[:10]}")


def worker_env(cache_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["ABLATIONS_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def start_worker(args: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    f = open(log, "w")
    return warm_python.popen([sys.executable, "-m", "sweeps.run", *args], cwd=cwd, env=env, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)


def free_port() -> int:
    from pgtest import free_port as fp

    return fp()


def get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - local test server
        return json.loads(r.read().decode())


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - e.g. a server not listening yet
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))
