"""`python -m ablations.run [-m] [overrides]`: train the composed config and record it in MLflow.

Ends with one summary line (final val loss/bpb, tokens/sec, MLflow run id, how to open the UI).
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig

from ablations.compose import CONF_DIR

os.environ.setdefault("HYDRA_FULL_ERROR", "0")
# conf/hydra/launcher/submitit_*.yaml replace the plugin's defaults under the same names (every key given): Hydra
# still checks them against the plugin's schema, and says so in a deprecation warning at every launch
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")


_FAILED: list[int] = []  # exit codes of failed jobs of a multirun (the basic launcher runs jobs in-process)


def _is_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _ui_hint(uri: str) -> str:
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}"


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from .errors import AblationsError, exit_code
    from .tracking import tracking_uri
    from .train import train

    logging.getLogger("ablations").setLevel(logging.INFO)
    try:
        r = train(cfg)
    except AblationsError as e:
        # one clear line; the MLflow run (if any) is already marked FAILED
        print(f"error: {e}", file=sys.stderr, flush=True)
        code = exit_code(e)
        if _is_multirun():  # let the other jobs of the sweep run; exit non-zero at the end
            _FAILED.append(code)
            return None
        sys.exit(code)
    if not r.get("run_id"):
        return None
    uri = tracking_uri(cfg)

    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "n/a"

    print(f"[ablations] done: val_loss {f(r['val_loss'], '.4f')} | val_bpb {f(r['val_bpb'], '.4f')} | "
          f"{f(r['tokens_per_sec'], ',.0f')} tokens/s | mfu {f(r['mfu'], '.1%')} | steps {r['steps']} | "
          f"mlflow run {r['run_id']} | view: {_ui_hint(uri)}", flush=True)
    return r.get("val_bpb")


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
    import difflib

    from ablations.compose import compose
    from hydra.errors import HydraException
    from omegaconf import DictConfig, OmegaConf

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


if __name__ == "__main__":
    _err = check_group_overrides(sys.argv[1:]) or check_config_dir(sys.argv[1:]) or check_config_keys(sys.argv[1:])
    if _err:
        print(_err, file=sys.stderr)
        sys.exit(2)
    main()
    if _FAILED:
        print(f"error: {len(_FAILED)} job(s) of this multirun failed (see the lines above and their MLflow runs)",
              file=sys.stderr)
        sys.exit(max(_FAILED))
