"""The verdict protocol's lr transfer (issue 18 item 5): under mup the lr is searched at one size only, with two seeds
per grid point (the best lr has the lowest MEAN), the grid grows past an edge while the best sits there, and the
larger sizes reuse that lr; bad transfer settings fail in one line."""
import statistics

import pytest

from test_verdict_protocol import verdict_args, verdict_here

TRANSFER = ["model.parametrization=mup", "model.mup.base_width=16", "verdict.name=tinytransfer",
            "verdict.sizes=[{name:a,budget_flops:1.5e8,overrides:['model.n_embd=16']},"
            "{name:b,budget_flops:3.0e8,overrides:['model.n_embd=32']}]",
            "verdict.lr.transfer_from=a", "verdict.lr.seeds=[100,101]", "verdict.lr.extend=1",
            "verdict.seeds_largest=1"]


def _runs(cwd):
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = c.get_experiment_by_name("tinytransfer")
    return [] if exp is None else c.search_runs([exp.experiment_id], max_results=1000)


@pytest.fixture(scope="module")
def transfer(tmp_path_factory, shakespeare_path):
    cwd = tmp_path_factory.mktemp("transfer") / "job"
    done = verdict_here(cwd, [*verdict_args(cwd, shakespeare_path), *TRANSFER])
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return cwd, done


@pytest.mark.slow
def test_lr_searched_once_with_two_seeds_extended_and_reused(transfer):
    cwd, done = transfer
    runs = _runs(cwd)
    assert runs and all(r.info.status == "FINISHED" for r in runs)
    for arm in ("learned", "rope"):
        lr_runs = [r for r in runs if r.data.tags["verdict.arm"] == arm and r.data.tags["verdict.stage"] == "lr"]
        assert {r.data.tags["verdict.size"] for r in lr_runs} == {"a"}  # searched at the source size only
        by_lr: dict[float, list[float]] = {}
        for r in lr_runs:
            by_lr.setdefault(float(r.data.params["optim.lr"]), []).append(r.data.metrics["final_val_bpb"])
        # the grid [0.002, 0.02] plus one point past whichever edge won (ratio 10), each lr at both seeds
        assert len(by_lr) == 3 and {0.002, 0.02} < set(by_lr)
        assert set(by_lr) - {0.002, 0.02} <= {0.0002, 0.2}
        assert all(len(v) == 2 for v in by_lr.values())
        assert sorted(r.data.tags["seed"] for r in lr_runs) == ["100"] * 3 + ["101"] * 3
        best = min(by_lr, key=lambda lr: statistics.fmean(by_lr[lr]))  # the mean over seeds, not one seed's luck
        seed_runs = [r for r in runs if r.data.tags["verdict.arm"] == arm and r.data.tags["verdict.stage"] == "seeds"]
        assert {r.data.tags["verdict.size"] for r in seed_runs} == {"a", "b"}
        assert {float(r.data.params["optim.lr"]) for r in seed_runs} == {best}
        assert {r.data.tags["verdict.lr_from"] for r in seed_runs} == {"a"}
        assert {r.data.tags["seed"] for r in seed_runs} == {"0"}  # never one of the search's seeds
    assert "lr searched at a only" in done.stdout


@pytest.mark.parametrize("extra, needle", [
    (["model.parametrization=sp"], "verdict.lr.transfer_from='a' with model.parametrization=sp"),
    (["verdict.lr.transfer_from=zz"], "verdict.lr.transfer_from='zz'"),
    (["verdict.lr.seeds=[1,1]"], "verdict.lr.seeds=[1, 1]"),
    (["verdict.lr.extend=-1"], "verdict.lr.extend=-1"),
])
def test_bad_transfer_settings_fail_in_one_line(tmp_path, shakespeare_path, extra, needle):
    # the CLI turns a VerdictError into this one line and exit 2 before any run (tests/test_verdict_protocol.py)
    from sweeps.verdict import VerdictError, load_protocol

    with pytest.raises(VerdictError) as e:
        load_protocol([*verdict_args(tmp_path, shakespeare_path), *TRANSFER, *extra])
    assert needle in str(e.value) and "\n" not in str(e.value)
