"""`train(cfg)`: the single code path from a composed config to a finished, recorded MLflow run.

Used by `python -m ablations.run` (one call per Hydra job) and by the sweeps (one call per trial).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from . import tracking as trk
from .budget import budget_flops, steps_for_budget
from .checkpoints import (AtomicCheckpoint, check_compatible, final_checkpoint, load_final_checkpoint, load_resumable,  # noqa: F401
                          save_atomic)
from .data import TokenDataModule, check_windows, prepare_data
from .errors import (AblationsError, CheckpointError, ConfigError, DataError, DivergenceError, TokenizerError,
                     TrackingError)
from .generate import sample_text
from .inference_timing import generation_benchmark
from .lit import LitGPT, quiet_lightning, resolve_accelerator, resolve_precision
from .metrics import MetricsCallback, measure_peak_flops
from .progress import LineProgress, line_every, wants_lines
from .repro import cpu_model, derived_seed, environment_tags, seed_all

__all__ = ["train", "DivergenceError", "ConfigError", "DataError", "TokenizerError", "TrackingError",
           "CheckpointError", "AblationsError", "config_hash", "load_final_checkpoint"]

log = logging.getLogger("ablations")


def _env_rank() -> int:
    for k in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(k, "").isdigit():
            return int(os.environ[k])
    return 0


def _container(cfg: DictConfig) -> dict:
    c = OmegaConf.to_container(cfg, resolve=True)
    c.pop("hydra", None)
    return c


def config_hash(cfg: DictConfig) -> str:
    """sha256 of the resolved config minus `resume`, `progress_every_n_steps`, `tracking.system_metrics*` (and
    hydra): names the checkpoint dir of a run (so how a run reports its progress does not decide which checkpoint
    it resumes)."""
    c = _container(cfg)
    c.pop("resume", None)
    c.pop("progress_every_n_steps", None)
    for k in ("system_metrics", "system_metrics_interval"):  # how a run is watched, not what it trains
        c.get("tracking", {}).pop(k, None)
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:1000]


def _check_cfg(cfg: DictConfig) -> None:
    t = cfg.trainer
    ms = t.get("max_steps")
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 1:
        raise ConfigError(f"trainer.max_steps={ms} must be a positive integer (optimizer steps), e.g. 2000")
    bs = cfg.data.get("batch_size")
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        raise ConfigError(f"data.batch_size={bs} must be a positive integer, e.g. 32")
    acc = t.get("accumulate_grad_batches", 1)
    if isinstance(acc, bool) or not isinstance(acc, int) or acc < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches={acc} must be a positive integer")
    lr = cfg.optim.get("lr")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"optim.lr={lr} must be a positive number, e.g. 3e-3")
    if cfg.get("resume") not in (None, "auto") and not isinstance(cfg.get("resume"), str):
        raise ConfigError(f"resume={cfg.get('resume')!r}: use resume=auto, resume=PATH_TO_CKPT, or leave it null")
    if cfg.get("compile") not in (True, False):
        raise ConfigError(f"compile={cfg.get('compile')!r} must be true or false")


def _build_model(cfg: DictConfig):
    """The GPT of `cfg.model` (Hydra's `_target_` keys are ignored), validated by modules.config."""
    from modules.gpt import GPT

    try:
        return GPT.from_config(OmegaConf.to_container(cfg.model, resolve=True))
    except ValueError as e:  # ConfigError (a ValueError): names the field, its value and what would be valid
        raise ConfigError(f"model: {e}") from None


def _accounting(cfg_model, inference_dtype) -> dict:
    from modules import accounting as acc

    pc = acc.param_counts(cfg_model)
    return {"params": int(pc["params"]), "params_non_embedding": int(pc["params_non_embedding"]),
            "flops_per_token": int(acc.flops_per_token(cfg_model)),
            "kv_cache_bytes_per_token": int(acc.kv_cache_bytes_per_token(cfg_model, dtype=inference_dtype))}


def _unwrap_spawn_error(e: BaseException, relay: Path) -> BaseException:
    """ddp_spawn re-raises a worker's exception as ProcessRaisedException (traceback text only): the worker that
    raised a harness error pickled it to `relay` (LitGPT.error_relay), so the caller sees the real class."""
    from torch.multiprocessing import ProcessRaisedException

    if not isinstance(e, ProcessRaisedException) or not relay.is_file():
        return e
    with open(relay, "rb") as f:
        return pickle.load(f)


def _device_tags(accel: str) -> dict:
    if accel == "cuda" and torch.cuda.is_available():
        return {"device": "cuda", "device_name": torch.cuda.get_device_name(0)}
    return {"device": accel, "device_name": cpu_model()}


@dataclass
class _Job:
    """What the steps of `train` hand to each other."""
    cfg: DictConfig
    run_name: str | None = None
    hydra_tags: dict = field(default_factory=dict)
    is_main: bool = True
    uri: str = ""
    td: object = None  # ablations.data.TokenData
    tok: object = None
    block_size: int = 0
    model: object = None
    model_dict: dict = field(default_factory=dict)
    accel: str = "cpu"
    precision: str = ""
    precision_why: str = ""
    infer_dtype: torch.dtype = torch.float32
    acct: dict = field(default_factory=dict)
    peak_total: float = 0.0
    peak_src: str = ""
    world: int = 1
    chash: str = ""
    ckpt_dir: Path | None = None
    ckpt_path: Path | None = None
    resume_meta: dict | None = None
    lit: object = None
    trainer: object = None
    dm: object = None
    metrics_cb: object = None
    cl: object = None
    run_id: str | None = None
    run_tags: dict = field(default_factory=dict)


def train(cfg: DictConfig, callbacks=(), tags: dict | None = None) -> dict:
    """Train `cfg` (a composed config of conf/config.yaml) and record one MLflow run.

    Returns {run_id, val_loss, val_bpb, tokens_per_sec, mfu, params, params_non_embedding,
    kv_cache_bytes_per_token, decode_tokens_per_sec, flops_per_token, steps}.
    Raises ConfigError / DataError / TokenizerError / TrackingError / CheckpointError (before any run is created,
    where possible), DivergenceError on a NaN/inf loss. A run that was created is always ended: FINISHED, FAILED
    (tag failure_reason) or, for optuna.TrialPruned, KILLED (tag pruned=true); then re-raised.
    `tags` are added to the run; `tags["mlflow.runName"]` names it. `callbacks` are extra Lightning callbacks.
    """
    quiet_lightning()
    t_start = time.time()
    job = _compose(cfg)                 # 1. the config, checked; threads; the tracking store reachable
    _data(job)                          # 2. corpus and tokenizer (cached)
    _model(job)                         # 3. the model, its precision, accounting and peak FLOP/s
    _budget(job)                        # 3b. a compute budget (trainer.budget) sets trainer.max_steps
    _resume(job)                        # 4. checkpoint dir; the checkpoint to resume from, checked
    _trainer(job, callbacks)            # 5. the Lightning Trainer (a bad trainer.* value leaves nothing behind)
    if job.is_main:
        _open_run(job, tags)            # 6. the MLflow run (rank 0 only)
    try:
        if job.is_main:
            _log_run_start(job)
        _fit(job)                       # 7. training
        if not job.is_main:
            return {"run_id": None}
        result = _after_training(job)   # 8. generation benchmark, sample, artifacts, summaries
        job.cl.set_tag(job.run_id, "wall_sec", f"{time.time() - t_start:.1f}")
        trk.terminate(job.cl, job.run_id, "FINISHED")
        return result
    except BaseException as e:
        _end_run_on_error(job, e)
        raise


def _compose(cfg: DictConfig) -> _Job:
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    name_from_hydra, hydra_tags = trk.hydra_info(cfg)
    if "hydra" in cfg:
        cfg.pop("hydra")
    _check_cfg(cfg)
    threads = cfg.get("threads")
    if threads is not None:  # intra-op threads of this process (also the sweeps' in-process trials)
        if not str(threads).isdigit() or int(threads) < 1:
            raise ConfigError(f"threads={threads} must be a positive integer, or null for torch's default")
        torch.set_num_threads(int(threads))
    job = _Job(cfg=cfg, run_name=name_from_hydra, hydra_tags=hydra_tags, is_main=_env_rank() == 0)
    # the tracking store first: an unreachable store fails before any data work or training
    job.uri = trk.tracking_uri(cfg)
    trk.check_reachable(job.uri)
    return job


def _data(job: _Job) -> None:
    cfg = job.cfg
    job.td = prepare_data(cfg.data, str(cfg.tokenizer.name))
    job.tok = job.td.tokenizer
    if cfg.tokenizer.get("vocab_size") is None:
        cfg.tokenizer.vocab_size = job.tok.vocab_size
    elif int(cfg.tokenizer.vocab_size) != job.tok.vocab_size:
        raise ConfigError(f"tokenizer.vocab_size={cfg.tokenizer.vocab_size} but tokenizer {job.tok.name} has "
                          f"{job.tok.vocab_size} ids: leave tokenizer.vocab_size at its default")
    job.block_size = int(cfg.model.block_size)
    check_windows(job.td, job.block_size)


def _model(job: _Job) -> None:
    cfg = job.cfg
    seed_all(int(cfg.seed))  # model init depends on the seed only (see ablations.repro)
    job.model = _build_model(cfg)
    job.model_dict = job.model.config.to_dict()  # the complete, validated config: GPT.from_config rebuilds it
    job.accel = accel = resolve_accelerator(cfg.trainer.get("accelerator", "auto"))
    if accel == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={cfg.trainer.get('accelerator')} but no CUDA device is available: "
                          f"use trainer.accelerator=auto or cpu")
    job.precision, job.precision_why = resolve_precision(cfg.trainer.get("precision", "auto"), accel)
    bf16 = job.precision.startswith("bf16")
    job.infer_dtype = torch.bfloat16 if bf16 else (torch.float16 if job.precision.startswith("16") else torch.float32)
    job.acct = _accounting(job.model.config, job.infer_dtype)
    if cfg.tracking.get("peak_flops"):
        peak, job.peak_src = float(cfg.tracking.peak_flops), "configured"
    else:
        dev = "cuda" if accel == "cuda" else "cpu"
        peak, job.peak_src = measure_peak_flops(dev, job.infer_dtype), "measured"
    devices = cfg.trainer.get("devices", 1)
    n_dev = devices if isinstance(devices, int) and devices > 0 else 1
    job.world = n_dev * int(cfg.trainer.get("num_nodes", 1))
    job.peak_total = peak * (job.world if accel == "cuda" else 1)


