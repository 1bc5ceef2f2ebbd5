"""The verdict protocol end to end at tiny size: sweeps.verdict on SQLite storage, read back from MLflow and Optuna;
re-running continues instead of repeating; bad protocol input fails in one line.

The protocols run through `sweeps.verdict.main` in this process (`verdict_here`: the working directory, token cache
and environment a `python -m sweeps.verdict` subprocess would get), so no second interpreter imports torch,
Lightning and MLflow again; the command line itself (its exit code, its one-line error) is run as a real process
once (test_bad_protocol_from_the_command_line), and verdict.workers=2 starts real worker processes."""
import math
import os
import subprocess
from pathlib import Path

import optuna
import pytest
from commands_testing import run_main

from test_harness_run import run_cli, tiny_args

REPO = Path(__file__).resolve().parents[1]

ARMS = "verdict.arms={learned:{family:positions,overrides:['position=learned']},rope:{family:positions,overrides:['position=rope']}}"
SIZES = ("verdict.sizes=[{name:a,budget_flops:1.5e8,overrides:['model.n_embd=16']},"
         "{name:b,budget_flops:3.0e8,overrides:['model.n_embd=24']},"
         "{name:c,budget_flops:5.0e8,overrides:['model.n_embd=32']}]")


def verdict_args(cwd, shakespeare_path, *extra):
    base = [a for a in tiny_args(shakespeare_path, **{"tracking.uri": f"sqlite:///{cwd}/mlflow.db", "threads": 1})
            if not a.startswith("trainer.max_steps=")]  # the budget sets the steps
    # one lr seed, no grid growth (the defaults search two seeds per lr and grow the grid: test_verdict_lr_seeds.py
    # and test_verdict_transfer.py run those); the default recipe (wsd) stays
    return ["verdict.name=tinyverdict", ARMS, SIZES, "verdict.lr.grid=[0.002,0.02]", "verdict.seeds=1",
            "verdict.lr.seeds=null", "verdict.lr.extend=0", "verdict.lr.search=grid",
            "verdict.seeds_largest=2", f"verdict.storage=sqlite:///{cwd}/optuna.db", "verdict.margin=0.05",
            "verdict.margin_reason=a test", "verdict.allow_dirty=true",  # the working tree of a test may be dirty
            *base, *extra]


def _runs(cwd):
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = c.get_experiment_by_name("tinyverdict")
    return c, ([] if exp is None else c.search_runs([exp.experiment_id], max_results=1000))


def verdict_here(cwd: Path, args: list[str]) -> subprocess.CompletedProcess:
    """`python -m sweeps.verdict args` as sweeps.verdict.main(args) in this process (`run_main`): in `cwd`, with
    run_cli's token cache beside it and its environment (no $MLFLOW_TRACKING_URI; worker processes find this
    checkout) -> returncode, stdout, stderr, like the CompletedProcess of run_cli."""
    cwd.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("ABLATIONS_CACHE_DIR", str(cwd.parent / "token-cache"))
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        mp.chdir(cwd)
        return run_main("sweeps.verdict", args)


@pytest.fixture(scope="module")
def protocol(tmp_path_factory, shakespeare_path):
    cwd = tmp_path_factory.mktemp("verdict") / "job"
    first = verdict_here(cwd, verdict_args(cwd, shakespeare_path))
    assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
    c, runs_after_first = _runs(cwd)
    # one seeds run as a worker killed mid-run leaves it (kill -9, a session that ended): RUNNING, never closed
    def key(r):
        return r.data.tags["verdict.stage"], r.data.tags["verdict.size"], r.data.tags["verdict.arm"], r.data.tags["seed"]

    abandoned = next(r for r in runs_after_first if key(r) == ("seeds", "c", "rope", "2"))
    c.update_run(abandoned.info.run_id, status="RUNNING")
    again = verdict_here(cwd, verdict_args(cwd, shakespeare_path))
    return cwd, first, again, runs_after_first, abandoned.info.run_id


