"""Config-level checks of the harness (no training): experiments, group options, precision, LR schedule, naming."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablations.lit import resolve_precision
from ablations.compose import check_group_overrides
from ablations.tracking import config_params, hydra_info

CONF = Path(__file__).resolve().parents[1] / "conf"
# the experiments that compare a whole family (docs/ADD_A_VARIANT.md step 5: a new variant joins each)
FAMILIES = {"norms": "norm", "positions": "position", "extrapolation": "position", "mlps": "mlp",
            "attention": "attention"}


@pytest.mark.parametrize("experiment", sorted(FAMILIES))
def test_experiment_compares_every_variant_of_its_family(experiment):
    group = FAMILIES[experiment]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    assert cfg.tracking.experiment == experiment
    assert (cfg.data.name, cfg.tokenizer.name, cfg.model.n_embd) == ("shakespeare", "char", 128)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    variants = sorted(params[group].split(","))
    assert variants == sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert params["seed"] == "0,1,2"


def test_unknown_group_option_message_lists_valid_choices():
    msg = check_group_overrides(["model=tiny", "norm=layernorm,rmsnorm,batchnorm"], CONF)
    assert msg == ("error: norm=batchnorm is not an option of group 'norm': valid options are dyt, layernorm, rmsnorm, "
                   "scalenorm (files in conf/norm/)")
    assert check_group_overrides(["-m", "norm=layernorm,rmsnorm", "optim.lr=1e-3", "experiment=null"], CONF) is None


def test_precision_auto(monkeypatch):
    import ablations.lit as lit

    monkeypatch.setattr(lit, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", "cpu")[0] == "bf16-mixed"
    monkeypatch.setattr(lit, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", "cpu")[0] == "32-true"
    assert resolve_precision("16-mixed", "cpu") == ("16-mixed", "configured")


def test_run_name_variant_and_params_from_overrides():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["norm=rmsnorm", "seed=2", "tracking.uri=sqlite:///x.db", "resume=auto"],
                      return_hydra_config=True)
    name, tags = hydra_info(cfg)
    assert name == "norm=rmsnorm seed=2" and tags["variant"] == "norm=rmsnorm"
    assert tags["choice.norm"] == "rmsnorm" and tags["choice.model"] == "small-cpu"
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    p = config_params(cfg)
    assert p["norm.name"] == "rmsnorm" and p["optim.betas"] == "[0.9, 0.95]" and "resume" not in p


@pytest.mark.parametrize("argv, expected", [
    (["model.n_layers=4"], "error: model.n_layers is not a config key: did you mean model.n_layer?"),
    (["model=tiny", "trainer.max_step=5"], "error: trainer.max_step is not a config key: did you mean trainer.max_steps?"),
    (["-m", "norm=layernorm,rmsnorm", "optim.lrr=1e-3"], "error: optim.lrr is not a config key: did you mean optim.lr?"),
])
def test_unknown_config_key_names_the_closest_keys(argv, expected):
    from ablations.compose import check_config_keys

    msg = check_config_keys(argv, CONF)
    assert msg is not None and msg.startswith(expected) and "\n" not in msg, msg


def test_known_config_keys_pass():
    from ablations.compose import check_config_keys

    assert check_config_keys(["model=tiny", "model.n_layer=3", "trainer.max_steps=5", "norm.qk_norm=true",
                              "+model.extra=1", "experiment=norms", "hydra.job.chdir=true"], CONF) is None
    # a mandatory key (`path: ???` in conf/data/text.yaml) is a known key too
    assert check_config_keys(["data=text", "data.path=/tmp/corpus.txt"], CONF) is None
    # a key that exists only once its group is chosen: the sliding window's width, absent from the default mha
    assert check_config_keys(["attention=sliding", "attention.window=8"], CONF) is None
    assert check_config_keys(["attention.window=8"], CONF).startswith("error: attention.window is not a config key")


def test_progress_lines_cadence():
    from ablations.progress import line_every, wants_lines

    assert line_every(600, 10) == 30  # the default run: 20 lines
    assert line_every(12, 1) == 1 and line_every(1000, 7) == 56  # 50 / 7 rounded up to the logging cadence
    assert wants_lines(open(__file__))  # a file is not a terminal


def test_a_repeated_compose_is_a_fresh_copy_and_sees_edits_and_the_directory(tmp_path, monkeypatch):
    """ablations.compose keeps each compose's result for its repeats (the verdict and sweep loops compose one run's
    config many times): a repeat equals what Hydra composes, is a new object (a caller that edits its config edits
    no other's), and a YAML edited in between, another working directory (hydra.runtime.cwd) or other overrides
    compose anew."""
    import shutil

    from omegaconf import open_dict

    from ablations.compose import config_dir, compose_here

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    monkeypatch.chdir(tmp_path)
    with config_dir(conf):
        first = compose_here(["model=tiny"], hydra_config=True)
        with open_dict(first):
            first.model.n_layer = 99  # a caller edits its copy
        again = compose_here(["model=tiny"], hydra_config=True)
        assert again.model.n_layer != 99
        # unresolved: ${now:...} in hydra.run.dir resolves at each access (the memo keeps it unresolved)
        assert OmegaConf.to_container(again) == OmegaConf.to_container(compose("config", ["model=tiny"], True))
        with open_dict(again):
            again.model.n_layer = 98  # and a caller of a repeat edits its copy
        assert compose_here(["model=tiny"], hydra_config=True).model.n_layer == 2
        assert compose_here(["model=tiny", "seed=7"]).seed == 7
        tiny = conf / "model" / "tiny.yaml"
        tiny.write_text(tiny.read_text().replace("n_layer: 2", "n_layer: 5", 1))
        assert compose_here(["model=tiny"], hydra_config=True).model.n_layer == 5
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        assert compose_here(["model=tiny"], hydra_config=True).hydra.runtime.cwd == str(tmp_path / "elsewhere")
