"""The one way into Hydra outside `@hydra.main`: composing conf/ and checking a command line against it.

`compose(overrides)` gives one config; `config_dir()` initialises Hydra once around several composes;
`compose_run(overrides)` is one training run's config as `@hydra.main` would hand it to `train()`; and
`check_argv(argv)` turns the command-line mistakes Hydra reports in many lines (an unknown group option, an unknown
dotted key, a --config-dir that would be shadowed) into one line. Every command composes through here.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
VERSION_BASE = "1.3"  # the same as @hydra.main's in ablations/run.py


@contextlib.contextmanager
def config_dir(conf_dir: Path | str = CONF_DIR, job_name: str = "app") -> Iterator[None]:
    """Hydra initialised on `conf_dir` for the with-block, so `hydra.compose` works inside it."""
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base=VERSION_BASE,
                               job_name=job_name):
        yield


def compose(overrides: Sequence[str], conf_dir: Path | str = CONF_DIR, job_name: str = "app") -> DictConfig:
    """conf/config.yaml composed with `overrides`, as `python -m ablations.run <overrides>` would compose it."""
    with config_dir(conf_dir, job_name):
        return compose_here(overrides)


def compose_here(overrides: Sequence[str], hydra_config: bool = False) -> DictConfig:
    """conf/config.yaml composed with `overrides` inside `config_dir()` (with the `hydra` node: its sweeper params,
    runtime choices). A repeat of an earlier call in this process is a copy of its result (see _memo_key)."""
    from hydra import compose as hydra_compose

    key = _memo_key(overrides, hydra_config)
    if key is not None and key in _MEMO:
        _MEMO.move_to_end(key)
        return copy.deepcopy(_MEMO[key])
    cfg = hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)
    if key is not None:
        _MEMO[key] = copy.deepcopy(cfg)  # a pristine copy: nothing resolved (${now:} stays per call), none mutated
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return cfg


# A compose costs ~0.25 s of CPU (OmegaConf merges of ~20 YAML files) and a deep copy of its result ~0.02 s; the
# verdict and sweep loops compose one run's config several times (each sequential look, each settings read, each
# tracking-URI poll): measured, 189 of 458 composes in the verdict and sweep tests were repeats.
_MEMO: "OrderedDict[tuple, DictConfig]" = OrderedDict()
_MEMO_SIZE = 64


def _memo_key(overrides: Sequence[str], hydra_config: bool) -> tuple | None:
    """What a compose depends on besides Hydra's own code: the overrides, the job's name, the working directory
    (hydra.runtime.cwd) and the config sources with their files' sizes and times (a YAML edited in between is read
    again); None (no memo) where an override changes the search path or copies environment variables in."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import JobRuntime

    if any("searchpath" in o or "env_copy" in o for o in overrides):
        return None
    sources = GlobalHydra.instance().hydra.config_loader.get_sources()
    stamps = tuple((src.scheme(), src.path, _tree_stamp(src.path) if src.scheme() == "file" else None)
                   for src in sources)
    return tuple(overrides), hydra_config, JobRuntime().get("name"), os.getcwd(), stamps