def _budget(job: _Job) -> None:
    """trainer.budget.flops / tokens_per_param -> trainer.max_steps from this model's own FLOPs per token, so arms
    and sizes are compared at matched compute (ablations/budget.py); logged as the metric budget_flops."""
    cfg = job.cfg
    flops = budget_flops(cfg.trainer.get("budget"), job.model.config)
    if flops is None:
        return
    accum = int(cfg.trainer.get("accumulate_grad_batches", 1))
    cfg.trainer.max_steps = steps_for_budget(flops, job.model.config, int(cfg.data.batch_size), accum, job.world)
    job.acct["budget_flops"] = flops


def _resume(job: _Job) -> None:
    cfg = job.cfg
    job.chash = config_hash(cfg)
    job.ckpt_dir = Path(str(cfg.checkpoint.dir)).expanduser() / job.chash[:16]
    lit_meta = {"tokenizer": job.tok.identity(), "tokenizer_hash": job.tok.hash, "config_hash": job.chash,
                "data_fingerprint": job.td.fingerprint, "model_config": job.model_dict}
    job.lit = LitGPT(job.model, OmegaConf.to_container(cfg.optim, resolve=True), int(cfg.trainer.max_steps), lit_meta)
    resume = cfg.get("resume")
    if resume == "auto":
        if (job.ckpt_dir / "last.ckpt").is_file():
            job.ckpt_path = job.ckpt_dir / "last.ckpt"
        else:
            log.info("resume=auto: no checkpoint in %s, starting fresh", job.ckpt_dir)
    elif resume:
        job.ckpt_path = Path(str(resume)).expanduser()
        if not job.ckpt_path.is_file():
            raise ConfigError(f"resume={resume}: no such checkpoint file: use resume=auto or an existing .ckpt path")
    if job.ckpt_path is not None:
        ck = load_resumable(job.ckpt_path)
        check_compatible(ck, job.ckpt_path, job.lit, job.tok)
        job.resume_meta = ck["ablations"]


