"""Re-run a recorded MLflow run from its saved config: `python -m ablations.rerun run_id=<id> [check=true] [overrides]`.

Fetches the run's `config.yaml` artifact (the fully resolved config, logged when the run starts, so FAILED and
KILLED runs have it too), applies `key=value` overrides (dotted keys of that config; `+key=value` adds a key), and
trains it again with `ablations.train.train` into the same store and experiment. The new run keeps the original's
`variant` and `choice.*` tags (extended by any non-infrastructure override), is tagged `rerun_of=<id>` and
`rerun_overrides`, and runs with the original's thread count where this machine has that many cores. At the end it
compares the train/loss and val/loss curves with the original's, tags the new run `rerun_match=identical|differs`,
and prints the environment tags that differ (torch version, threads, CPU, git commit, data fingerprint, ...), which
explain a difference. `check=true` exits 1 when the curves differ.

The recorded config does not depend on conf/ any more: a re-run after conf/ changed still trains the recorded
config. The store: `tracking.uri=<uri>` on this command, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile

from omegaconf import DictConfig, OmegaConf

from .cli import Command, Option
from .compose import CONF_DIR
from .errors import AblationsError, ConfigError, exit_code

COMMAND = Command(
    "ablations.rerun", "run_id=<id> [check=true] [tracking.uri=URI] [key=value ...]", __doc__.split("\n\n")[0],
    options=(Option("run_id", "the MLflow run to re-run (a bare id works too)", parse=str),
             Option("check", "exit 1 when the curves differ from the original's", False, switch=True),
             Option("tracking.uri", "the store (default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
                    parse=str)),
    rest="dotted keys of the run's recorded config (`+key=value` adds one), e.g. seed=1 trainer.max_steps=50",
    positional="the run id", examples=("run_id=<id> seed=1", "run_id=<id> check=true"))


def parse_args(argv: list[str]) -> tuple[str, list[str], bool, str | None]:
    """-> (run_id, overrides, check, tracking_uri)."""
    o, rest = COMMAND.parse_or_help(argv)
    bare = [a for a in rest if "=" not in a]
    run_id = o["run_id"] or (bare[0] if bare else None)
    if len(bare) > 1 or bare and o["run_id"]:
        raise ConfigError(f"one run id, not {bare}: python -m ablations.rerun run_id=<id> [key=value ...]")
    if not run_id:
        raise ConfigError("run_id=<MLflow run id> is required: python -m ablations.rerun --help")
    return run_id, [a for a in rest if "=" in a], bool(o["check"]), o["tracking.uri"]


def fetch_config(cl, run_id: str, uri: str) -> tuple[DictConfig, object]:
    """-> (the run's recorded config, the MLflow run)."""
    from mlflow.exceptions import MlflowException

    from .tracking import get_run

    run = get_run(cl, run_id, uri)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = cl.download_artifacts(run_id, "config.yaml", tmp)
        except (MlflowException, OSError):  # no such artifact (the store raises one or the other)
            raise ConfigError(f"run {run_id} has no config.yaml artifact (status {run.info.status}; runs recorded "
                              f"before the config was logged at start only have it once FINISHED)") from None
        cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig) or "model" not in cfg or "seed" not in cfg:
        raise ConfigError(f"run {run_id}: config.yaml is not a config of this harness (no model/seed)")
    return cfg, run


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """`key=value` sets an existing dotted key (YAML-typed value, as on the Hydra command line); `+key=value` adds one.

    Group choices (`norm=rmsnorm`) cannot be re-composed from a resolved config: train that variant with
    `python -m ablations.run`."""
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    for o in overrides:
        k, v = o.split("=", 1)
        add = k.startswith("+")
        k = k.lstrip("+")
        if not k:
            raise ConfigError(f"override {o!r} has no key")
        missing = OmegaConf.select(cfg, k, default="__missing__") == "__missing__"
        if missing and not add:
            raise ConfigError(f"{k} is not a key of the recorded config: check the spelling, or use +{k}={v} to add it")
        old = OmegaConf.select(cfg, k)
        if isinstance(old, DictConfig) and (CONF_DIR / k).is_dir():
            raise ConfigError(f"{k}={v}: a group choice cannot be changed on a re-run of a recorded config: run "
                              f"`python -m ablations.run {k}={v} ...` instead, or override its keys ({k}.<key>=...)")
        parsed = OmegaConf.from_dotlist([f"x={v}"]).x if v != "" else ""
        OmegaConf.update(cfg, k, parsed, merge=False, force_add=True)
    return cfg


def _name_tokens(name: str) -> list[tuple[str, str]]:
    return [tuple(t.split("=", 1)) if "=" in t else (t, None) for t in (name or "").split()]


