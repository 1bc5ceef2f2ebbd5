"""Sweeps without training: search spaces, config errors, budget accounting, failure handling (fake objective)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeps.run import main
from sweeps.space import SearchSpace, SpaceError, format_value, to_overrides
from sweeps.storage import budget_used, mask_url

REPO = Path(__file__).resolve().parents[1]


def test_shipped_sweeps_parse():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from sweeps.settings import SweepSettings, available_sweeps

    names = available_sweeps()
    assert {"lr", "architecture", "pareto"} <= set(names)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for name in names:
            cfg = compose(config_name="config", overrides=[f"sweep={name}"])
            s = SweepSettings.from_config(name, OmegaConf.to_container(cfg.sweep, resolve=True))
            assert s.space.params and s.n_trials >= 1
    pareto = SweepSettings.from_config("pareto", OmegaConf.to_container(
        OmegaConf.load(REPO / "conf/sweep/pareto.yaml"), resolve=True))
    assert [(o.metric, o.direction) for o in pareto.objectives] == [
        ("val_bpb", "minimize"), ("kv_cache_bytes_per_token", "minimize"), ("tokens_per_sec", "maximize")]


def test_space_suggest_conditions_and_overrides():
    space = SearchSpace.from_config({
        "optim.lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        "data.batch_size": {"type": "int", "low": 8, "high": 32, "step": 8},
        "attention": ["mha", "gqa", "sliding"],
        "attention.n_kv_head": {"type": "categorical", "choices": [1, 2], "when": {"attention": "gqa"}},
        "attention.window": {"choices": [16, 32], "when": {"attention": ["sliding"]}},
    })
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        params = space.suggest(trial)
        seen.add(params["attention"])
        assert ("attention.n_kv_head" in params) == (params["attention"] == "gqa")
        assert ("attention.window" in params) == (params["attention"] == "sliding")
        assert 1e-4 <= params["optim.lr"] <= 1e-1 and params["data.batch_size"] in (8, 16, 24, 32)
        study.tell(trial, 0.0)
    assert seen == {"mha", "gqa", "sliding"}
    # values the user pinned satisfy conditions too
    trial = study.ask()
    assert "attention.window" in space.without({"attention"}).suggest(trial, fixed={"attention": "sliding"})
    assert to_overrides({"norm": "rmsnorm", "optim.lr": 0.001, "norm.qk_norm": True, "x": None, "s": "a b"}) == [
        "norm=rmsnorm", "optim.lr=0.001", "norm.qk_norm=true", "x=null", "s='a b'"]
    assert format_value("null") == "'null'"


def test_variants_space_is_every_variant_with_a_conf_file():
    """`{type: variants}` expands from modules.registry: the same names as the family's conf/<family>/*.yaml."""
    from omegaconf import OmegaConf

    from sweeps.settings import SweepSettings

    space = SearchSpace.from_config({"norm": {"type": "variants"},
                                     "attention": {"type": "variants", "exclude": ["mla"]}})
    choices = {p.key: list(p.distribution.choices) for p in space.params}
    files = {g: sorted(f.stem for f in (REPO / "conf" / g).glob("*.yaml")) for g in ("norm", "attention")}
    assert choices["norm"] == files["norm"] and {"layernorm", "rmsnorm"} <= set(choices["norm"])
    assert choices["attention"] == [n for n in files["attention"] if n != "mla"] and "mha" in choices["attention"]
    arch = SweepSettings.from_config("architecture", OmegaConf.to_container(
        OmegaConf.load(REPO / "conf/sweep/architecture.yaml"), resolve=True))
    shipped = {p.key: list(p.distribution.choices) for p in arch.space.params}
    assert shipped["position"] == sorted(f.stem for f in (REPO / "conf" / "position").glob("*.yaml"))


@pytest.mark.parametrize("space, match", [
    ({}, "empty"),
    ({"optim.lr": {"type": "float", "low": 1.0}}, "missing 'high'"),
    ({"optim.lr": {"type": "gaussian"}}, "unknown type"),
    ({"optim.lr": {"type": "float", "low": 0.0, "high": 1.0, "log": True}}, "optim.lr"),
    ({"optim.lr": {"type": "float", "low": 1e-3, "high": 1e-2, "lg": True}}, "unknown field"),
    ({"optim.lr": {"type": "variants"}}, "is for a model family"),
    ({"norm": {"type": "variants", "exclude": ["batchnorm"]}}, "'batchnorm' is not a norm variant"),
])
def test_space_errors(space, match):
    with pytest.raises(SpaceError, match=match):
        SearchSpace.from_config(space)