@pytest.mark.slow
def test_every_stage_ran_and_is_tagged(protocol):
    _, first, _, runs, _ = protocol  # the runs as the first invocation left them
    assert all(r.info.status == "FINISHED" for r in runs)
    by = {}
    for r in runs:
        t = r.data.tags
        assert t["verdict.protocol"] == "tinyverdict" and t["verdict.family"] == "positions"
        assert t["verdict.baseline"] == "learned"
        # the statistics fixed before the runs travel with every run (the report reads them from here)
        assert (t["verdict.margin"], t["verdict.margin_reason"], t["verdict.holm"]) == ("0.05", "a test", "study")
        assert t["verdict.primary"] == "arms=*;sizes=*" and t["verdict.allow_dirty"] == "true"
        by.setdefault((t["verdict.size"], t["verdict.arm"], t["verdict.stage"]), []).append(r)
    for size, n_seeds in (("a", 1), ("b", 1), ("c", 2)):  # seeds_largest at the last size
        for arm in ("learned", "rope"):
            lr_runs, seed_runs = by[(size, arm, "lr")], by[(size, arm, "seeds")]
            assert sorted(float(r.data.params["optim.lr"]) for r in lr_runs) == [0.002, 0.02]  # the grid, once each
            assert {r.data.tags["seed"] for r in lr_runs} == {"0"}
            # the seeds never reuse the lr stage's seed (its winner is biased low), and run at the best lr
            assert sorted(r.data.tags["seed"] for r in seed_runs) == [str(s) for s in range(1, n_seeds + 1)]
            best = min(lr_runs, key=lambda r: r.data.metrics["final_val_bpb"])
            assert {r.data.params["optim.lr"] for r in seed_runs} == {best.data.params["optim.lr"]}
            assert {r.data.tags["verdict.lr"] for r in seed_runs} == {f"{float(best.data.params['optim.lr']):g}"}
    assert len(runs) == 3 * 2 * 2 + (1 + 1 + 2) * 2
    assert "report: python -m analysis.report tinyverdict" in first.stdout


@pytest.mark.slow
def test_steps_follow_each_runs_compute_budget(protocol):
    cwd, *_ = protocol
    _, runs = _runs(cwd)
    steps = {}
    for r in runs:
        budget = float(r.data.tags["verdict.budget_flops"])
        assert float(r.data.params["trainer.budget.flops"]) == budget
        per_step = 8 * 32 * r.data.metrics["flops_per_token"]  # data.batch_size * block_size * FLOPs/token
        assert int(r.data.params["trainer.max_steps"]) == math.floor(budget / per_step)
        assert r.data.metrics["budget_flops"] == budget
        # spent compute never exceeds the budget, and misses it by less than one step
        assert budget - per_step < r.data.metrics["flops_seen"] <= budget
        steps[r.data.tags["verdict.size"]] = r.data.metrics["flops_per_token"]
    assert len(set(steps.values())) == 3  # the sizes really are different models


@pytest.mark.slow
def test_optuna_studies_hold_the_lr_stages(protocol):
    cwd, *_ = protocol
    storage = f"sqlite:///{cwd}/optuna.db"
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    assert names == sorted(f"tinyverdict.{s}.{a}.lr" for s in "abc" for a in ("learned", "rope"))
    for name in names:
        trials = optuna.load_study(study_name=name, storage=storage).get_trials()
        assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
        assert sorted(t.params["optim.lr"] for t in trials) == [0.002, 0.02]


@pytest.mark.slow
def test_rerun_continues_without_repeating_and_reruns_an_abandoned_seed(protocol):
    cwd, _, again, before, abandoned = protocol
    assert again.returncode == 0, again.stderr[-3000:]
    c, after = _runs(cwd)
    new = [r for r in after if r.info.run_id not in {b.info.run_id for b in before}]
    # the finished runs are not repeated; the abandoned seed is run once more and its old run no longer RUNNING
    assert [(r.data.tags["verdict.size"], r.data.tags["verdict.arm"], r.data.tags["seed"], r.info.status)
            for r in new] == [("c", "rope", "2", "FINISHED")]
    old = c.get_run(abandoned)
    assert old.info.status == "KILLED" and old.data.tags["failure_reason"].startswith("abandoned")
    assert f"ended abandoned run {abandoned}" in again.stdout
    assert not [r for r in after if r.info.status == "RUNNING"]


