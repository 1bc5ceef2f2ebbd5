"""The report and the notebooks on an MLflow store made by really training tiny models (2 variants x 2 seeds).

One session-scoped fixture runs `python -m ablations.run -m ...` once in a temporary directory; a FAILED and a
RUNNING run are then added to the same experiment (with absurdly good metrics) to check that the report leaves them
out and says why. Variants are told apart by their `choice.attention` tag; the report labels them `attention=mha` /
`attention=mqa` (the variant tag minus the overrides all runs share).

ANALYSIS_TEST_TRAINED_DB=/path/mlflow.db (a copy of a store this fixture made) skips the training: for iterating on
analysis/ only.
"""
import shutil
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import warm_python

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
EXPERIMENT = "test"
VARIANTS = ("attention=mha", "attention=mqa")  # different KV-cache sizes: the Pareto set is not trivial
SEEDS = (0, 1)
NOTEBOOKS = sorted((REPO / "analysis" / "notebooks").glob("*.ipynb"))


def _key(tags: dict) -> str:
    return "attention=" + tags["choice.attention"]


def brute_pareto(points: dict[str, tuple[float, float]]) -> set[str]:
    """Names of the points no other point dominates (lower x and lower y are better)."""
    return {a for a, (xa, ya) in points.items()
            if not any(xb <= xa and yb <= ya and (xb < xa or yb < ya) for b, (xb, yb) in points.items() if b != a)}


@pytest.fixture(scope="session")
def trained_store(tmp_path_factory, shakespeare_path):
    """(tracking URI, {"failed": run id, "running": run id}) of a store of 2 x 2 really trained tiny models."""
    work = tmp_path_factory.mktemp("analysis_real")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    if os.environ.get("ANALYSIS_TEST_TRAINED_DB"):
        shutil.copy(os.environ["ANALYSIS_TEST_TRAINED_DB"], work / "mlflow.db")
    else:
        _train(work, uri, shakespeare_path)
    return _add_bad_runs(uri)


def _train(work: Path, uri: str, shakespeare_path: Path) -> None:
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, ABLATIONS_CACHE_DIR=str(work / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "ablations.run", "-m", "model=tiny",
           "attention=" + ",".join(v.split("=", 1)[1] for v in VARIANTS), "seed=" + ",".join(map(str, SEEDS)),
           "data=shakespeare", f"data.path={shakespeare_path}", "data.batch_size=8", "data.val_windows=8",
           "trainer.max_steps=24", "trainer.val_check_interval=8", "trainer.log_every_n_steps=4",
           "trainer.precision=32-true", "trainer.enable_progress_bar=false", "tracking.peak_flops=1e12",
           "generate.max_new_tokens=8", "generate.bench_decode_tokens=8", "generate.bench_prefill_tokens=16",
           f"tracking.uri={uri}", f"tracking.experiment={EXPERIMENT}"]
    t0 = time.time()
    proc = warm_python.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"training failed ({time.time() - t0:.0f}s):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def _add_bad_runs(uri: str) -> tuple[str, dict]:
    """Add a FAILED and a RUNNING run (tags copied from a real run, absurdly good metrics) to the experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    real = client.search_runs([exp.experiment_id])
    assert len(real) == len(VARIANTS) * len(SEEDS)
    template = next(r for r in real if _key(r.data.tags) == VARIANTS[1])
    injected = {}
    for status, seed in (("FAILED", 7), ("RUNNING", 8)):
        tags = {k: v for k, v in template.data.tags.items() if not k.startswith("mlflow.")}
        tags.update(seed=str(seed), **({"failure_reason": "DivergenceError: injected by the test"}
                                       if status == "FAILED" else {}))
        run = client.create_run(exp.experiment_id, tags=tags, run_name=f"{VARIANTS[1]} seed={seed}")
        for key, value in (("final_val_loss", 0.001), ("final_val_bpb", 0.001), ("kv_cache_bytes_per_token", 1),
                           ("final_tokens_per_sec", 1e12), ("decode_tokens_per_sec", 1e12), ("train/loss", 0.001)):
            client.log_metric(run.info.run_id, key, value, step=1)
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status)
        injected[status.lower()] = run.info.run_id
    return uri, injected


@pytest.fixture(scope="session")
def real_report(trained_store, tmp_path_factory):
    from analysis.report import main

    uri, _ = trained_store
    out = tmp_path_factory.mktemp("real_report")
    assert main([EXPERIMENT, "--tracking-uri", uri, "--out", str(out)]) == 0
    return out


def finished_runs(uri: str) -> pd.DataFrame:
    """The store's finished runs read straight from MLflow (independently of analysis/)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    rows = [{"run_id": r.info.run_id, "variant": _key(r.data.tags), "seed": int(r.data.tags["seed"]),
             **r.data.metrics} for r in client.search_runs([exp.experiment_id]) if r.info.status == "FINISHED"]
    return pd.DataFrame(rows)


def test_store_has_the_contract_record(trained_store):
    uri, _ = trained_store
    runs = finished_runs(uri)
    assert sorted(runs["variant"].unique()) == sorted(VARIANTS)
    assert sorted(runs.groupby("variant")["seed"].apply(sorted).iloc[0]) == list(SEEDS)
    for m in ("final_val_loss", "final_val_bpb", "final_tokens_per_sec", "final_mfu", "params",
              "kv_cache_bytes_per_token", "decode_tokens_per_sec"):
        assert runs[m].notna().all(), m


