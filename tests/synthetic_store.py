"""A synthetic MLflow store with the contract's names, for tests and demos of the report (no training needed).

    python tests/synthetic_store.py sqlite:////tmp/demo/mlflow.db   # then: python -m analysis.report synthetic \
                                                                 #   tracking_uri=sqlite:////tmp/demo/mlflow.db

Four attention variants x two seeds, finished, plus runs that must be left out of results: a FAILED run, a RUNNING
run, a KILLED (pruned) run, and a FINISHED run without `final_val_bpb`. The runs that must be left out carry absurd
metric values (bpb 0.001) so that a leak into the results is obvious. One more finished run (`attention=gqa`,
seed 4) is a result but lacks `kv_cache_bytes_per_token` and the `elapsed_sec` history: it must be missing from
exactly the figures that need them.
"""
from __future__ import annotations

import math
import sys

import numpy as np

# variant -> (choice.attention, kv bytes/token, final bpb, train tokens/s, decode tokens/s, params)
VARIANTS = {
    "attention=mha": ("mha", 2048, 2.00, 9000.0, 300.0, 800_000),
    "attention=gqa": ("gqa", 1024, 2.05, 9500.0, 320.0, 760_000),
    "attention=mqa": ("mqa", 512, 2.30, 9800.0, 340.0, 740_000),
    "attention=mla": ("mla", 640, 2.40, 8000.0, 200.0, 780_000),  # dominated by mqa on KV cache
}
SEEDS = (0, 1)
STEPS = 40
VAL_EVERY = 10
BATCH_TOKENS = 8 * 64
T0 = 1_700_000_000_000  # fixed timestamps (ms) keep the store's content reproducible


def _tags(variant: str, seed: int, attention: str) -> dict[str, str]:
    return {
        "variant": variant, "seed": str(seed), "choice.model": "tiny", "choice.position": "learned",
        "choice.norm": "layernorm", "choice.mlp": "gelu", "choice.attention": attention, "choice.tokenizer": "byte",
        "choice.data": "pystdlib", "multirun_group": "synthetic-group", "git_commit": "0123456789abcdef" * 2 + "01234567",
        "git_dirty": "false", "data_fingerprint": "synthetic-data-fp", "tokenizer": "byte", "tokenizer_hash": "bytes",
        "precision": "32-true", "device": "cpu", "mfu_peak_flops": "1e12", "mfu_peak_source": "configured",
    }


def _history(rng, final_loss: float, tps: float, steps: int, stop: int | None = None):
    """(key, value, step) triples of the step metrics, loss decaying to about `final_loss`."""
    out = []
    stop = steps if stop is None else stop
    for step in range(1, stop + 1):
        loss = final_loss + 3.0 * math.exp(-step / 8.0) + float(rng.normal(0, 0.02))
        out += [("train/loss", loss, step), ("tokens_seen", float(step * BATCH_TOKENS), step),
                ("elapsed_sec", step * BATCH_TOKENS / tps * (1 + float(rng.uniform(0, 0.05))), step),
                ("tokens_per_sec", tps * (1 + float(rng.normal(0, 0.01))), step), ("mfu", 0.01, step),
                ("lr", 1e-3, step)]
        if step % VAL_EVERY == 0:
            vloss = final_loss + 3.0 * math.exp(-step / 8.0) + 0.05
            out += [("val/loss", vloss, step), ("val/bpb", vloss / math.log(2) * 0.9, step)]
    return out


