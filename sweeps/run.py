"""``python -m sweeps.run sweep=<name> [sweep.n_trials=N] [sweep.storage=URL] [any hydra override]``

Create, join or resume the Optuna study described by ``conf/sweep/<name>.yaml`` and run trials through
``ablations.train.train`` until the study has ``sweep.n_trials`` trials in total (over all workers and runs).
Start the same command on several machines with a shared ``sweep.storage=postgresql://...`` to add workers;
``sweep.workers=N|auto`` starts N of them on this machine (``sweeps.workers.launch_workers``).
"""
from __future__ import annotations

import logging
import os
import sys

USAGE = """usage: python -m sweeps.run sweep=<name> [sweep.KEY=VALUE ...] [any hydra override ...]

Runs (or joins, or resumes) the Optuna study of conf/sweep/<name>.yaml; each trial is one
ablations.train.train run recorded in MLflow (tags optuna.study, optuna.trial).

  sweep.n_trials=N          the study's TOTAL number of trials, over all workers and invocations
  sweep.storage=URL         sqlite:///optuna.db (default) | postgresql://user:pass@host:5432/db (many workers)
  sweep.study_name=NAME     a fresh study (default: the name in the YAML)
  sweep.sampler.name=S      tpe | nsga2 | random
  sweep.pruner.name=P       median | hyperband | none (single-objective only)
  sweep.timeout=SECONDS     this worker starts no new trial after that long
  sweep.workers=N|auto      N worker processes here, one study (auto: one per visible GPU, each pinned with
                            CUDA_VISIBLE_DEVICES; on CPU one per core); the cores are split between them
  model=tiny trainer.max_steps=100 ...   any override of the training config, applied to every trial

examples:
  python -m sweeps.run sweep=lr
  python -m sweeps.run sweep=architecture sweep.n_trials=20 trainer.max_steps=300
  python -m sweeps.run sweep=pareto sweep.storage=postgresql://user:pass@dbhost/sweeps   # on each machine
  optuna-dashboard sqlite:///optuna.db""" 


def main(argv: list[str] | None = None, train_fn=None, conf_dir=None) -> int:
    """The CLI; ``train_fn`` (default ``ablations.train.train``) and ``conf_dir`` (default the repo's conf/) are
    for tests and embedding."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        from sweeps.settings import available_sweeps

        print(USAGE)
        print(f"\nsweeps: {', '.join(available_sweeps())}")
        return 0
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from sweeps.study import Sweep

    kwargs = {"conf_dir": conf_dir} if conf_dir is not None else {}
    return exit_code(lambda: Sweep(argv, train_fn=train_fn, **kwargs).run())


def exit_code(command) -> int:
    """Run `command()` and return its exit code. A user-facing error (SweepError, StorageError, SpaceError, the
    harness's own: any AblationsError) is one line and exit 2, Ctrl-C exit 130; anything else is a bug and keeps
    its traceback."""
    from modules.errors import AblationsError

    try:
        return command()
    except AblationsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
