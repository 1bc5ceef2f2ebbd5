"""`python -m ablations.run [-m] [overrides]`: train the composed config and record it in MLflow.

Ends with one summary line (final val loss/bpb, tokens/sec, MLflow run id, how to open the UI).
"""
from __future__ import annotations

import logging
import os
import sys
import warnings

import hydra
from omegaconf import DictConfig

from ablations.compose import VERSION_BASE, check_argv, model_config

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


@hydra.main(version_base=VERSION_BASE, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from .errors import AblationsError, exit_code
    from .tracking import tracking_uri

    logging.getLogger("ablations").setLevel(logging.INFO)
    try:
        model_config(cfg, vocab_stand_in=1)  # a bad model.* in ~2 s of CPU, before Lightning's ~8 s of imports
        from .train import train

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


if __name__ == "__main__":
    _err = check_argv(sys.argv[1:])
    if _err:
        print(_err, file=sys.stderr)
        sys.exit(2)
    main()
    if _FAILED:
        print(f"error: {len(_FAILED)} job(s) of this multirun failed (see the lines above and their MLflow runs)",
              file=sys.stderr)
        sys.exit(max(_FAILED))