def make_store(uri: str, experiment: str = "synthetic", with_bad_runs: bool = True) -> dict[str, dict]:
    """Create the runs in `uri` (an MLflow tracking URI). Returns {run_id: {"variant", "seed", "status", "metrics"}}."""
    from mlflow.entities import Metric, Param, RunTag
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    made: dict[str, dict] = {}
    clock = [T0]

    def run(variant, seed, attention, status, once: dict, history, extra_tags=None):
        clock[0] += 60_000
        tags = _tags(variant, seed, attention) | (extra_tags or {})
        r = client.create_run(exp_id, start_time=clock[0], tags=tags, run_name=f"{variant} seed={seed}")
        rid = r.info.run_id
        metrics = [Metric(k, float(v), clock[0] + s, s) for k, v, s in history]
        metrics += [Metric(k, float(v), clock[0] + 10_000, 0) for k, v in once.items()]
        params = [Param("seed", str(seed)), Param("model.n_layer", "4"), Param("attention.name", attention),
                  Param("trainer.max_steps", str(STEPS))]
        for i in range(0, len(metrics), 900):
            client.log_batch(rid, metrics=metrics[i:i + 900], params=params if i == 0 else [],
                             tags=[RunTag("mlflow.note.content", "synthetic")] if i == 0 else [])
        if status != "RUNNING":
            client.set_terminated(rid, status=status, end_time=clock[0] + 20_000)
        made[rid] = {"variant": variant, "seed": seed, "status": status, "metrics": once}
        return rid

    for vi, (variant, (att, kv, bpb, tps, dps, params)) in enumerate(sorted(VARIANTS.items())):
        for seed in SEEDS:
            rng = np.random.default_rng(1000 * vi + seed)
            b = bpb + float(rng.normal(0, 0.01))
            loss = b * math.log(2) / 0.9
            t = tps * (1 + float(rng.normal(0, 0.02)))
            once = {"params": params, "params_non_embedding": params - 32_768, "flops_per_token": 6 * params,
                    "kv_cache_bytes_per_token": kv, "prefill_tokens_per_sec": 10 * dps,
                    "decode_tokens_per_sec": dps * (1 + float(rng.normal(0, 0.02))),
                    "decode_tokens_per_sec_nocache": dps / 3, "kv_cache_bytes_measured": kv * 64,
                    "final_val_loss": loss, "final_val_bpb": b, "final_tokens_per_sec": t, "final_mfu": 0.01 + 0.001 * seed}
            run(variant, seed, att, "FINISHED", once, _history(rng, loss - 0.05, t, STEPS))
    if with_bad_runs:
        rng = np.random.default_rng(99)
        absurd = {"final_val_loss": 0.001, "final_val_bpb": 0.001, "kv_cache_bytes_per_token": 1,
                  "final_tokens_per_sec": 1e9, "decode_tokens_per_sec": 1e9, "params": 1}
        run("attention=gqa", 2, "gqa", "FAILED", absurd, _history(rng, 2.0, 9000.0, STEPS, stop=12),
            {"failure_reason": "DivergenceError: loss became nan at step 12"})
        run("attention=mha", 2, "mha", "RUNNING", absurd, _history(rng, 2.0, 9000.0, STEPS, stop=20))
        run("attention=mqa", 3, "mqa", "KILLED", absurd, _history(rng, 2.0, 9000.0, STEPS, stop=10),
            {"pruned": "true"})
        missing = dict(absurd)
        missing.pop("final_val_bpb")
        run("attention=mla", 2, "mla", "FINISHED", missing, _history(rng, 2.0, 9000.0, STEPS))
        # a result without kv_cache_bytes_per_token and without the elapsed_sec history
        att, kv, bpb, tps, dps, params = VARIANTS["attention=gqa"]
        b = bpb + 0.005
        partial = {"params": params, "final_val_loss": b * math.log(2) / 0.9, "final_val_bpb": b,
                   "final_tokens_per_sec": tps, "final_mfu": 0.01, "decode_tokens_per_sec": dps}
        hist = [h for h in _history(rng, partial["final_val_loss"] - 0.05, tps, STEPS) if h[0] != "elapsed_sec"]
        run("attention=gqa", 4, att, "FINISHED", partial, hist)
    return made


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/synthetic_store.py TRACKING_URI")
    made = make_store(sys.argv[1])
    print(f"made {len(made)} synthetic runs in experiment 'synthetic' at {sys.argv[1]}")