BAD_PROTOCOLS = [
    ("verdict.baseline=alibi", "verdict.baseline='alibi'"),
    ("verdict.lr.grid=[]", "verdict.lr.grid=[]"),
    ("verdict.sizes=[{name:a,budget_flops:0}]", "budget_flops=0"),
    ("verdict.margin=null", "verdict.margin=None"),
    ("verdict.holm=family", "verdict.holm='family'"),
    ("verdict.primary={arms:[nope]}", "verdict.primary.arms=['nope']"),
    ("verdict.recipe=[wsd]", "verdict.recipe=['wsd']: expected a list of KEY=VALUE training overrides"),
    ("verdict.sequential={first:3,batch:0,cap:12}", "verdict.sequential.batch=0"),
    ("+verdict.sequential={first:4,batch:2,cap:3}", "verdict.sequential.cap=3: below the first batch"),
    ("+verdict.sequential={first:3,batch:3,cap:12,spending:peto}", "verdict.sequential.spending='peto'"),
    ("+verdict.sequential={first:3,batch:3,cap:12,alpha:1.0}", "verdict.sequential.alpha=1.0"),
]


def _check_refused(r, cwd, needle):
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and needle in line, r.stderr
    assert not (cwd / "mlflow.db").exists() or not _runs(cwd)[1]


@pytest.mark.parametrize("bad,needle", BAD_PROTOCOLS)
def test_bad_protocol_is_one_line_and_trains_nothing(tmp_path, shakespeare_path, bad, needle):
    cwd = tmp_path / "job"
    _check_refused(verdict_here(cwd, [*verdict_args(cwd, shakespeare_path), bad]), cwd, needle)


@pytest.mark.slow
def test_bad_protocol_from_the_command_line(tmp_path, shakespeare_path):
    """The same refusal from a real `python -m sweeps.verdict` process: its exit status is 2, its error one line."""
    bad, needle = BAD_PROTOCOLS[0]
    cwd = tmp_path / "job"
    _check_refused(run_cli(cwd, [*verdict_args(cwd, shakespeare_path), bad], module="sweeps.verdict"), cwd, needle)


# The same protocol with its lr stages on a real PostgreSQL server (the storage many machines would share; the
# session's server and a fresh database from tests/conftest.py).
@pytest.mark.slow
def test_protocol_on_postgresql_storage(tmp_path, shakespeare_path, pg_url):
    cwd = tmp_path / "job"
    one_size = "verdict.sizes=[{name:a,budget_flops:1.5e8,overrides:['model.n_embd=16']}]"
    args = [*verdict_args(cwd, shakespeare_path), one_size, "verdict.seeds_largest=1", f"verdict.storage={pg_url}"]
    r = verdict_here(cwd, args)
    assert r.returncode == 0, r.stderr[-3000:]
    from sweeps.storage import normalize_url

    storage = normalize_url(pg_url)
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    assert names == ["tinyverdict.a.learned.lr", "tinyverdict.a.rope.lr"]
    for name in names:
        trials = optuna.load_study(study_name=name, storage=storage).get_trials()
        assert sorted(t.params["optim.lr"] for t in trials if t.state == optuna.trial.TrialState.COMPLETE) == [0.002, 0.02]
    _, runs = _runs(cwd)
    assert sorted((r.data.tags["verdict.arm"], r.data.tags["verdict.stage"]) for r in runs) == [
        ("learned", "lr"), ("learned", "lr"), ("learned", "seeds"), ("rope", "lr"), ("rope", "lr"), ("rope", "seeds")]


# ---------------------------------------------------------------------------------------------- one clean commit
def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def _one_commit(repo, path: str, text: str):
    """A git repository at `repo` whose one commit holds `path` with `text`."""
    (repo / path).parent.mkdir(parents=True)
    (repo / path).write_text(text)
    _git(repo, "init", "-q")
    _git(repo, "add", path)
    _git(repo, "commit", "-q", "-m", "one")
    return repo