def _trainer(job: _Job, callbacks) -> None:
    import lightning.pytorch as pl
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    cfg = job.cfg
    job.dm = TokenDataModule(job.td, job.block_size, int(cfg.data.batch_size), int(cfg.seed),
                             int(cfg.data.get("val_windows", 128)))
    accum = int(cfg.trainer.get("accumulate_grad_batches", 1))
    tokens_per_step = int(cfg.data.batch_size) * job.block_size * accum * job.world
    job.metrics_cb = MetricsCallback(None, job.uri, tokens_per_step, job.acct["flops_per_token"], job.peak_total,
                                     int(cfg.tracking.get("log_every_n_steps") or cfg.trainer.get("log_every_n_steps", 10)),
                                     job.td.val_tokens_per_byte, int(cfg.trainer.max_steps))
    ckpt_cb = AtomicCheckpoint(job.ckpt_dir, int(cfg.checkpoint.get("every_n_steps", 100)), job.metrics_cb)
    tk = OmegaConf.to_container(cfg.trainer, resolve=True)
    tk["precision"] = job.precision
    tk.pop("budget", None)  # ours, not Lightning's: already turned into max_steps
    if tk.get("limit_val_batches") is None:
        tk.pop("limit_val_batches", None)
    ours = [job.metrics_cb, ckpt_cb]
    if tk.get("enable_progress_bar", True) and wants_lines():  # a log file: lines, not a carriage-return stream
        tk["enable_progress_bar"] = False
        every = cfg.get("progress_every_n_steps") or line_every(int(cfg.trainer.max_steps), job.metrics_cb.log_every)
        ours.append(LineProgress(job.metrics_cb, int(every), int(cfg.trainer.max_steps)))
    tk.update(logger=False, enable_checkpointing=False, num_sanity_val_steps=0, check_val_every_n_epoch=None,
              max_epochs=-1, enable_model_summary=False, callbacks=[*ours, *callbacks])
    if cfg.get("compile"):
        job.lit.compile_model = True
    try:
        job.trainer = pl.Trainer(**tk)
    except (TypeError, ValueError, MisconfigurationException) as e:
        raise ConfigError(f"trainer: {str(e).splitlines()[0]}") from None