def _tree_stamp(root: str) -> tuple:
    """(path, size, mtime_ns) of every file under `root`, sorted: changes when a file is added, removed or edited."""
    out = []
    for d, _, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(d, f))
            out.append((os.path.join(d, f), st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def compose_run(overrides: Sequence[str]) -> DictConfig:
    """The training config of one run, inside `config_dir()`: like @hydra.main, HydraConfig.get() works (runtime
    choices, overrides, which ablations.train tags) and the config has no `hydra` key."""
    from hydra.core.hydra_config import HydraConfig

    cfg = compose_here(overrides, hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


# ------------------------------------------------------------------------------- one line for a bad command line


def model_config(cfg: DictConfig, vocab_stand_in: int | None = None):
    """cfg.model resolved into a checked modules.config.GPTConfig; a bad field is a ConfigError naming it.
    `vocab_stand_in`: the vocabulary size to check with while tokenizer.vocab_size is not known yet (the tokenizer
    fills it in as the data loads), so `python -m ablations.run` refuses a bad model.* before importing Lightning."""
    from modules.config import GPTConfig

    from .errors import ConfigError

    d = OmegaConf.to_container(cfg.model, resolve=True)
    if d.get("vocab_size") is None and vocab_stand_in is not None:
        d["vocab_size"] = vocab_stand_in
    try:
        return GPTConfig.from_dict(d)
    except ValueError as e:  # ConfigError (a ValueError): names the field, its value and what would be valid
        raise ConfigError(f"model: {e}") from None


def check_argv(argv: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """The first of the three checks below that fails, as one line (None: Hydra may take the command line)."""
    return check_group_overrides(argv, conf_dir) or check_config_dir(argv, conf_dir) or \
        check_config_keys(argv, conf_dir)


def check_group_overrides(argv: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """One clear line for an unknown group option (Hydra's own message spans many lines)."""
    for a in argv:
        if "=" not in a or a.startswith("-"):
            continue
        key, val = a.split("=", 1)
        key = key.lstrip("+~").split("@", 1)[0]
        gdir = conf_dir / key
        if "." in key or not gdir.is_dir() or any(c in val for c in "()[]*$"):
            continue
        valid = sorted(p.stem for p in gdir.glob("*.yaml") if not p.stem.startswith("_"))  # _gpt: a base
        for v in val.split(","):
            v = v.strip()
            if v and v != "null" and v not in valid:
                return (f"error: {key}={v} is not an option of group '{key}': valid options are "
                        f"{', '.join(valid)} (files in conf/{key}/)")
    return None


def check_config_keys(argv: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """One line for an unknown dotted key (`model.n_layers=4`), naming the closest valid keys; Hydra's own error
    spans several lines. Composes the config with the command's group choices, so `experiment=` keys count."""
    from hydra.errors import HydraException

    if any(a.startswith(("--config-path", "-cp", "--config-name", "-cn")) for a in argv):
        return None  # another primary config (e.g. a recorded run's): Hydra checks its keys
    pairs = [a.split("=", 1) for a in argv if "=" in a and not a.startswith("-")]
    dotted = [k for k, _ in pairs if "." in k and not k.startswith(("+", "~", "hydra."))]
    if not dotted:
        return None
    groups = [f"{k}={v}" for k, v in pairs if "." not in k and (conf_dir / k.lstrip("+~")).is_dir()
              and not any(c in v for c in "(),[]*$")]  # a multirun sweep: its first choice is not known here
    try:
        cfg = compose(groups, conf_dir)
    except HydraException:
        return None  # Hydra reports the bad group choice itself
    for key in dotted:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
        if not isinstance(node, DictConfig):
            node, leaf = cfg, key.split(".", 1)[0]  # the top of the key is unknown already
            if leaf in node.keys():  # keys(), not `in node`: a mandatory `???` value is "not in" a DictConfig
                continue
        elif leaf in node.keys():
            continue
        where = f"{parent}." if node is not cfg else ""
        close = difflib.get_close_matches(leaf, [str(k) for k in node.keys()], n=3, cutoff=0.5)
        hint = (f"did you mean {', '.join(where + c for c in close)}?" if close else
                f"valid keys are {', '.join(where + str(k) for k in node.keys())}")
        return f"error: {key} is not a config key: {hint} (add a new key with +{key}=...)"
    return None


def check_config_dir(argv: list[str], conf_dir: Path = CONF_DIR) -> str | None:
    """`--config-dir DIR` only adds DIR to the search path *after* conf/: a recorded `config.yaml` there would be
    silently shadowed by conf/config.yaml. Refuse that instead of training the default config."""
    def value(*names):
        for i, a in enumerate(argv):
            for n in names:
                if a == n and i + 1 < len(argv):
                    return argv[i + 1]
                if a.startswith(n + "="):
                    return a.split("=", 1)[1]
        return None

    cdir = value("--config-dir", "-cd")
    if not cdir:
        return None
    name = value("--config-name", "-cn") or "config"
    fname = name if name.endswith(".yaml") else f"{name}.yaml"
    if (Path(cdir) / fname).is_file() and (conf_dir / fname).is_file() and \
            Path(cdir).resolve() != conf_dir.resolve():
        return (f"error: --config-dir {cdir} does not replace conf/: --config-name {name} still names "
                f"conf/{fname}. To train a recorded config use `--config-path {Path(cdir).resolve()} --config-name "
                f"{name}`, or better `python -m ablations.rerun run_id=<id>` (keeps the run's variant tags)")
    return None
