"""The command line of `python -m ablations.bench`: options -> a run -> the printed table, the JSON, MLflow.

It finds the sections by importing every module of the package; it is the only module that does, and no section
imports it, so the discovery closes no import circle (the sections import core.py, which only holds the registry)."""
from __future__ import annotations

import importlib
import json
import math
import os
import pkgutil
import sys
import time
from pathlib import Path

import torch

from ablations.cli import Command, Option, yaml_value
from ablations.malloc import keep_freed_memory

from .core import DTYPES, Options, Section, registered
from .runner import run, selected


def sections() -> dict[str, type[Section]]:
    """name -> Section class of every module of this package, in table order (imports them on first use)."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__package__}.{info.name}")
    return registered()


def _contexts(text: str) -> list[int] | None:
    """`[64,128]` or the old `64,128`."""
    value = yaml_value(text)
    value = [value] if isinstance(value, int) else value
    if isinstance(value, str):
        value = [int(c) for c in value.split(",")]
    return None if value is None else [int(c) for c in value]


def _sections(text: str) -> list[str]:
    value = yaml_value(text)
    return [str(s) for s in value] if isinstance(value, list) else str(value).split(",")


COMMAND = Command(
    "ablations.bench", "[key=value ...] [training overrides ...]", __doc__.split("\n\n")[0],
    options=(
        Option("json", "where the JSON goes", Options.json, Path),
        Option("mlflow", "also log the figures to the MLflow experiment bench", False, switch=True),
        Option("quick", "short windows", False, switch=True),
        Option("only", "only these sections, e.g. [train,norms] (and those they need)", parse=_sections),
        Option("skip", "every section but these", parse=_sections),
        Option("threads", "torch intra-op threads (the config's threads=)"),
        Option("device", "cpu | cuda", Options.device, str),
        Option("contexts", "decode/prefill contexts, e.g. [64,256]", parse=_contexts),
        Option("new_tokens", "decoded tokens per context"),
        Option("no_compile", "leave out the torch.compile rows", False, switch=True),
        Option("inference_dtype", " | ".join(DTYPES), Options.inference_dtype, str),
        Option("peak_flops", "bf16 peak for MFU instead of the measured one, e.g. 989e12",
               parse=lambda t: None if yaml_value(t) is None else float(t)),
        Option("rounds", "interleaved rounds per section"),
        Option("window", "seconds per timed window"),
        Option("steps", "train only this many steps per variant (a dry run)"),
        Option("force_emulated", "train in a precision whose GEMM peak is below fp32's too", False, switch=True)),
    rest="Hydra overrides of the training config that the bench measures (model=..., norm=..., ...)",
    examples=("only=[ceilings,train] threads=1", "quick=true model=tiny norm=rmsnorm"))


def parse_args(argv: list[str]) -> tuple[list[str], list[str], Options]:
    """-> (Hydra overrides, sections to run, options). Anything that is not an option is a Hydra override."""
    o, rest = COMMAND.read(argv)
    known = list(sections())
    chosen = o.pop("only") or known
    skip = o.pop("skip") or []  # popped once: Options takes neither only nor skip
    chosen = [s for s in chosen if s not in skip]
    bad = [s for s in chosen if s not in known]
    if bad:
        raise SystemExit(f"ablations.bench: unknown section {bad[0]!r}; choose from {','.join(known)}")
    opts = Options(**o)
    if opts.inference_dtype not in DTYPES:
        raise SystemExit(f"ablations.bench: inference_dtype= must be one of {','.join(DTYPES)}")
    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("ablations.bench: device=cuda but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}); install a CUDA build of torch or use device=cpu")
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
              f"look erratic, rerun with threads=1")
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