def run_name(original: str | None, overrides: list[str]) -> str:
    """The original's run name with overridden keys replaced (e.g. `norm=rmsnorm seed=1` + seed=2 -> ...seed=2)."""
    from .tracking import NAME_SKIP_PREFIXES

    toks = [] if original in (None, "", "default") else _name_tokens(original)
    for o in overrides:
        k, v = o.split("=", 1)
        k = k.lstrip("+")
        if k.startswith(NAME_SKIP_PREFIXES):
            continue
        for i, (tk, _) in enumerate(toks):
            if tk.lstrip("+~") == k:
                toks[i] = (tk, v)
                break
        else:
            toks.append((k, v))
    return " ".join(k if v is None else f"{k}={v}" for k, v in toks) or "default"


def rerun_tags(run, overrides: list[str]) -> dict[str, str]:
    from .tracking import INFRA_PREFIXES

    tags = {k: v for k, v in run.data.tags.items() if k == "variant" or k.startswith("choice.")}
    changed = [o.lstrip("+") for o in overrides
               if o.split("=", 1)[0].lstrip("+") != "seed" and not o.lstrip("+").startswith(INFRA_PREFIXES)]
    if changed:
        base = tags.get("variant", "baseline")
        tags["variant"] = " ".join(([] if base == "baseline" else [base]) + changed)
    tags["rerun_of"] = run.info.run_id
    tags["rerun_overrides"] = " ".join(overrides) or "none"
    tags["mlflow.runName"] = run_name(run.info.run_name, overrides)
    return tags


def match_threads(run) -> str | None:
    """Use the original's intra-op thread count (it changes float reduction order); -> a note for the user."""
    import torch

    want = run.data.tags.get("num_threads")
    if not (want and want.isdigit()) or int(want) == torch.get_num_threads():
        return None
    want = int(want)
    if want > (os.cpu_count() or 1):
        return (f"the original ran with {want} threads, this machine has {os.cpu_count()} cores: keeping "
                f"{torch.get_num_threads()} (the curve may differ in the last digits)")
    torch.set_num_threads(want)
    return f"using the original's {want} threads"


def rerun(run_id: str, overrides: list[str] = (), tracking_uri: str | None = None, callbacks=()) -> dict:
    """Train run `run_id`'s recorded config again (with `overrides`); -> train()'s result plus `rerun_of`,
    `comparison` (ablations.repro.compare_curves) and `environment_diff` (tags that differ from the original)."""
    from . import tracking as trk
    from .repro import compare_curves, environment_diff
    from .train import train

    overrides = list(overrides)
    uri = tracking_uri or trk.tracking_uri(None)
    trk.check_reachable(uri)
    cl = trk.client(uri)
    cfg, run = fetch_config(cl, run_id, uri)
    if not any(o.split("=", 1)[0].lstrip("+") == "resume" for o in overrides):
        cfg.resume = None  # never continue (or reopen) the original's checkpoint / MLflow run
    cfg = apply_overrides(cfg, overrides)
    cfg.tracking.uri = uri  # the re-run goes into the store it was read from
    import torch

    threads = torch.get_num_threads()
    note = match_threads(run)
    if note:
        print(f"[ablations.rerun] {note}", flush=True)
    try:
        result = train(cfg, callbacks=callbacks, tags=rerun_tags(run, overrides))
    finally:
        torch.set_num_threads(threads)
    new = result["run_id"]
    cmp = compare_curves(cl, run_id, new)
    env = environment_diff(run.data.tags, cl.get_run(new).data.tags)
    cl.set_tag(new, "rerun_match", "identical" if cmp["identical"] else "differs")
    return {**result, "rerun_of": run_id, "comparison": cmp, "environment_diff": env}


def summary(r: dict, overrides) -> str:
    cmp = r["comparison"]
    pts = ", ".join(f"{k} {v['points']} points" for k, v in cmp["metrics"].items())
    if cmp["identical"]:
        line = f"[ablations.rerun] run {r['run_id']} reproduces {r['rerun_of']}: identical curves ({pts})"
    else:
        bad = "; ".join(f"{k}: first difference at step {v['first_diff_step']}, max |diff| {v['max_abs_diff']:.3g}"
                        for k, v in cmp["metrics"].items() if not v["identical"])
        line = f"[ablations.rerun] run {r['run_id']} DIFFERS from {r['rerun_of']}: {bad}"
        if overrides:
            line += f" (overrides: {' '.join(overrides)})"
    env = r["environment_diff"]
    if env:
        line += "\n[ablations.rerun] environment differences (original -> re-run): " + "; ".join(
            f"{k}: {a} -> {b}" for k, (a, b) in env.items())
    elif not cmp["identical"]:
        line += "\n[ablations.rerun] no recorded environment difference"
    return line


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    logging.getLogger("ablations").setLevel(logging.INFO)
    argv = sys.argv[1:] if argv is None else argv
    try:
        run_id, overrides, check, uri = parse_args(argv)
        r = rerun(run_id, overrides, uri)
    except AblationsError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return exit_code(e)
    print(summary(r, overrides), flush=True)
    return 1 if check and not r["comparison"]["identical"] else 0


if __name__ == "__main__":
    sys.exit(main())