def test_the_default_protocol_trains_the_pilots_recipe_and_searches_lr_per_arm():
    """conf/verdict/default.yaml (issue 26 items 1-2): every run composes to the recipe the recipe pilot chose (wsd,
    2% warm-up, 20% linear decay to 0) in the standard parametrization, the lr searched at two seeds per lr with the
    grid grown past an edge; an arm's or the user's own setting wins, and verdict.recipe=[] keeps the experiment's."""
    from ablations.compose import compose
    from sweeps.protocol import ProtocolArm, load_spec

    def optim_of(argv, arm_overrides=None):
        p = load_spec(["experiment=norms", *argv])
        arm = p.arms[1] if arm_overrides is None else ProtocolArm("cosine", "f", arm_overrides)
        cfg = compose(p.run_overrides(arm, p.sizes[0]))
        return p, (cfg.optim.schedule, cfg.optim.warmup_frac, cfg.optim.decay_frac, cfg.optim.min_lr,
                   cfg.model.parametrization)

    p, optim = optim_of([])
    assert optim == ("wsd", 0.02, 0.2, 0.0, "sp")
    assert p.lr_seeds == (100, 101) and p.lr_extend == 2 and p.lr_transfer_from is None
    # issue 36: the sequential seeds and the lr walk, the design the replay and the simulation chose
    assert p.stop_early and p.sequential.looks() == tuple(range(3, 13)) and p.sequential.spending == "obrien-fleming"
    assert p.lr_search == "walk" and p.seeds == 12
    assert optim_of(["optim.schedule=cosine"])[1][0] == "cosine"  # the user's override comes last
    assert optim_of([], ("optim.schedule=cosine",))[1][0] == "cosine"  # an arm's comes after the recipe too
    # without the recipe: the experiment's own (the harness's cosine with its 3e-4 floor)
    assert optim_of(["verdict.recipe=[]"])[1][:4] == ("cosine", None, 0.2, 3e-4)


def test_guard_refuses_a_dirty_tree_and_other_commits(tmp_path):
    from sweeps.verdict import VerdictError, check_commit, git_tree

    repo = _one_commit(tmp_path / "repo", "sweeps/x.py", "a = 1\n")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert check_commit(repo, False, {}) == head  # clean: the commit every run will use
    (repo / "reports").mkdir()
    (repo / "reports" / "index.md").write_text("generated\n")
    assert check_commit(repo, False, {head: 3}) == head  # an untracked report is not code
    (repo / "sweeps" / "x.py").write_text("a = 2\n")
    with pytest.raises(VerdictError, match=r"uncommitted changes \(sweeps/x.py\).*verdict.allow_dirty=true"):
        check_commit(repo, False, {})
    assert check_commit(repo, True, {}) == head  # told to: goes ahead (the runs carry verdict.allow_dirty=true)
    _git(repo, "checkout", "-q", "--", "sweeps/x.py")
    (repo / "sweeps" / "new.py").write_text("b = 1\n")  # untracked code could be imported: dirty too
    assert git_tree(repo)[1] == ["sweeps/new.py"]
    with pytest.raises(VerdictError, match="uncommitted"):
        check_commit(repo, False, {})
    (repo / "sweeps" / "new.py").unlink()
    with pytest.raises(VerdictError, match=r"another commit \(0123456789ab: 5 runs\)"):
        check_commit(repo, False, {head: 2, "0123456789abcdef": 5})
    with pytest.raises(VerdictError, match="not a git checkout"):
        check_commit(tmp_path / "nowhere", False, {})


def test_guard_refuses_runs_in_another_precision():
    from sweeps.verdict import VerdictError, check_precision

    here = ("32-true", "auto: CPU without native bf16")
    assert check_precision(here, {}) == "32-true"  # a new protocol: this machine's precision
    assert check_precision(here, {"32-true": 7}) == "32-true"
    with pytest.raises(VerdictError, match=r"^433 run\(s\) of this protocol trained in bf16-mixed; here trainer\.precision "
                       r"resolves to 32-true \(auto: CPU without native bf16\): continue on a machine where it "
                       r"resolves to bf16-mixed, or pass trainer\.precision=bf16-mixed \(recorded on every run\)$"):
        check_precision(here, {"bf16-mixed": 433})
    with pytest.raises(VerdictError, match=r"already trained in 2 precisions \(bf16-mixed: 430, 32-true: 6\): delete"):
        check_precision(("bf16-mixed", "configured"), {"32-true": 6, "bf16-mixed": 430})


