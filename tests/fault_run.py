"""`python -m tests.fault_run FAULT [overrides]`: `python -m ablations.run` with a fault callback (tests/faults.py).

FAULT is `kill@STEP`, `nan@STEP` or `hold@STEP`. Everything else is ablations.run's own entry point (the same conf/,
the same overrides, its one-line errors and exit codes): only `ablations.train.train` is wrapped to add the callback,
so a later `python -m ablations.run ... resume=auto` finds this run's checkpoint."""
import sys
from pathlib import Path

import hydra

import ablations.train
from ablations import run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import from_spec  # noqa: E402


@hydra.main(version_base=run.VERSION_BASE, config_path=str(Path(__file__).resolve().parents[1] / "conf"),
            config_name="config")
def main(cfg):
    return run.main.__wrapped__(cfg)  # ablations.run's body, under this file's absolute config path


if __name__ == "__main__":  # not in a spawned worker (trainer=ddp, fsdp), which imports this file again
    FAULT = from_spec(sys.argv.pop(1))
    _train = ablations.train.train
    ablations.train.train = lambda cfg, **kw: _train(cfg, callbacks=[FAULT, *kw.pop("callbacks", ())], **kw)
    _err = run.check_argv(sys.argv[1:])
    if _err:
        print(_err, file=sys.stderr)
        sys.exit(2)
    main()
