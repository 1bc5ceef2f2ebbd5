"""`python -m tests.fault_run FAULT [overrides]`: `python -m ablations.run` with a fault callback (tests/faults.py).

FAULT is `kill@STEP` or `nan@STEP`. The config is composed exactly as `ablations.run` composes it (same conf/, same
overrides), so a later `python -m ablations.run ... resume=auto` finds this run's checkpoint."""
import sys
from pathlib import Path

import hydra

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faults import from_spec  # noqa: E402

FAULT = from_spec(sys.argv.pop(1))


@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parents[1] / "conf"), config_name="config")
def main(cfg):
    from ablations.train import train

    train(cfg, callbacks=[FAULT])


if __name__ == "__main__":
    main()