def test_verdict_in_another_precision_than_its_runs_is_one_line_and_trains_nothing(tmp_path, shakespeare_path):
    """A study resumed on a machine where trainer.precision=auto resolves otherwise (an AVX2 CPU after AVX512-BF16
    ones) is refused before anything trains; the runs' own `precision` tag is what the guard reads."""
    from mlflow import MlflowClient

    cwd = tmp_path / "job"
    cwd.mkdir()
    c = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    run = c.create_run(c.create_experiment("tinyverdict"),
                       tags={"verdict.protocol": "tinyverdict", "precision": "bf16-mixed"})
    c.set_terminated(run.info.run_id)
    r = verdict_here(cwd, [*verdict_args(cwd, shakespeare_path), "trainer.precision=32-true"])
    assert r.returncode == 2, r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "1 run(s) of this protocol trained in bf16-mixed; here trainer.precision " \
        "resolves to 32-true (configured)" in line, r.stderr
    assert [x.info.run_id for x in _runs(cwd)[1]] == [run.info.run_id]  # nothing trained


def test_verdict_refuses_before_training_anything(tmp_path):
    from sweeps.verdict import ProtocolArm, ProtocolSpec, Size, Verdict, VerdictError

    repo = _one_commit(tmp_path / "repo", "conf/a.yaml", "a: 1\n")
    (repo / "conf" / "a.yaml").write_text("a: 2\n")
    calls = []
    spec = ProtocolSpec(name="guarded", experiment=None, baseline="a", arms=[ProtocolArm("a", "f", ())],
                        sizes=[Size("s", 1e8, ())], seeds=1, seeds_largest=1, lr_grid=[1e-3], lr_seed=0,
                        storage=f"sqlite:///{tmp_path}/optuna.db", overrides=[f"tracking.uri=sqlite:///{tmp_path}/m.db"],
                        margin=0.02, margin_reason="r")
    with pytest.raises(VerdictError, match="uncommitted"):
        Verdict(spec, train_fn=lambda *a, **k: calls.append(1), repo=repo).run()
    assert calls == []


# ---------------------------------------------------------------------------------------------- local workers
def test_my_seeds_split_every_pair_once():
    from sweeps.protocol import ProtocolArm, ProtocolSpec, Size

    arms = [ProtocolArm("a", "f", ()), ProtocolArm("b", "f", ()), ProtocolArm("c", "f", ())]
    spec = ProtocolSpec(name="w", experiment=None, baseline="a", arms=arms, sizes=[Size("s", 1e8, ())], seeds=5,
                        seeds_largest=5, lr_grid=[1e-3], lr_seed=0, storage="sqlite:///x.db", overrides=[])
    assert spec.my_seeds(0, arms) == {"a": [1, 2, 3, 4, 5], "b": [1, 2, 3, 4, 5], "c": [1, 2, 3, 4, 5]}
    shares = []
    for i in range(2):
        spec.worker = (i, 2)
        shares.append(spec.my_seeds(0, arms))
    got = sorted((a, s) for share in shares for a, seeds in share.items() for s in seeds)
    assert got == sorted((a.name, s) for a in arms for s in range(1, 6))  # every (arm, seed) exactly once
    assert all(len(s) >= 2 for share in shares for s in share.values())  # each worker gets a mix of every arm


@pytest.mark.slow
def test_two_workers_share_the_lr_study_and_split_the_seeds(tmp_path, shakespeare_path):
    cwd = tmp_path / "job"
    one_size = "verdict.sizes=[{name:a,budget_flops:1.5e8,overrides:['model.n_embd=16']}]"
    args = [*verdict_args(cwd, shakespeare_path), one_size, "verdict.seeds_largest=3", "verdict.workers=2"]
    r = verdict_here(cwd, args)  # the launcher here, its two workers real `python -m sweeps.verdict` processes
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    assert "worker 0/2" in r.stdout and "worker 1/2" in r.stdout and "workers done, exit codes [0, 0]" in r.stdout
    _, runs = _runs(cwd)
    assert all(run.info.status == "FINISHED" for run in runs)
    keys = sorted((t["verdict.arm"], t["verdict.stage"], t["seed"], run.data.params["optim.lr"])
                  for run in runs for t in [run.data.tags])
    assert len(keys) == len(set(keys)) == 2 * 2 + 2 * 3  # each lr of the grid once, each seed once, per arm
    for arm in ("learned", "rope"):
        assert sorted(k[2] for k in keys if k[0] == arm and k[1] == "seeds") == ["1", "2", "3"]