def test_report_files(real_report):
    for name in ("index.md", "index.html", "summary.md", "summary.csv", "runs.csv", "left_out.csv"):
        assert (real_report / name).stat().st_size > 0, name
    figs = sorted(p.name for p in (real_report / "figures").glob("*.png"))
    assert figs == sorted(f"{n}.png" for n in ("loss_vs_step", "loss_vs_tokens", "loss_vs_time",
                                                 "quality_vs_kv_cache", "quality_vs_train_throughput",
                                                 "quality_vs_decode_throughput"))
    md = (real_report / "index.md").read_text()
    for f in figs:
        assert f"](figures/{f})" in md
    html = (real_report / "index.html").read_text()
    assert html.count("<img ") == len(figs) and "<table>" in html
    # provenance: the commits and data fingerprints of the runs
    runs = pd.read_csv(real_report / "runs.csv", dtype=str)
    for col in ("git_commit", "data_fingerprint"):
        for value in runs[col].dropna().unique():
            assert value in md
    # and the machine they ran on: this CPU, as /proc/cpuinfo names it, with the count of result runs
    from ablations.repro import cpu_model

    assert f"- `{cpu_model()}`: {len(runs)} runs (" in md


def test_table_values_equal_the_store(trained_store, real_report):
    uri, _ = trained_store
    runs = finished_runs(uri)
    runs = runs[runs["final_val_bpb"] > 0.01]  # the injected runs are not FINISHED anyway
    summary = pd.read_csv(real_report / "summary.csv").set_index("label")
    assert sorted(summary.index) == sorted(VARIANTS)
    metrics = ["final_val_loss", "final_val_bpb", "final_tokens_per_sec", "final_mfu", "params",
               "kv_cache_bytes_per_token", "decode_tokens_per_sec"]
    means = runs.groupby("variant")[metrics].mean()
    stds = runs.groupby("variant")[metrics].std(ddof=1)
    for m in metrics:
        np.testing.assert_allclose(summary.loc[means.index, f"{m}_mean"], means[m], rtol=1e-9, err_msg=m)
        np.testing.assert_allclose(summary.loc[stds.index, f"{m}_std"], stds[m], rtol=1e-9, equal_nan=True,
                                   err_msg=m)
    assert (summary["n_runs"] == len(SEEDS)).all()
    # the difference to the baseline (mha: the GPT-2 default) and its Welch p-value
    from scipy import stats

    assert summary.loc[VARIANTS[0], "is_baseline"]
    a = runs.loc[runs["variant"] == VARIANTS[1], "final_val_bpb"]
    b = runs.loc[runs["variant"] == VARIANTS[0], "final_val_bpb"]
    assert summary.loc[VARIANTS[1], "delta_final_val_bpb"] == pytest.approx(a.mean() - b.mean())
    p = stats.ttest_ind(a, b, equal_var=False).pvalue
    if math.isfinite(p):
        assert summary.loc[VARIANTS[1], "p_final_val_bpb"] == pytest.approx(p)
        verdict = "significant" if p < 0.05 else "not significant"
        assert summary.loc[VARIANTS[1], "verdict_final_val_bpb"] == verdict
    md_table = (real_report / "summary.md").read_text()
    for v in VARIANTS:
        assert f"{means.loc[v, 'final_val_bpb']:.4f}" in md_table


def test_pareto_set(trained_store, real_report):
    uri, _ = trained_store
    runs = finished_runs(uri)
    means = runs.groupby("variant")[["kv_cache_bytes_per_token", "final_val_bpb"]].mean()
    assert means.loc[VARIANTS[1], "kv_cache_bytes_per_token"] < means.loc[VARIANTS[0], "kv_cache_bytes_per_token"]
    expected = brute_pareto({v: (r["kv_cache_bytes_per_token"], r["final_val_bpb"]) for v, r in means.iterrows()})
    summary = pd.read_csv(real_report / "summary.csv").set_index("label")
    assert set(summary.index[summary["pareto_kv_cache"]]) == expected
    assert VARIANTS[1] in expected  # the smallest cache is always on the frontier
    line = next(l for l in (real_report / "index.md").read_text().splitlines()
                if l.startswith("Pareto-optimal variants (val bpb vs KV"))
    assert {v for v in VARIANTS if f"`{v}`" in line} == expected


def test_failed_and_running_runs_are_left_out(trained_store, real_report):
    _, injected = trained_store
    left = pd.read_csv(real_report / "left_out.csv")
    reasons = dict(zip(left.loc[left["scope"] == "report", "run_id"], left.loc[left["scope"] == "report", "reason"]))
    assert reasons == {injected["failed"]: "run FAILED (DivergenceError: injected by the test)",
                       injected["running"]: "run still RUNNING (not finished)"}
    runs = pd.read_csv(real_report / "runs.csv")
    assert not set(injected.values()) & set(runs["run_id"])
    summary = pd.read_csv(real_report / "summary.csv")
    assert summary["final_val_bpb_mean"].min() > 0.5 and summary["kv_cache_bytes_per_token_mean"].min() > 1
    md = (real_report / "index.md").read_text()
    section = md.split("## Left out", 1)[1]
    assert injected["failed"] in section and injected["running"] in section and "DivergenceError" in section


def test_report_is_deterministic(trained_store, real_report, tmp_path):
    uri, _ = trained_store
    proc = warm_python.run([sys.executable, "-m", "analysis.report", EXPERIMENT, "--tracking-uri", uri,
                            "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "4 runs of 2 variants, 2 left out" in proc.stdout
    files = sorted(p.relative_to(real_report) for p in real_report.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    for rel in files:
        assert (real_report / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_against_the_store(notebook, trained_store, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    uri, _ = trained_store
    monkeypatch.setenv("ABLATIONS_TRACKING_URI", uri)
    monkeypatch.setenv("ABLATIONS_EXPERIMENT", EXPERIMENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 1
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert f"experiment `{EXPERIMENT}`: 4 runs of 2 variants" in text
