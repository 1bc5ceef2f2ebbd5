"""The command line of `python -m ablations.bench`: options -> a run -> the printed table, the JSON, MLflow.

It finds the sections by importing every module of the package; it is the only module that does, and no section
imports it, so the discovery closes no import circle (the sections import core.py, which only holds the registry)."""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pkgutil
import sys
import time
from pathlib import Path

import torch

from ablations.malloc import keep_freed_memory

from .core import DTYPES, Options, Section, registered
from .runner import run, selected


def sections() -> dict[str, type[Section]]:
    """name -> Section class of every module of this package, in table order (imports them on first use)."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__package__}.{info.name}")
    return registered()


def usage() -> str:
    return ("python -m ablations.bench [hydra overrides] [--json PATH] [--mlflow] [--quick] [--only|--skip S[,S]] "
            "[--threads N] [--device cpu|cuda] [--contexts C,C] [--new-tokens N] [--no-compile] "
            "[--inference-dtype fp32|bf16] [--peak-flops F] [--rounds N] [--window SEC] [--steps N] "
            "[--force-emulated]; "
            f"sections: {','.join(sections())}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and a non-zero exit, like every command of the harness
        raise SystemExit(f"ablations.bench: {message}; usage: {usage()}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ablations.bench", usage=usage(), add_help=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--json", type=Path, default=Options.json)
    p.add_argument("--mlflow", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-compile", dest="no_compile", action="store_true")
    p.add_argument("--force-emulated", dest="force_emulated", action="store_true")
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default=Options.device)
    p.add_argument("--contexts", type=lambda v: [int(c) for c in v.split(",")])
    p.add_argument("--new-tokens", dest="new_tokens", type=int)
    p.add_argument("--inference-dtype", dest="inference_dtype", default=Options.inference_dtype)
    p.add_argument("--peak-flops", dest="peak_flops", type=float)
    p.add_argument("--rounds", type=int)
    p.add_argument("--window", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--only")
    p.add_argument("--skip")
    return p


def parse_args(argv: list[str]) -> tuple[list[str], list[str], Options]:
    """-> (Hydra overrides, sections to run, options). Anything that is not an option is a Hydra override."""
    ns, rest = _parser().parse_known_args(argv)
    if ns.help:
        raise SystemExit(usage())
    unknown = [a for a in rest if a.startswith("-")]
    if unknown:
        raise SystemExit(f"ablations.bench: unknown option {unknown[0]!r}; usage: {usage()}")
    known = list(sections())
    chosen = ns.only.split(",") if ns.only else known
    if ns.skip:
        chosen = [s for s in chosen if s not in ns.skip.split(",")]
    bad = [s for s in chosen if s not in known]
    if bad:
        raise SystemExit(f"ablations.bench: unknown section {bad[0]!r}; choose from {','.join(known)}")
    opts = Options(**{k: v for k, v in vars(ns).items() if k not in ("help", "only", "skip")})
    if opts.inference_dtype not in DTYPES:
        raise SystemExit(f"ablations.bench: --inference-dtype must be one of {','.join(DTYPES)}")
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("ablations.bench: --device cuda but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}); install a CUDA build of torch or use --device cpu")
    return list(rest), chosen, opts


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def print_table(out: dict, overrides: list[str], json_path: Path) -> None:
    width = max((len(k) for k, _ in out["table"]), default=0)
    load = f"  load={out['load_average']:.1f}" if out.get("load_average") is not None else ""
    print(f"ablations.bench  {' '.join(overrides) or '(defaults)'}  device={out['device']}"
          f"{' (' + out['gpu'] + ')' if out.get('gpu') else ''}  threads={out['threads']}{load}  "
          f"params={out['params']:,}  flops/token={out['flops_per_token']:,}  batch={out['batch_size']}")
    cores = os.cpu_count() or 1
    if out.get("load_average") is not None and out["threads"] > 1 and out["load_average"] > 0.5:
        print(f"  note: load average {out['load_average']:.1f} on {cores} cores when the bench started: with "
              f"{out['threads']} threads, each parallel op waits for its slowest (descheduled) thread; if figures "
              f"look erratic, rerun with --threads 1")
    for k, v in out["table"]:
        print(f"  {k:<{width}}  {v}")
    print(f"  (bench took {out['bench_wall_sec']:.0f} s; JSON in {json_path})")


def main(argv: list[str] | None = None) -> int:
    overrides, chosen, opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    if opts.threads:
        torch.set_num_threads(opts.threads)
    keep_freed_memory()  # as training does: the harness and the bare loop alike
    if opts.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # "fp32" means fp32: the 32-true peak and MFU stay honest
    start = time.perf_counter()
    out = run(overrides, selected(sections(), chosen), opts, log=_log)
    out["bench_wall_sec"] = time.perf_counter() - start
    print_table(out, overrides, opts.json)
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(out, indent=2, default=str))
    if opts.mlflow:
        log_to_mlflow(out)
    return 0


def log_to_mlflow(out: dict) -> None:
    import mlflow

    from ablations.compose import compose
    from ablations.tracking import tracking_uri

    # the harness's rule (tracking.uri override, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)
    mlflow.set_tracking_uri(tracking_uri(compose(out["overrides"])))
    mlflow.set_experiment("bench")
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[prefix.replace("+", "_")] = float(value)

    walk("", {k: v for k, v in out.items() if k not in ("table", "model", "overrides")})
    with mlflow.start_run(run_name=" ".join(out["overrides"]) or "default"):
        mlflow.log_metrics(flat)
        mlflow.set_tags({"device": out["device"], "threads": out["threads"], "torch_version": out["torch"],
                         "mfu_peak_source": out["mfu_peak_source"]})
        mlflow.log_dict(out, "bench.json")
