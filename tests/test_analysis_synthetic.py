"""analysis/ on a synthetic MLflow store (contract names, no training): units, left-out runs, table, Pareto, CLI.

The report on a store of really trained tiny models is in test_analysis_real.py.
"""
import ast
import subprocess
import sys
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import report as report_mod
from analysis.notebook import prepare
from analysis.stats import pareto_front, welch
from analysis.store import (AnalysisError, looks_like_filter, resolve_tracking_uri, runs_frame, split_runs,
                            variant_name)

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ helpers independent of analysis/
def brute_pareto(points: dict[str, tuple[float, float]], maximize_x=False) -> set[str]:
    """Names of points not dominated (lower y better; lower x better unless maximize_x)."""
    sign = -1 if maximize_x else 1
    out = set()
    for a, (xa, ya) in points.items():
        dominated = any(sign * xb <= sign * xa and yb <= ya and (sign * xb < sign * xa or yb < ya)
                        for b, (xb, yb) in points.items() if b != a)
        if not dominated:
            out.add(a)
    return out


def store_finals(uri: str, experiment: str) -> pd.DataFrame:
    """Finished runs of `experiment` straight from MLflow: variant, seed, run_id and the final metrics."""
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.get_experiment_by_name(experiment)
    rows = []
    for r in client.search_runs([exp.experiment_id], max_results=1000):
        rows.append({"run_id": r.info.run_id, "status": r.info.status, "variant": r.data.tags.get("variant"),
                     "seed": r.data.tags.get("seed"), **r.data.metrics})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ units
def test_pareto_front_minimize_both():
    x = [1, 2, 3, 2, 4, 1]
    y = [5, 3, 1, 4, 1, 5]
    # (2,4) dominated by (2,3); (4,1) dominated by (3,1); the two (1,5) are equal: both on the frontier
    assert pareto_front(x, y).tolist() == [True, True, True, False, False, True]


def test_pareto_front_maximize_x_nan_and_edge_cases():
    # throughput: higher x better, lower y better
    x = [100.0, 200.0, 150.0, np.nan]
    y = [1.0, 2.0, 2.5, 0.1]
    assert pareto_front(x, y, maximize_x=True).tolist() == [True, True, False, False]
    assert pareto_front([], []).tolist() == []
    assert pareto_front([3.0], [7.0]).tolist() == [True]
    with pytest.raises(ValueError):
        pareto_front([1, 2], [1])


def test_pareto_front_matches_brute_force_on_random_points():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.integers(0, 6, 12).astype(float), rng.integers(0, 6, 12).astype(float)
        pts = {str(i): (x[i], y[i]) for i in range(12)}
        for maximize in (False, True):
            got = {str(i) for i in np.flatnonzero(pareto_front(x, y, maximize_x=maximize))}
            assert got == brute_pareto(pts, maximize_x=maximize)


def test_welch_matches_scipy_and_handles_small_samples():
    from scipy import stats

    a, b = [2.0, 2.2, 2.1], [1.0, 1.1]
    res = welch(a, b)
    t = stats.ttest_ind(a, b, equal_var=False)
    assert res["p_value"] == pytest.approx(t.pvalue)
    assert res["delta"] == pytest.approx(np.mean(a) - np.mean(b))
    ci = t.confidence_interval(0.95)
    assert (res["ci_low"], res["ci_high"]) == pytest.approx((ci.low, ci.high))
    assert res["verdict"] == "significant"
    assert welch([1.0, 1.2], [1.1, 1.05])["verdict"] == "not significant"
    one = welch([1.0], [1.0, 2.0])
    assert one["verdict"].startswith("n/a") and math.isnan(one["p_value"]) and one["delta"] == -0.5
    assert welch([3.0, 3.0], [3.0, 3.0])["verdict"] == "n/a (no variance)"