def _open_run(job: _Job, tags: dict | None) -> None:
    """Create the MLflow run, or reopen the resumed checkpoint's run when it lives in this store."""
    import lightning.pytorch as pl
    from mlflow.exceptions import MlflowException

    cfg = job.cfg
    job.cl = cl = trk.client(job.uri)
    try:
        exp_id = trk.get_or_create_experiment(cl, job.uri, str(cfg.tracking.experiment))
    except MlflowException as e:
        raise TrackingError(f"tracking.uri={job.uri}: cannot open experiment {cfg.tracking.experiment!r} "
                            f"({_one_line(e)[:200]})") from None
    run_tags = {**job.hydra_tags, **trk.git_state()}
    run_tags.update({
        "seed": str(cfg.seed), "data_fingerprint": job.td.fingerprint, "tokenizer": job.tok.name,
        "tokenizer_hash": job.tok.hash, "precision": job.precision, "precision_reason": job.precision_why,
        **_device_tags(job.accel), "torch_version": torch.__version__, "lightning_version": pl.__version__,
        **environment_tags(job.accel), "mfu_peak_flops": f"{job.peak_total:.4g}",
        "mfu_peak_source": job.peak_src, "config_hash": job.chash, "world_size": str(job.world)})
    run_tags.setdefault("variant", "baseline")
    run_tags.update({k: str(v) for k, v in (tags or {}).items()})
    run_name = run_tags.pop("mlflow.runName", None) or job.run_name or "default"
    job.run_tags = run_tags
    prev = job.resume_meta.get("mlflow_run_id") if job.resume_meta else None
    if prev:
        try:
            r = cl.get_run(prev)
            job.run_id = r.info.run_id if r.info.experiment_id == exp_id else None
        except MlflowException:  # the run lives in another store: start a new one
            job.run_id = None
    if job.run_id:
        cl.update_run(job.run_id, status="RUNNING")
        if "failure_reason" in cl.get_run(job.run_id).data.tags:
            cl.delete_tag(job.run_id, "failure_reason")
        cl.set_tag(job.run_id, "resumed_from_step", str(job.resume_meta.get("step")))
    else:
        job.run_id = cl.create_run(exp_id, run_name=run_name, tags=run_tags).info.run_id
    job.lit.ckpt_meta["mlflow_run_id"] = job.run_id
    job.metrics_cb.run_id = job.run_id
    trk.start_system_metrics(cfg.tracking, job.uri, job.run_id)  # stopped by trk.terminate


def _log_run_start(job: _Job) -> None:
    cfg, cl, run_id = job.cfg, job.cl, job.run_id
    for k, v in (job.run_tags.items() if job.resume_meta else []):
        cl.set_tag(run_id, k, v)
    trk.log_params(cl, run_id, trk.config_params(cfg))
    # the resolved config first: a FAILED / KILLED run can be re-run too (python -m ablations.rerun)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.yaml").write_text(_config_yaml(cfg))
        cl.log_artifact(run_id, str(Path(tmp) / "config.yaml"))
    cl.log_batch(run_id, metrics=_metric_list(dict(job.acct), 0))
    job.ckpt_dir.mkdir(parents=True, exist_ok=True)
    (job.ckpt_dir / "run.json").write_text(json.dumps({"run_id": run_id, "tracking_uri": job.uri,
                                                       "config_hash": job.chash}))
    print(f"[ablations] run {run_id} | precision {job.precision} ({job.precision_why}) | peak "
          f"{job.peak_total:.3g} FLOP/s ({job.peak_src}) | params {job.acct['params']:,} | ckpt {job.ckpt_dir}",
          flush=True)


