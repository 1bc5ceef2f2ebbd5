"""``python -m sweeps.floor experiment=NAME [orders=[1,2,3,4,5]] [scope=windows|full] [discount=D] [log=true]``

The n-gram floor of a study's data: composes the training config (any training override: data=, tokenizer=,
model.block_size=, data.val_windows=), prepares the same token file the runs train on (ablations.data), fits the
count models of ablations/ngram.py on the train split and scores them on the runs' val targets, in bpb. `log=true`
records it as a run of the MLflow experiment `ngram-floor` at tracking.uri, where reports find it (analysis/floor.py).
"""
from __future__ import annotations

import numpy as np

from ablations.cli import HELP, Command, CommandLineError, Option
from analysis.floor import FLOOR_EXPERIMENT, FLOOR_METRIC, floor_tags
from ablations.ngram import floor_bpb, full_targets, window_targets

COMMAND = Command(
    "sweeps.floor", "[orders=[1,2,3,4,5]] [scope=windows|full] [discount=D] [log=true] [training overrides]",
    __doc__.split("\n\n")[1],
    options=(
        Option("orders", "the orders to score (a model of the largest is fitted; the lower ones share its counts)",
               [1, 2, 3, 4, 5]),
        Option("scope", "windows: the val targets of the runs' val/bpb (data.val_windows windows of "
                        "model.block_size); full: every val token", "windows"),
        Option("discount", "one fixed discount (interpolated KN); default: modified KN (three discounts per order, "
                           "from the count-of-counts, Chen & Goodman 1998)"),
        Option("log", "record the floor as a run of the MLflow experiment ngram-floor at tracking.uri (reports "
                      "read it)", False, switch=True)),
    rest="overrides of the training config: experiment=... data=... tokenizer=... model.block_size=...",
    examples=("experiment=second-study",
              "experiment=second-study log=true tracking.uri=sqlite:///study/second-study/mlflow.db"))


def _own_options(argv: list[str]) -> tuple[dict, list[str]]:
    """(this tool's options, the training overrides for Hydra)."""
    try:
        own, rest = COMMAND.parse(argv)
    except CommandLineError as e:
        raise ValueError(str(e).removeprefix("sweeps.floor: ")) from None
    orders = own["orders"] if isinstance(own["orders"], list) else [own["orders"]]
    if not orders or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 8 for n in orders):
        raise ValueError(f"invalid orders={own['orders']!r}: expected a list of integers in 1..8, e.g. [1,2,3,4,5]")
    own["orders"] = sorted(set(orders))
    if own["scope"] not in ("windows", "full"):
        raise ValueError(f"invalid scope={own['scope']!r}: expected windows (the runs' val targets) or full")
    d = own["discount"]
    if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d < 1):
        raise ValueError(f"invalid discount={d!r}: expected a number in (0, 1), or leave it out for modified KN")
    if not isinstance(own["log"], bool):
        raise ValueError(f"invalid log={own['log']!r}: expected true or false")
    return own, rest


def compute_floor(argv: list[str]) -> tuple[dict, dict, str]:
    """(bpb per order, metadata tags, tracking URI) for the data/tokenizer/val windows the overrides compose."""
    from ablations.compose import compose
    from ablations.data import prepare_data
    from ablations.tracking import tracking_uri

    own, overrides = _own_options(argv)
    cfg = compose(overrides, job_name="ngram")
    td = prepare_data(cfg.data, str(cfg.tokenizer.name))
    mm = td.memmap()
    train, val = np.asarray(mm[:td.n_train]), np.asarray(mm[td.n_train:])
    block, windows = int(cfg.model.block_size), int(cfg.data.get("val_windows", 128))
    targets = window_targets(td.n_val, block, windows) if own["scope"] == "windows" else full_targets(td.n_val)
    bpb = floor_bpb(train, val, td.tokenizer.vocab_size, td.val_tokens_per_byte, own["orders"], targets,
                    own["discount"])
    meta = {"kind": "ngram", "smoothing": "modified-kn" if own["discount"] is None else f"kn-d{own['discount']:g}",
            "scope": own["scope"], "data": str(cfg.data.name), "data_fingerprint": td.fingerprint,
            "tokenizer": str(cfg.tokenizer.name), "val_fraction": str(cfg.data.get("val_fraction", 0.1)),
            "block_size": block, "val_windows": windows, "n_train": td.n_train, "n_val": td.n_val,
            "val_bytes": td.val_bytes, "n_targets": len(targets[0]), "orders": ",".join(map(str, own["orders"]))}
    return bpb, meta, (tracking_uri(cfg) if own["log"] else "")


def main(argv: list[str] | None = None) -> int:
    import sys

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from modules.errors import AblationsError

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in HELP for a in argv):
        print(COMMAND.help())
        return 0
    try:
        bpb, meta, uri = compute_floor(argv)
    except (ValueError, AblationsError, HydraException, OmegaConfBaseException) as e:
        print(f"sweeps.floor: error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"n-gram floor ({meta['smoothing']}), {meta['data']} / {meta['tokenizer']}, scope {meta['scope']} "
          f"({meta['n_targets']} targets; train {meta['n_train']} tokens):")
    for n, v in bpb.items():
        print(f"  order {n}: {v:.4f} bpb")
    if uri:
        print(f"logged: run {log_floor(uri, bpb, meta)} in experiment {FLOOR_EXPERIMENT} at {uri}")
    return 0


def log_floor(uri: str, bpb: dict, meta: dict) -> str:
    """One FINISHED run in FLOOR_EXPERIMENT with `meta` as floor.* tags and the bpb per order; returns its id."""
    from ablations.tracking import client, get_or_create_experiment
    from mlflow.entities import Metric

    cl = client(uri)
    exp = get_or_create_experiment(cl, uri, FLOOR_EXPERIMENT)
    name = f"ngram {meta['data']} {meta['tokenizer']} {meta['scope']}"
    run = cl.create_run(exp, run_name=name, tags={**floor_tags(meta), "data_fingerprint": meta["data_fingerprint"],
                                                  "tokenizer": meta["tokenizer"]})
    metrics = [Metric(FLOOR_METRIC.format(n=n), float(v), 0, n) for n, v in sorted(bpb.items())]
    cl.log_batch(run.info.run_id, metrics=metrics)
    cl.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


if __name__ == "__main__":
    raise SystemExit(main())
