"""``python -m sweeps.submit N [HYDRA OVERRIDES] -- WORKER ARGS``: N sweep workers on one study, submitted as one
Hydra multirun (``worker=0..N-1``) through Hydra's submitit launcher: with ``hydra/launcher=submitit_slurm`` one
SLURM job array, with ``hydra/launcher=submitit_local`` (the default) N local processes. Each job runs
``python -m sweeps.run WORKER ARGS`` (or ``command=sweeps.verdict``: the verdict protocol's workers); the study's
storage (``sweep.storage=postgresql://...``) and budget lock share the trials between them exactly as between
workers started by hand. Waits for the jobs (as Hydra's launcher does) and exits non-zero if any worker failed.

    python -m sweeps.submit 8 hydra/launcher=submitit_slurm hydra.launcher.partition=gpu -- \\
        sweep=architecture sweep.storage=postgresql://u:pw@db:5432/sweeps tracking.uri=http://mlflow-host:5000
    python -m sweeps.submit 4 command=sweeps.verdict hydra/launcher=submitit_slurm -- verdict=second-study \\
        verdict.storage=postgresql://u:pw@db:5432/sweeps tracking.uri=http://mlflow-host:5000

Needs the plugin: ``pip install -e '.[cluster]'``. The launcher's settings are conf/hydra/launcher/*.yaml.
"""
from __future__ import annotations

import re
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

COMMANDS = ("sweeps.run", "sweeps.verdict")


@dataclass
class SubmitConf:
    defaults: list[Any] = field(default_factory=lambda: [{"override hydra/launcher": "submitit_local"}, "_self_"])
    worker: int = 0                 # this job's index: the multirun sweeps worker=0..N-1
    command: str = "sweeps.run"     # the module every worker runs (COMMANDS)
    args: list[str] = field(default_factory=list)  # its arguments (what follows `--`)


class WorkerFailed(RuntimeError):
    """A worker exited non-zero: the job fails, so the launcher (and this command) reports it."""


def parse_args(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """`N [hydra overrides] -- worker args` -> (N, hydra overrides, worker args); one-line ValueError if malformed."""
    if "--" not in argv:
        raise ValueError("no `--`: python -m sweeps.submit N [hydra overrides] -- sweep=... (worker arguments)")
    cut = argv.index("--")
    head, tail = argv[:cut], argv[cut + 1:]
    if not head or not head[0].isdigit() or int(head[0]) < 1:
        raise ValueError(f"first argument {head[0] if head else '(none)'!r} must be the number of workers, e.g. 8")
    for a in head[1:]:
        if a.startswith("command=") and a.split("=", 1)[1] not in COMMANDS:
            raise ValueError(f"{a}: use one of {', '.join('command=' + c for c in COMMANDS)}")
    return int(head[0]), head[1:], tail


def quoted_list(items: list[str]) -> str:
    """A Hydra override value: the list of `items` as quoted strings (URLs with ':' and '@', values with ',').
    Hydra's grammar: a backslash escapes only a quote, or backslashes before a quote (or the closing one)."""
    def quote(s: str) -> str:
        return "'" + re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), s) + "'"

    return "[" + ",".join(quote(s) for s in items) + "]"


def run_worker(cfg) -> int:
    """The job: one worker process; its exit code 0, else WorkerFailed."""
    cmd = [sys.executable, "-m", str(cfg.command), *[str(a) for a in cfg.args]]
    print(f"[sweeps.submit] worker {cfg.worker}: {' '.join(cmd[1:])}", flush=True)
    code = subprocess.run(cmd).returncode
    if code:
        raise WorkerFailed(f"worker {cfg.worker}: python -m {cfg.command} exited with status {code}")
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m sweeps.submit N [hydra overrides: command=..., hydra/launcher=...] -- WORKER ARGS\n")
        print(__doc__)
        return 0
    try:
        n, hydra_args, worker_args = parse_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        print("error: sweeps.submit needs Hydra's submitit launcher: pip install -e '.[cluster]'", file=sys.stderr)
        return 2
    import hydra
    from hydra.core.config_store import ConfigStore

    from ablations.compose import VERSION_BASE

    ConfigStore.instance().store(name="sweeps_submit", node=SubmitConf)
    warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")
    sys.argv = [sys.argv[0], "-m", f"worker=range({n})", *hydra_args, f"args={quoted_list(worker_args)}"]
    app = hydra.main(version_base=VERSION_BASE, config_path="../conf", config_name="sweeps_submit")(run_worker)
    app()
    return 0


if __name__ == "__main__":
    sys.exit(main())
