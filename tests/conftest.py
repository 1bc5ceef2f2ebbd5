"""Shared test set-up: offline data and tokenizer files from ../shared, tiny and deterministic."""
import gc
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO.parent / "shared").resolve()

# tiktoken reads its GPT-2 BPE files from here instead of downloading them.
if (SHARED / "tiktoken-cache").is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken-cache"))
# The README's command sets it relative (../shared/tiktoken-cache): make it absolute, so the CLI subprocesses that
# tests start in their own temporary directories find the files too.
if os.environ.get("TIKTOKEN_CACHE_DIR"):
    os.environ["TIKTOKEN_CACHE_DIR"] = os.path.abspath(os.environ["TIKTOKEN_CACHE_DIR"])
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HYDRA_FULL_ERROR", "0")
# One thread for torch in this process (set before torch is imported) and in every process a test starts, unless
# the caller chose: tiny models run fastest on one thread, and with two threads each parallel op waits for its
# slowest thread, so a second busy process on CI's two cores (a worker, a server, another test's subprocess) made
# tiny trainings several times slower. Tests about thread counts set their own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


_frozen_at_module = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """At each test file's first test: collect, then freeze what survives (the imported libraries, the session's
    fixtures) into the permanent generation. A full collection walks every tracked object: ~1 s in a worker that has
    imported torch, Lightning, MLflow, transformers and the test modules, paid by every gc.collect() of the code
    under test (a sweep frees memory after each trial) and by Python's own full collections. The previous file's
    module fixtures are torn down by now, so their garbage is collected before the freeze, not kept."""
    if item.module is not _frozen_at_module[0]:
        _frozen_at_module[0] = item.module
        gc.collect()
        gc.freeze()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    path = SHARED / "data" / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.fail(f"tinyshakespeare.txt not found at {path}: tests expect the shared/ folder beside the checkout")
    return path


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and CI's two cores are shared: more threads only contend."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------ shared for the session
@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL server URL for the whole session: $ABLATIONS_TEST_POSTGRES_URL (CI's packaged cluster), else one
    throwaway cluster (tests/pgtest.py) started on first use and stopped at the end. Each test creates its own
    database on it (`pg_url`, tests/sweeps_testing.py fresh_database). Missing PostgreSQL fails the tests that need
    it when CI=true and skips them with the reason otherwise."""
    from pgtest import PostgresUnavailable
    from sweeps_testing import ci, postgres_server

    gen = postgres_server()
    try:
        url = next(gen)
    except PostgresUnavailable as e:
        if ci():
            pytest.fail(f"PostgreSQL is required in CI (set ABLATIONS_TEST_POSTGRES_URL or install postgresql): {e}")
        pytest.skip(f"PostgreSQL not available: {e}")
    yield url
    gen.close()


@pytest.fixture
def pg_url(pg_server):
    """A fresh database on the session's PostgreSQL server."""
    from sweeps_testing import ci, fresh_database

    try:
        return fresh_database(pg_server)
    except Exception as e:  # noqa: BLE001 - e.g. ABLATIONS_TEST_POSTGRES_URL points at a server that is down
        msg = f"cannot create a database on {pg_server}: {type(e).__name__}: {str(e).strip().splitlines()[0]}"
        if ci():
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def train_here():
    """`train_here(cwd, overrides, callbacks=())`: ablations.train.train on the composed config in this process, with
    `cwd` as the working directory and no $MLFLOW_TRACKING_URI; -> train's result. For fixtures that only need a
    recorded run to read (the CLI itself is tested in tests/test_harness_run.py): no second interpreter importing
    torch, Lightning and MLflow again. `callbacks`: extra Lightning callbacks (tests/faults.py)."""
    def train_here(cwd: Path, overrides: list[str], callbacks=()) -> dict:
        from hydra import compose, initialize_config_dir

        from ablations.train import train

        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv("MLFLOW_TRACKING_URI", raising=False)
            mp.chdir(cwd)
            return train(cfg, callbacks=callbacks)

    return train_here


@pytest.fixture(scope="session")
def multirun(tmp_path_factory, shakespeare_path):
    """The real `python -m ablations.run -m position=learned,rope` on the tiny model (char tokens, context 32, 3 steps):
    one Hydra multirun of two jobs into a fresh MLflow store, run once and read by every test that only needs such
    runs: the multirun's grouping (tests/test_harness_run.py) and evaluation past the training context, with its
    report section (tests/test_context_length.py).

    -> namespace(cwd, uri, client, runs: {position: run id}, cache_dir, result: the CompletedProcess)."""
    import sys
    from types import SimpleNamespace

    import warm_python
    from mlflow import MlflowClient

    cwd = tmp_path_factory.mktemp("multirun") / "job"
    cwd.mkdir()
    uri = f"sqlite:///{cwd}/mlflow.db"
    cache = cwd.parent / "token-cache"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(ABLATIONS_CACHE_DIR=str(cache), PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0")
    args = ["-m", "position=learned,rope", "model=tiny", "data=shakespeare", f"data.path={shakespeare_path}",
            "tokenizer=char", "data.batch_size=4", "data.val_windows=4", "trainer.max_steps=3",
            "trainer.val_check_interval=3", "trainer.enable_progress_bar=false", "generate.max_new_tokens=4",
            "generate.bench_decode_tokens=2", "generate.bench_prefill_tokens=8", "threads=1", f"tracking.uri={uri}"]
    r = warm_python.run([sys.executable, "-m", "ablations.run", *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cl = MlflowClient(uri)
    found = cl.search_runs([cl.get_experiment_by_name("ablations").experiment_id])
    runs = {x.data.tags["choice.position"]: x.info.run_id for x in found}
    return SimpleNamespace(cwd=cwd, uri=uri, client=cl, runs=runs, cache_dir=str(cache), result=r)


# ------------------------------------------------------------------------------------------ two workers (xdist)
# `bash scripts/test.sh` runs the suite on two pytest-xdist workers with --dist loadfile, refined here: each module's
# tests stay on one worker (its module fixtures run once), the modules that read one session fixture stay together
# (it runs once), and the longest groups start first, so that the two workers end together (xdist's own order starts
# the groups with the most tests, which here are the quick ones). The order is only balance: a module missing from
# LONGEST_FIRST runs after those listed, and every test passes in any order.
SHARED_GROUPS = {"test_harness_run": "multirun", "test_context_length": "multirun"}  # the `multirun` fixture
LONGEST_FIRST = ("test_tracking_server", "test_fsdp", "test_nodes", "multirun", "test_verdict_protocol", "test_sweeps_postgres",
                 "test_analysis_real", "test_verdict_transfer", "test_sweeps_sqlite", "test_sweep_workers",
                 "test_data_shards", "test_mup", "test_protocol_report", "test_export", "test_optim", "test_paired",
                 "test_sweeps_unit", "test_known_results", "test_tracking_faults", "test_verdict_lr_seeds",
                 "test_prepare_resume", "test_prepare_manifest", "test_bench", "test_budget", "test_reproducibility",
                 "test_harness_errors")


def _group(nodeid: str) -> str:
    module = Path(nodeid.split("::", 1)[0]).stem
    return SHARED_GROUPS.get(module, module)


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: the longest groups first (stable: a module keeps its order)
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_group(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # another --dist: xdist's own scheduler
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # the workers' order above, not the groups' test counts
            super().schedule()

    return ModuleGroups(config, log)