def _fit(job: _Job) -> None:
    # the training RNG stream (dropout) depends on the seed only, not on what ran since model init
    seed_all(derived_seed(int(job.cfg.seed), "fit"))
    relay = Path(tempfile.mkdtemp(prefix="ablations-relay-")) / "error.pkl"
    job.lit.error_relay = str(relay)
    try:
        job.trainer.fit(job.lit, datamodule=job.dm, ckpt_path=str(job.ckpt_path) if job.ckpt_path else None,
                        weights_only=True)
    except BaseException as e:  # noqa: BLE001 - re-raised, as the worker's own error where there is one
        mapped = _unwrap_spawn_error(e, relay)
        if mapped is not e:
            raise mapped from None
        raise
    finally:
        shutil.rmtree(relay.parent, ignore_errors=True)
    if job.trainer.interrupted:
        raise KeyboardInterrupt("training interrupted")


def _after_training(job: _Job) -> dict:
    cfg, cl, run_id, tok, td = job.cfg, job.cl, job.run_id, job.tok, job.td
    model = job.lit.model.to("cuda" if job.accel == "cuda" else "cpu")  # Lightning's teardown leaves it on CPU
    model.eval()
    ac_dtype = job.infer_dtype if job.infer_dtype != torch.float32 else None
    toks = td.memmap()
    prompt = torch.from_numpy(toks[td.n_train:td.n_train + job.block_size].astype("int64"))[None]  # (1, T)
    g = cfg.generate
    bench = generation_benchmark(model, prompt, int(g.bench_decode_tokens), int(g.bench_prefill_tokens),
                                 ac_dtype, job.infer_dtype)
    sample = sample_text(model, tok, g, ac_dtype, int(cfg.seed))
    steps = int(job.trainer.global_step)
    if not steps:  # ddp_spawn: the loop ran in the workers; their last logged step is the step count
        hist = cl.get_metric_history(run_id, "tokens_seen")
        steps = max((h.step for h in hist), default=0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "config.yaml").write_text(_config_yaml(cfg))
        (tmp / "sample.txt").write_text(sample)
        (tmp / "tokenizer.json").write_text(json.dumps(tok.identity()))
        final = final_checkpoint(model, job.model_dict, tok, (tmp / "config.yaml").read_text(), steps, run_id)
        save_atomic(final, tmp / "checkpoints" / "final.ckpt")
        for f in ("sample.txt", "tokenizer.json"):
            cl.log_artifact(run_id, str(tmp / f))
        cl.log_artifact(run_id, str(tmp / "checkpoints" / "final.ckpt"), artifact_path="checkpoints")
    cl.log_batch(run_id, metrics=_metric_list(bench, steps))
    m = cl.get_run(run_id).data.metrics
    acct = job.acct
    return {"run_id": run_id, "val_loss": m.get("final_val_loss"), "val_bpb": m.get("final_val_bpb"),
            "tokens_per_sec": m.get("final_tokens_per_sec"), "mfu": m.get("final_mfu"),
            "params": acct["params"], "params_non_embedding": acct["params_non_embedding"],
            "kv_cache_bytes_per_token": acct["kv_cache_bytes_per_token"],
            "decode_tokens_per_sec": bench["decode_tokens_per_sec"],
            "flops_per_token": acct["flops_per_token"], "steps": steps}


def _end_run_on_error(job: _Job, e: BaseException) -> None:
    """Never leave the run RUNNING: KILLED for a pruned trial or an interrupt, else FAILED with the reason."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException
    from mlflow.exceptions import MlflowException
    from optuna import TrialPruned

    if job.cl is not None and job.run_id is not None:
        pruned = isinstance(e, TrialPruned)
        interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
        status = "KILLED" if pruned or interrupted else "FAILED"
        reason = None if pruned else (f"interrupted ({_one_line(e)})" if interrupted else _one_line(e))
        try:
            trk.terminate(job.cl, job.run_id, status, reason=reason, extra_tags={"pruned": "true"} if pruned else None)
        except MlflowException as e2:
            log.error("could not mark MLflow run %s %s: %s", job.run_id, status, e2)
    if isinstance(e, SIGTERMException):  # Lightning's is a SystemExit with code 0: exit 128+SIGTERM
        raise SystemExit(143) from e


def _config_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(_container(cfg)))


def _metric_list(d: dict, step: int):
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    return [Metric(k, float(v), ts, int(step)) for k, v in d.items() if v is not None and math.isfinite(float(v))]