def test_tracking_uri_resolution(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri() == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert resolve_tracking_uri() == "sqlite:///env.db"
    assert resolve_tracking_uri("http://host:5000") == "http://host:5000"


def test_variant_names_and_query_kind():
    assert variant_name({"variant": "norm=rmsnorm", "choice.norm": "rmsnorm"}) == "norm=rmsnorm"
    assert variant_name({"choice.norm": "rmsnorm", "choice.mlp": "gelu"}, "x") == "mlp=gelu norm=rmsnorm"
    assert variant_name({}, "norm=rmsnorm seed=1") == "norm=rmsnorm"
    assert variant_name({}, None) == "unlabelled"
    assert looks_like_filter("tags.variant = 'norm=rmsnorm'")
    assert looks_like_filter("metrics.final_val_bpb < 2")
    assert not looks_like_filter("norms")


def test_split_runs_reasons_and_duplicates():
    base = {"run_name": "r", "experiment": "e", "end_time": 0, "failure_reason": None, "pruned": None,
            "final_val_loss": 1.0, "final_val_bpb": 1.5}
    rows = [
        dict(base, run_id="a", variant="v", seed=0, status="FINISHED", start_time=1),
        dict(base, run_id="b", variant="v", seed=0, status="FINISHED", start_time=2),  # newer duplicate wins
        dict(base, run_id="c", variant="v", seed=1, status="FAILED", start_time=3, failure_reason="boom"),
        dict(base, run_id="d", variant="v", seed=2, status="RUNNING", start_time=4),
        dict(base, run_id="e", variant="w", seed=0, status="FINISHED", start_time=5, final_val_bpb=float("nan")),
        dict(base, run_id="f", variant="w", seed=1, status="KILLED", start_time=6, pruned="true"),
    ]
    included, left = split_runs(pd.DataFrame(rows))
    assert included["run_id"].tolist() == ["b"]
    reasons = dict(zip(left["run_id"], left["reason"]))
    assert reasons == {"a": "superseded by newer run b with the same variant and seed", "c": "run FAILED (boom)",
                       "d": "run still RUNNING (not finished)", "e": "missing metric final_val_bpb",
                       "f": "run KILLED (pruned by the sweep)"}


# The leaves analysis/ may import from the other packages, each importing nothing of the harness: modules.errors, the
# project's error base (imports nothing), and ablations.cli, the project's one command-line parser (imports the
# stdlib, yaml lazily and modules.errors; ablations/__init__.py is only a docstring), which every `python -m`
# command's key=value options go through, analysis.report's too.
LEAVES = ("modules.errors", "ablations.cli")


def test_analysis_never_imports_training_code():
    for path in sorted((REPO / "analysis").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                if n in LEAVES:
                    continue
                assert n.split(".")[0] not in ("ablations", "modules", "sweeps", "torch", "lightning"), (path, n)
    # and at run time: importing every analysis module loads neither torch nor any model/training code, only the
    # leaves and their packages (whose __init__ is a docstring)
    code = ("import sys, pkgutil, importlib, analysis\n"
            "for m in pkgutil.iter_modules(analysis.__path__): importlib.import_module('analysis.' + m.name)\n"
            f"allowed = {sorted({*LEAVES, *(n.split('.')[0] for n in LEAVES)})!r}\n"
            "bad = sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'ablations', 'sweeps', 'lightning',"
            " 'modules') and k not in allowed)\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_notebooks_are_stripped():
    import nbformat

    paths = sorted((REPO / "analysis" / "notebooks").glob("*.ipynb"))
    assert {p.name for p in paths} >= {"quality_vs_cache.ipynb", "throughput.ipynb"}
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, p


# ------------------------------------------------------------------ synthetic store
@pytest.fixture(scope="module")
def synthetic_store(tmp_path_factory):
    from synthetic_store import make_store

    d = tmp_path_factory.mktemp("synthetic_store")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    made = make_store(uri, "synthetic")
    make_store(uri, "other", with_bad_runs=False)  # a second experiment: filters must be able to span both
    # an experiment whose only run failed, and an empty one
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.create_experiment("all_failed")
    r = client.create_run(exp, tags={"variant": "norm=rmsnorm", "seed": "0", "failure_reason": "ValueError: x"},
                          run_name="norm=rmsnorm seed=0")
    client.set_terminated(r.info.run_id, "FAILED")
    client.create_experiment("empty")
    return uri, made


@pytest.fixture(scope="module")
def synthetic_report(synthetic_store, tmp_path_factory):
    uri, made = synthetic_store
    out = tmp_path_factory.mktemp("synthetic_report")
    assert report_mod.main(["synthetic", f"tracking_uri={uri}", f"out={out}"]) == 0
    return out


def test_report_files_and_left_out(synthetic_store, synthetic_report):
    uri, made = synthetic_store
    out = synthetic_report
    for name in ("index.md", "index.html", "summary.md", "summary.csv", "runs.csv", "left_out.csv"):
        assert (out / name).is_file(), name
    for fig in ("loss_vs_step", "loss_vs_tokens", "loss_vs_time", "quality_vs_kv_cache",
                "quality_vs_train_throughput", "quality_vs_decode_throughput"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 10_000, fig
    bad = {rid for rid, m in made.items() if m["status"] != "FINISHED" or "final_val_bpb" not in m["metrics"]}
    assert len(bad) == 4
    runs = pd.read_csv(out / "runs.csv")
    assert not bad & set(runs["run_id"]) and len(runs) == 9
    left = pd.read_csv(out / "left_out.csv")
    assert set(left.loc[left["scope"] == "report", "run_id"]) == bad
    # a result missing one metric / one history is left out of exactly the figures that need it
    partial = next(rid for rid, m in made.items() if m["seed"] == 4)
    assert partial in set(runs["run_id"])
    scopes = dict(zip(left.loc[left["run_id"] == partial, "scope"], left.loc[left["run_id"] == partial, "reason"]))
    assert scopes == {"figure quality_vs_kv_cache": "missing metric kv_cache_bytes_per_token",
                      "figure loss_vs_time": "missing metric history elapsed_sec"}
    reasons = " ".join(left["reason"])
    for word in ("FAILED (DivergenceError", "RUNNING", "KILLED", "missing metric final_val_bpb"):
        assert word in reasons
    md = (out / "index.md").read_text()
    assert "## Left out" in md and "DivergenceError" in md
    for rid in bad:
        assert rid in md
    # the absurd values logged on the bad runs never show up as results
    summary = pd.read_csv(out / "summary.csv")
    assert summary["final_val_bpb_mean"].min() > 1.5
    assert "0.0010" not in (out / "summary.md").read_text()
    html = (out / "index.html").read_text()
    assert html.count("<img ") == 6 and "<table>" in html and 'id="left-out"' in html
    assert "0123456789abcdef0123456789abcdef01234567" in md and "synthetic-data-fp" in md


def test_report_table_and_pareto(synthetic_store, synthetic_report):
    uri, _ = synthetic_store
    summary = pd.read_csv(synthetic_report / "summary.csv").set_index("variant")
    finals = store_finals(uri, "synthetic")
    ok = finals[(finals["status"] == "FINISHED") & finals["final_val_bpb"].notna()]
    assert summary.loc["attention=gqa", "n_runs"] == 3 and summary.loc["attention=gqa", "kv_cache_bytes_per_token_n"] == 2
    means = ok.groupby("variant")[["final_val_bpb", "final_val_loss", "kv_cache_bytes_per_token",
                                   "final_tokens_per_sec", "final_mfu", "params"]].mean()
    stds = ok.groupby("variant")["final_val_bpb"].std(ddof=1)
    assert sorted(summary.index) == sorted(means.index)
    for m in means.columns:
        np.testing.assert_allclose(summary.loc[means.index, f"{m}_mean"], means[m], rtol=1e-12)
    np.testing.assert_allclose(summary.loc[stds.index, "final_val_bpb_std"], stds, rtol=1e-12)
    assert summary.index[0] == "attention=mha" and summary.loc["attention=mha", "is_baseline"]
    base = ok[ok["variant"] == "attention=mha"]["final_val_bpb"]
    for v in ("attention=gqa", "attention=mla", "attention=mqa"):
        from scipy import stats

        t = stats.ttest_ind(ok[ok["variant"] == v]["final_val_bpb"], base, equal_var=False)
        assert summary.loc[v, "p_final_val_bpb"] == pytest.approx(t.pvalue)
        assert summary.loc[v, "verdict_final_val_bpb"] == ("significant" if t.pvalue < 0.05 else "not significant")
    pts = {v: (means.loc[v, "kv_cache_bytes_per_token"], means.loc[v, "final_val_bpb"]) for v in means.index}
    expected = brute_pareto(pts)
    assert expected == {"attention=mha", "attention=gqa", "attention=mqa"}  # mla is dominated by mqa
    assert set(summary.index[summary["pareto_kv_cache"]]) == expected
    md = (synthetic_report / "index.md").read_text()
    line = next(l for l in md.splitlines() if l.startswith("Pareto-optimal variants (val bpb vs KV"))
    assert all(f"`{v}`" in line for v in expected) and "attention=mla" not in line
    assert "not significant" in md


def test_report_is_deterministic(synthetic_store, synthetic_report, tmp_path):
    uri, _ = synthetic_store
    assert report_mod.main(["synthetic", f"tracking_uri={uri}", f"out={tmp_path}"]) == 0
    first = sorted(p.relative_to(synthetic_report) for p in synthetic_report.rglob("*") if p.is_file())
    second = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert first == second
    for rel in first:
        assert (synthetic_report / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel


def test_filter_query_spans_experiments_and_baseline_option(synthetic_store, tmp_path):
    uri, _ = synthetic_store
    out = tmp_path / "r"
    code = report_mod.main(["tags.`choice.attention` LIKE '_qa'", f"tracking_uri={uri}",
                            f"out={out}", "baseline=attention=mqa", "format=svg"])
    assert code == 0
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["experiment"]) == {"synthetic", "other"}
    assert set(runs["variant"]) == {"attention=mqa", "attention=gqa"}
    summary = pd.read_csv(out / "summary.csv")
    assert summary.loc[0, "variant"] == "attention=mqa" and summary.loc[0, "is_baseline"]
    assert (out / "figures" / "quality_vs_kv_cache.svg").is_file()
    assert "figures/quality_vs_kv_cache.svg" in (out / "index.md").read_text()


def test_bad_inputs_exit_codes(synthetic_store, tmp_path, capsys):
    uri, _ = synthetic_store
    assert report_mod.main(["empty", f"tracking_uri={uri}", f"out={tmp_path / 'a'}"]) == 2
    assert "no runs" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert report_mod.main(["nope", f"tracking_uri={uri}", f"out={tmp_path / 'b'}"]) == 2
    assert "no experiment named 'nope'" in capsys.readouterr().err
    assert report_mod.main(["synthetic", f"tracking_uri={uri}", f"out={tmp_path / 'c'}",
                            "baseline=attention=xyz"]) == 2
    assert "attention=xyz" in capsys.readouterr().err
    missing = tmp_path / "missing.db"
    assert report_mod.main(["synthetic", f"tracking_uri=sqlite:///{missing}"]) == 2
    assert "no MLflow store" in capsys.readouterr().err and not missing.exists()
    assert report_mod.main(["metrics.final_val_bpb <<< 1", f"tracking_uri={uri}", f"out={tmp_path / 'd'}"]) == 2
    capsys.readouterr()
    # runs exist but none is usable: the report is written, says so and lists why; exit 1
    out = tmp_path / "e"
    assert report_mod.main(["all_failed", f"tracking_uri={uri}", f"out={out}"]) == 1
    md = (out / "index.md").read_text()
    assert "No usable runs" in md and "run FAILED (ValueError: x)" in md
    assert not list((out / "figures").glob("*.png")) if (out / "figures").exists() else True


def test_runs_frame_empty():
    frame = runs_frame([])
    assert frame.empty and "variant" in frame.columns
    with pytest.raises(AnalysisError):
        prepare("empty", tracking_uri="sqlite:////nonexistent/dir/mlflow.db")


def test_one_entry_both_spellings(synthetic_store, synthetic_report, tmp_path, capsys):
    """`analysis.report KIND QUERY` writes what the older `analysis.report QUERY` wrote, and so do the older flags
    (one line names the new spelling); a protocol kind of runs that are no protocol's, or a word that is no kind before
    the query, is refused with one line."""
    uri, _ = synthetic_store
    assert report_mod.main(["ablation", "synthetic", f"tracking_uri={uri}", f"out={tmp_path / 'new'}"]) == 0
    capsys.readouterr()
    assert report_mod.main(["synthetic", "--kind", "ablation", "--tracking-uri", uri, "--out", str(tmp_path / "old"),
                            "--format", "png"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m analysis.report: --kind ablation --tracking-uri {uri} --out {tmp_path / 'old'} --format "
                   f"png is spelled kind=ablation tracking_uri={uri} out={tmp_path / 'old'} format=png now"], err
    for name in ("index.md", "summary.csv", "runs.csv"):
        assert (tmp_path / "new" / name).read_bytes() == (synthetic_report / name).read_bytes(), name
        assert (tmp_path / "old" / name).read_bytes() == (synthetic_report / name).read_bytes(), name
    assert f"python -m analysis.report ablation synthetic tracking_uri={uri} baseline=" in \
        (synthetic_report / "index.md").read_text().split("## Regenerate")[1]
    assert report_mod.main(["protocol", "synthetic", f"tracking_uri={uri}", f"out={tmp_path / 'p'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "carry no verdict.protocol tag" in err[0] and not (tmp_path / "p").exists()
    assert report_mod.main(["norms", "synthetic", f"tracking_uri={uri}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("analysis.report: error: expected [KIND] QUERY"), err