def test_budget_counts_retries_once():
    def frozen(number, state, system_attrs=None):
        return optuna.trial.FrozenTrial(number=number, state=state, value=None, values=None, datetime_start=None,
                                        datetime_complete=None, params={}, distributions={}, user_attrs={},
                                        system_attrs=system_attrs or {}, intermediate_values={}, trial_id=number)

    trials = [frozen(0, TrialState.FAIL), frozen(1, TrialState.COMPLETE),
              frozen(2, TrialState.COMPLETE, {"failed_trial": 0, "retry_history": [0]}), frozen(3, TrialState.RUNNING)]
    assert budget_used(trials) == 3
    assert mask_url("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"


def _fake_train(calls):
    def train(cfg, callbacks=(), tags=None):
        calls.append((cfg, tags))
        if cfg.optim.lr > 1.0:
            from ablations.errors import DivergenceError

            raise DivergenceError("loss is nan at step 3")
        return {"run_id": None, "val_bpb": abs(cfg.optim.lr - 3e-3), "val_loss": 1.0, "tokens_per_sec": 1.0,
                "kv_cache_bytes_per_token": 256}
    return train


@pytest.fixture
def conf_copy(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    return conf


def test_invalid_combination_and_divergence_fail_and_study_continues(tmp_path, monkeypatch, conf_copy, capsys):
    (conf_copy / "sweep" / "bad.yaml").write_text("""
study_name: bad
n_trials: 4
objectives: [{metric: val_bpb, direction: minimize}]
sampler: {name: random, seed: 0}
pruner: {name: none}
overrides: [model=tiny]
enqueue:
  - {attention: gqa, attention.n_kv_head: 3, optim.lr: 0.003}
  - {attention: gqa, attention.n_kv_head: 2, optim.lr: 5.0}
  - {attention: gqa, attention.n_kv_head: 2, optim.lr: 0.003}
  - {attention: mha, optim.lr: 0.001}
space:
  attention: [mha, gqa]
  attention.n_kv_head: {type: categorical, choices: [2, 3], when: {attention: gqa}}
  optim.lr: {type: categorical, choices: [0.001, 0.003, 5.0]}
""")
    monkeypatch.chdir(tmp_path)
    calls = []
    assert main(["sweep=bad"], train_fn=_fake_train(calls), conf_dir=conf_copy) == 0
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="bad", storage="sqlite:///optuna.db")
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert "invalid model config" in trials[0].user_attrs["fail_reason"] and "n_kv_head" in trials[0].user_attrs["fail_reason"]
    assert trials[1].user_attrs["fail_reason"].startswith("DivergenceError: loss is nan")
    assert len(calls) == 3  # the invalid combination never reached training
    cfg, tags = calls[-1]
    assert tags["optuna.study"] == "bad" and tags["optuna.trial"] == "3"
    assert cfg.attention.name == "mha" and cfg.model.n_layer == 2  # group override + sweep overrides applied
    assert cfg.tracking.experiment == "bad" and "hydra" not in cfg
    assert "best trial 2" in out
    # re-running resumes: n_trials is the study's total, so nothing new runs ...
    assert main(["sweep=bad"], train_fn=_fake_train(calls), conf_dir=conf_copy) == 0
    assert len(study.get_trials()) == 4 and len(calls) == 3
    # ... and a larger total adds exactly the difference
    assert main(["sweep=bad", "sweep.n_trials=6"], train_fn=_fake_train(calls), conf_dir=conf_copy) == 0
    assert len(study.get_trials()) == 6


def test_an_interrupted_trial_is_run_again_when_the_study_resumes(tmp_path, monkeypatch, conf_copy):
    """A worker stopped (SIGTERM: SystemExit 143, as train() raises it) in the middle of a trial: the trial is FAIL,
    not a failed point; the study, run again, trains that point again within its budget (as a lr walk resumed after
    a session stop must), and a finished study then runs nothing more."""
    (conf_copy / "sweep" / "grid3.yaml").write_text("""
study_name: grid3
n_trials: 3
objectives: [{metric: val_bpb, direction: minimize}]
sampler: {name: grid}
pruner: {name: none}
overrides: [model=tiny]
space:
  optim.lr: {type: categorical, choices: [0.001, 0.003, 0.01]}
""")
    monkeypatch.chdir(tmp_path)
    calls = []
    done = _fake_train(calls)

    def stopped_at_0003(cfg, callbacks=(), tags=None):
        if cfg.optim.lr == 0.003 and not any(c.optim.lr == 0.003 for c, _ in calls):
            calls.append((cfg, tags))
            raise SystemExit(143)
        return done(cfg, callbacks, tags)

    with pytest.raises(SystemExit):  # the worker stops at 0.003, wherever the grid's order puts it
        main(["sweep=grid3"], train_fn=stopped_at_0003, conf_dir=conf_copy)
    assert main(["sweep=grid3"], train_fn=stopped_at_0003, conf_dir=conf_copy) == 0
    study = optuna.load_study(study_name="grid3", storage="sqlite:///optuna.db")
    done_lrs = sorted(t.params["optim.lr"] for t in study.get_trials() if t.state == TrialState.COMPLETE)
    assert done_lrs == [0.001, 0.003, 0.01]  # 0.003 trained again: every point of the grid has a value
    (failed,) = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert failed.params["optim.lr"] == 0.003 and "SystemExit" in failed.user_attrs["fail_reason"]
    assert [c.optim.lr for c, _ in calls].count(0.003) == 2 and len(calls) == 4
    assert main(["sweep=grid3"], train_fn=stopped_at_0003, conf_dir=conf_copy) == 0
    assert len(calls) == 4  # the budget is the study's total: the retry replaced the interrupted trial


def test_user_override_pins_a_searched_key(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    calls = []
    assert main(["sweep=lr", "sweep.n_trials=2", "optim.lr=0.002", "model=tiny", "sweep.enqueue=[]"],
                train_fn=_fake_train(calls)) == 0
    assert "not searching optim.lr" in capsys.readouterr().out
    assert [c.optim.lr for c, _ in calls] == [0.002, 0.002]
    assert all("optim.lr" not in t.params for t in optuna.load_study(study_name="lr", storage="sqlite:///optuna.db").trials)


@pytest.mark.parametrize("argv, expected", [
    (["sweep=nope"], "unknown sweep 'nope'; valid sweeps: architecture, lr, mup-base, pareto, verdict-lr"),
    ([], "no sweep given: use sweep=<name>; valid sweeps: architecture, lr, mup-base, pareto, verdict-lr"),
    (["sweep=lr", "sweep.storage=nosuchdb://x"], "cannot open Optuna storage nosuchdb://x"),
    (["sweep=lr", "sweep.storage=not a url"], "bad storage URL"),
    (["sweep=lr", "sweep.storage=postgresql://u:pw@127.0.0.1:1/x"], "cannot open Optuna storage postgresql://u:***@"),
    (["sweep=lr", "norm=nonorm"], "available options in 'norm': dyt, layernorm, rmsnorm"),
    (["sweep=lr", "norm=layernorm,rmsnorm"], "is a Hydra multirun sweep"),
    (["sweep=lr", "sweep.pruner.name=asha"], "valid pruners: median, hyperband, none"),
    (["sweep=lr", "sweep.sampler.name=cma"], "valid samplers: tpe, nsga2, random"),
])
def test_bad_input_one_line(tmp_path, monkeypatch, capsys, argv, expected):
    monkeypatch.chdir(tmp_path)
    assert main(argv, train_fn=_fake_train([])) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expected in err and "\n" not in err, err


@pytest.mark.slow
def test_cli_subprocess_unknown_sweep(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sweeps.run", "sweep=nope"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: unknown sweep 'nope'; valid sweeps: architecture, lr, mup-base, "
                                             f"pareto, verdict-lr (files in {REPO / 'conf' / 'sweep'})"]
    assert not (tmp_path / "optuna.db").exists()


def test_samplers_and_pruners_selectable():
    from omegaconf import OmegaConf

    from sweeps.samplers import make_pruner, make_sampler
    from sweeps.settings import SweepSettings

    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf/sweep/lr.yaml"), resolve=True)
    trainer = {"max_steps": 400, "val_check_interval": 50}
    notes = []
    s = SweepSettings.from_config("lr", {**raw, "pruner": {**raw["pruner"], "name": "hyperband"}})
    hb = make_pruner(s, trainer, notes)
    assert isinstance(hb, optuna.pruners.HyperbandPruner)
    assert (hb._min_resource, hb._max_resource) == (50, 400)
    assert any("ignores" in n for n in notes)  # median-only arguments left behind
    assert isinstance(make_pruner(SweepSettings.from_config("lr", raw), trainer), optuna.pruners.MedianPruner)
    notes = []
    assert isinstance(make_pruner(SweepSettings.from_config("lr", raw), {**trainer, "strategy": "ddp"}, notes),
                      optuna.pruners.NopPruner) and "multi-process" in notes[0]
    assert isinstance(make_sampler(SweepSettings.from_config("lr", raw)), optuna.samplers.TPESampler)
    pareto = OmegaConf.to_container(OmegaConf.load(REPO / "conf/sweep/pareto.yaml"), resolve=True)
    assert isinstance(make_sampler(SweepSettings.from_config("pareto", pareto)), optuna.samplers.NSGAIISampler)
    tpe = SweepSettings.from_config("pareto", {**pareto, "sampler": "tpe"})
    assert isinstance(make_sampler(tpe), optuna.samplers.TPESampler)
    notes = []
    assert isinstance(make_pruner(SweepSettings.from_config("pareto", {**pareto, "pruner": "median"}), trainer, notes),
                      optuna.pruners.NopPruner) and "multi-objective" in notes[0]
