"""`train(cfg)`: the single code path from a composed config to a finished, recorded MLflow run.

Used by `python -m ablations.run` (one call per Hydra job) and by the sweeps (one call per trial). `train` reads
top to bottom: each step returns what it made and the later steps take it by name.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf

from modules.options import is_int

from . import tracking as trk
from .budget import budget_flops, budget_tokens, steps_for_budget, steps_for_tokens, tokens_per_step
from .checkpoints import (AtomicCheckpoint, check_compatible, final_checkpoint, load_final_checkpoint, load_resumable,  # noqa: F401
                          locate_auto, resumed_line, save_atomic)
from .compose import model_config
from .data import TokenData, TokenDataModule, check_windows, prepare_data
from .errors import (AblationsError, CheckpointError, ConfigError, DataError, DivergenceError, TokenizerError,
                     TrackingError, one_line)
from .generate import sample_text
from .inference_timing import generation_benchmark
from .launch import DDPSpawn
from .lit import LitGPT, quiet_lightning, resolve_accelerator, resolve_precision
from .malloc import keep_freed_memory
from .memory import MemoryEstimate, device_memory, estimate, size
from .optim import run_params
from .metrics import MetricsCallback, measure_peak_flops
from .progress import LineProgress, line_every, wants_lines
from .repro import cpu_model, derived_seed, environment_tags, seed_all
from .schedule import build_lr_lambda
from .sharding import FSDP, NAME as FSDP_NAME, check_fsdp

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from mlflow import MlflowClient

    from modules.gpt import GPT

__all__ = ["train", "DivergenceError", "ConfigError", "DataError", "TokenizerError", "TrackingError",
           "CheckpointError", "AblationsError", "config_hash", "load_final_checkpoint"]

log = logging.getLogger("ablations")


# ---------------------------------------------------------------------------- what the steps hand to each other


@dataclass(frozen=True)
class StepShape:
    """One optimizer step: `accumulate` micro-batches of batch_size x block_size tokens on each of `world` devices."""
    batch_size: int
    block_size: int
    accumulate: int
    world: int

    @property
    def tokens(self) -> int:
        return tokens_per_step(self.batch_size, self.block_size, self.accumulate, self.world)


@dataclass(frozen=True)
class Hardware:
    """Where and how the run computes: the accelerator (cpu, cuda), Lightning's precision (and why it was
    chosen), and the dtype the trained model is evaluated in."""
    accelerator: str
    precision: str
    precision_reason: str
    infer_dtype: torch.dtype


@dataclass(frozen=True)
class Peak:
    """The FLOP/s that MFU is relative to (all devices together) and where it came from (configured, measured)."""
    flops: float
    source: str


@dataclass(frozen=True)
class CheckpointPlan:
    """Where the run checkpoints (`<checkpoint.dir>/<config hash[:16]>`) and the checkpoint it resumes from."""
    config_hash: str
    dir: Path
    resume_from: Path | None
    source: str | None = None  # where resume=auto found it, when not in `dir` (a run's logged checkpoint)


@dataclass(frozen=True)
class Run:
    """The MLflow run being recorded, and the tags it was created with."""
    client: MlflowClient
    id: str
    uri: str
    tags: dict[str, str]
    logged: dict[str, int]  # metric -> last step the run held when (re)opened: a resumed run logs later steps only
    end_timeout_s: float = trk.END_TIMEOUT_S  # how long ending it may wait on the store: min(30 s, max_outage_s)


# ------------------------------------------------------------------------------------------------ the path


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
    cfg, hydra_name, hydra_tags = own_config(cfg)  # a private copy: the steps below complete it
    shape = check_config(cfg)                     # bad values fail here, before anything is built
    set_threads(cfg.get("threads"))
    keep_freed_memory()                           # the next step reuses this step's freed activations (CPU)
    uri = open_store(cfg)                         # an unreachable tracking store fails before any data work
    data = load_data(cfg, shape)                  # corpus and tokenizer (cached); sets tokenizer.vocab_size
    model = build_model(cfg)                      # seeded init; the optimizer config checked against it
    hw = resolve_hardware(cfg)
    peak = peak_flops(cfg, hw, shape)             # configured, or measured on this machine
    check_memory(cfg, model, hw, shape)           # the estimate per device, refused when over the device's memory
    budget = apply_budget(cfg, model, shape)      # a compute budget sets trainer.max_steps
    accounting = count(model, hw, budget)         # params, FLOPs and KV-cache bytes per token
    ckpt = plan_checkpoints(cfg)                  # after the budget: max_steps is part of the config hash
    lit = build_lit_module(cfg, model, data, ckpt, hw)
    resumed = check_resume(ckpt, lit, data)       # the resumed checkpoint's record, or None
    datamodule = TokenDataModule(data, shape.block_size, shape.batch_size, int(cfg.seed),
                                 int(cfg.data.get("val_windows", 128)))
    metrics = build_metrics(cfg, uri, data, shape, accounting, peak)
    trainer = build_trainer(cfg, hw, ckpt, metrics, callbacks)  # a bad trainer.* value leaves nothing behind
    run = None
    if _env_rank() == 0:                          # DDP: rank 0 records the run
        run_tags = tags_of_run(cfg, hydra_tags, tags, data, hw, peak, ckpt, shape)
        run = open_run(cfg, uri, run_tags, hydra_name, resumed)
        lit.ckpt_meta["mlflow_run_id"] = run.id  # a resumed checkpoint reopens its run
        metrics.run_id, metrics.logged_through = run.id, run.logged
        trk.start_system_metrics(cfg.tracking, uri, run.id)  # stopped by trk.terminate
    try:
        if run is not None:
            log_run_start(cfg, run, model, accounting, hw, peak, ckpt, resumed is not None)
        fit(cfg, trainer, lit, datamodule, ckpt)
        if run is None:
            return {"run_id": None}
        result = after_training(cfg, run, trained_model(lit, hw), data, hw, accounting, steps_done(trainer, run))
        run.client.set_tag(run.id, "wall_sec", f"{time.time() - t_start:.1f}")
        trk.terminate(run.client, run.id, "FINISHED", timeout=run.end_timeout_s)
        return result
    except BaseException as e:
        end_run_on_error(run, e)
        raise


# ------------------------------------------------------------------------------------- before any run exists


def own_config(cfg: DictConfig) -> tuple[DictConfig, str | None, dict]:
    """A mutable copy of `cfg` without its `hydra` node, and the run name and tags Hydra's job gives it."""
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    name, hydra_tags = trk.hydra_info(cfg)
    if "hydra" in cfg:
        cfg.pop("hydra")
    return cfg, name, hydra_tags


def check_config(cfg: DictConfig) -> StepShape:
    """The harness's own keys checked (the model's are checked by modules.config, the optimizer's by
    ablations.optim when the model is built); returns the shape of an optimizer step they give."""
    t = cfg.trainer
    ms = t.get("max_steps")
    if not is_int(ms, 1):
        raise ConfigError(f"trainer.max_steps={ms} must be a positive integer (optimizer steps), e.g. 2000")
    bs = cfg.data.get("batch_size")
    if not is_int(bs, 1):
        raise ConfigError(f"data.batch_size={bs} must be a positive integer, e.g. 32")
    acc = t.get("accumulate_grad_batches", 1)
    if not is_int(acc, 1):
        raise ConfigError(f"trainer.accumulate_grad_batches={acc} must be a positive integer")
    if cfg.get("resume") not in (None, "auto") and not isinstance(cfg.get("resume"), str):
        raise ConfigError(f"resume={cfg.get('resume')!r}: use resume=auto, resume=PATH_TO_CKPT, or leave it null")
    if cfg.get("compile") not in (True, False):
        raise ConfigError(f"compile={cfg.get('compile')!r} must be true or false")
    if cfg.get("activation_checkpointing", False) not in (True, False):
        raise ConfigError(f"activation_checkpointing={cfg.get('activation_checkpointing')!r} must be true or false")
    build_lr_lambda(cfg.optim, ms)  # a bad optim.schedule/warmup_frac/decay_frac fails here, before any run exists
    devices = t.get("devices", 1)
    if t.get("strategy") == FSDP_NAME:
        check_fsdp(cfg)
    n_dev = devices if isinstance(devices, int) and devices > 0 else 1  # "auto", a list of ids: one per node
    return StepShape(bs, int(cfg.model.block_size), acc, n_dev * int(t.get("num_nodes", 1)))


def set_threads(threads) -> None:
    """Intra-op threads of this process (also the sweeps' in-process trials); None keeps torch's default."""
    if threads is None:
        return
    n = int(threads) if isinstance(threads, str) and threads.isdigit() else threads  # ${oc.env:...} is a string
    if not is_int(n, 1):
        raise ConfigError(f"threads={threads} must be a positive integer, or null for torch's default")
    torch.set_num_threads(n)


def open_store(cfg: DictConfig) -> str:
    """The tracking URI, checked reachable."""
    uri = trk.tracking_uri(cfg)
    trk.check_reachable(uri)
    return uri


def load_data(cfg: DictConfig, shape: StepShape) -> TokenData:
    """The tokenized corpus (prepared once, cached), checked long enough for the context; completes
    cfg.tokenizer.vocab_size from the tokenizer (the model's vocabulary interpolates it)."""
    data = prepare_data(cfg.data, str(cfg.tokenizer.name))
    tok = data.tokenizer
    if cfg.tokenizer.get("vocab_size") is None:
        cfg.tokenizer.vocab_size = tok.vocab_size
    elif int(cfg.tokenizer.vocab_size) != tok.vocab_size:
        raise ConfigError(f"tokenizer.vocab_size={cfg.tokenizer.vocab_size} but tokenizer {tok.name} has "
                          f"{tok.vocab_size} ids: leave tokenizer.vocab_size at its default")
    check_windows(data, shape.block_size)
    return data


def build_model(cfg: DictConfig) -> GPT:
    """The GPT of `cfg.model`, validated by modules.config, initialised
    from the seed alone (see ablations.repro); the optimizer config is checked against its parameter roles."""
    from modules.gpt import GPT

    config = model_config(cfg)
    seed_all(int(cfg.seed))
    try:
        model = GPT(config)
    except ValueError as e:  # ConfigError (a ValueError): names the field, its value and what would be valid
        raise ConfigError(f"model: {e}") from None
    run_params(model, cfg.optim)  # the optimizer config checked against the model's roles, before any run
    return model


def resolve_hardware(cfg: DictConfig) -> Hardware:
    accel = resolve_accelerator(cfg.trainer.get("accelerator", "auto"))
    if accel == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={cfg.trainer.get('accelerator')} but no CUDA device is available: "
                          f"use trainer.accelerator=auto or cpu")
    precision, why = resolve_precision(cfg.trainer.get("precision", "auto"), accel)
    infer = torch.bfloat16 if precision.startswith("bf16") else \
        (torch.float16 if precision.startswith("16") else torch.float32)
    return Hardware(accel, precision, why, infer)


def peak_flops(cfg: DictConfig, hw: Hardware, shape: StepShape) -> Peak:
    """tracking.peak_flops, else the dense matmul peak measured here in the inference dtype; on CUDA, times the
    devices (one CPU's cores are measured together)."""
    if cfg.tracking.get("peak_flops"):
        peak, source = float(cfg.tracking.peak_flops), "configured"
    else:
        peak, source = measure_peak_flops("cuda" if hw.accelerator == "cuda" else "cpu", hw.infer_dtype), "measured"
    return Peak(peak * (shape.world if hw.accelerator == "cuda" else 1), source)


def check_memory(cfg: DictConfig, model: GPT, hw: Hardware, shape: StepShape) -> MemoryEstimate:
    """The memory per device the run needs (ablations/memory.py), printed once; over the device's memory, one
    line with the ways to make it fit."""
    ckpt_on = bool(cfg.get("activation_checkpointing", False))
    sharded = cfg.trainer.get("strategy") == FSDP_NAME
    est = estimate(model.config, shape.batch_size, shards=shape.world if sharded else 1,
                   compute_bytes=4 if hw.infer_dtype == torch.float32 else 2, checkpointing=ckpt_on)
    have, where = device_memory(hw.accelerator, shape.world // int(cfg.trainer.get("num_nodes", 1)))
    if _env_rank() == 0:
        print(f"[ablations] memory: {est.line()}; {where} has {size(have)}", flush=True)
    if est.total > have:
        fixes = ["a smaller data.batch_size with a larger trainer.accumulate_grad_batches (the same global batch)"]
        if not ckpt_on:
            fixes.append("activation_checkpointing=true")
        fixes.append("more devices with trainer=fsdp" if sharded else "trainer=fsdp (sharded over more devices)")
        raise ConfigError(f"the run needs ~{size(est.total)} per device (data.batch_size={shape.batch_size}, "
                          f"model.block_size={shape.block_size}) but {where} has {size(have)}: use "
                          f"{', or '.join(fixes)}")
    return est


def apply_budget(cfg: DictConfig, model: GPT, shape: StepShape) -> float | None:
    """trainer.budget.flops / tokens_per_param -> trainer.max_steps from this model's own FLOPs per token, so arms
    and sizes are compared at matched compute; trainer.budget.tokens -> max_steps from the tokens per step alone
    (matched data: ablations/budget.py). Returns the budget in FLOPs (None: none)."""
    budget = cfg.trainer.get("budget")
    flops = budget_flops(budget, model.config)
    if flops is not None:
        tokens = budget_tokens(budget)
        step = (shape.batch_size, shape.accumulate, shape.world)
        cfg.trainer.max_steps = steps_for_tokens(tokens, model.config, *step) if tokens is not None else \
            steps_for_budget(flops, model.config, *step)
    return flops


def count(model: GPT, hw: Hardware, budget: float | None) -> dict:
    """The model's accounting, logged as metrics at step 0 (and the budget, when there is one)."""
    from modules import accounting as acc

    pc = acc.param_counts(model.config)
    out = {"params": int(pc["params"]), "params_non_embedding": int(pc["params_non_embedding"]),
           "flops_per_token": int(acc.flops_per_token(model.config)),
           "kv_cache_bytes_per_token": int(acc.kv_cache_bytes_per_token(model.config, dtype=hw.infer_dtype))}
    return out if budget is None else {**out, "budget_flops": budget}


def plan_checkpoints(cfg: DictConfig) -> CheckpointPlan:
    """The checkpoint dir is named by the config hash; resume=auto resumes its last.ckpt if there is one."""
    chash = config_hash(cfg)
    ckpt_dir = Path(str(cfg.checkpoint.dir)).expanduser() / chash[:16]
    resume, path, source = cfg.get("resume"), None, None
    if resume == "auto":  # this dir's last.ckpt, else the one a run of this config logged (tracking.log_checkpoints)
        path, source = locate_auto(ckpt_dir, trk.tracking_uri(cfg), cfg.tracking, chash)
        if path is None:
            log.info("resume=auto: no checkpoint in %s, starting fresh", ckpt_dir)
    elif resume:
        path = Path(str(resume)).expanduser()
        if not path.exists():  # a file, or a sharded checkpoint's folder (trainer.strategy=fsdp)
            raise ConfigError(f"resume={resume}: no such checkpoint: use resume=auto or an existing .ckpt path")
    return CheckpointPlan(chash, ckpt_dir, path, source)


def build_lit_module(cfg: DictConfig, model: GPT, data: TokenData, ckpt: CheckpointPlan, hw: Hardware) -> LitGPT:
    """The LightningModule; `meta` goes into every checkpoint, to check a resume against."""
    tok = data.tokenizer
    meta = {"tokenizer": tok.identity(), "tokenizer_hash": tok.hash, "config_hash": ckpt.config_hash,
            "data_fingerprint": data.fingerprint, "model_config": model.config.to_dict()}
    lit = LitGPT(model, OmegaConf.to_container(cfg.optim, resolve=True), int(cfg.trainer.max_steps), meta)
    if cfg.get("compile"):
        lit.compile_model = True
    if cfg.trainer.get("strategy") == FSDP_NAME:
        lit.shard_precision = hw.precision
    lit.activation_checkpointing = bool(cfg.get("activation_checkpointing", False))
    return lit


def check_resume(ckpt: CheckpointPlan, lit: LitGPT, data: TokenData) -> dict | None:
    """The record of the checkpoint to resume from, checked against this model and tokenizer (None: fresh)."""
    if ckpt.resume_from is None:
        return None
    ck = load_resumable(ckpt.resume_from)
    check_compatible(ck, ckpt.resume_from, lit, data.tokenizer, sharded=lit.shard_precision is not None)
    if _env_rank() == 0:
        print(resumed_line(ck["ablations"], ckpt.resume_from, ckpt.source), flush=True)
    return ck["ablations"]


def build_metrics(cfg: DictConfig, uri: str, data: TokenData, shape: StepShape, accounting: dict,
                  peak: Peak) -> MetricsCallback:
    """The callback that logs loss, throughput and MFU to the run (its id is set once the run exists)."""
    log_every = int(cfg.tracking.get("log_every_n_steps") or cfg.trainer.get("log_every_n_steps", 10))
    return MetricsCallback(None, uri, shape.tokens, accounting["flops_per_token"], peak.flops, log_every,
                           data.val_tokens_per_byte, int(cfg.trainer.max_steps), trk.max_outage_s(cfg.tracking))


def build_trainer(cfg: DictConfig, hw: Hardware, ckpt: CheckpointPlan, metrics: MetricsCallback,
                  callbacks) -> pl.Trainer:
    """Lightning's Trainer from cfg.trainer, with the harness's callbacks; a bad value is one ConfigError line."""
    import lightning.pytorch as pl
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    ckpt_cb = AtomicCheckpoint(ckpt.dir, int(cfg.checkpoint.get("every_n_steps", 100)), metrics,
                               upload=trk.logs_checkpoints(cfg.tracking.get("log_checkpoints"), metrics.uri))
    tk = OmegaConf.to_container(cfg.trainer, resolve=True)
    tk["precision"] = hw.precision
    tk.pop("budget", None)  # ours, not Lightning's: already turned into max_steps
    if tk.get("limit_val_batches") is None:
        tk.pop("limit_val_batches", None)
    if tk.get("strategy") == FSDP_NAME:  # FSDP2 (ablations/sharding.py), not Lightning's FSDP1 of that name
        tk["strategy"] = FSDP(int(tk.get("devices")) * int(tk.get("num_nodes", 1)))
    elif tk.get("strategy") == "ddp_spawn":  # Lightning's, its ranks started by ablations/launch.py
        tk["strategy"] = DDPSpawn()
    ours = [metrics, ckpt_cb]
    if tk.get("enable_progress_bar", True) and wants_lines():  # a log file: lines, not a carriage-return stream
        tk["enable_progress_bar"] = False
        every = cfg.get("progress_every_n_steps") or line_every(int(cfg.trainer.max_steps), metrics.log_every)
        ours.append(LineProgress(metrics, int(every), int(cfg.trainer.max_steps)))
    tk.update(logger=False, enable_checkpointing=False, num_sanity_val_steps=0, check_val_every_n_epoch=None,
              max_epochs=-1, enable_model_summary=False, callbacks=[*ours, *callbacks])
    try:
        return pl.Trainer(**tk)
    except (TypeError, ValueError, MisconfigurationException) as e:
        raise ConfigError(f"trainer: {str(e).splitlines()[0]}") from None


# ------------------------------------------------------------------------------------------------- the run


def tags_of_run(cfg: DictConfig, hydra_tags: dict, tags: dict | None, data: TokenData, hw: Hardware, peak: Peak,
                ckpt: CheckpointPlan, shape: StepShape) -> dict[str, str]:
    """The run's tags: Hydra's choices, the git state, what ran on what, then the caller's `tags`."""
    import lightning.pytorch as pl

    run_tags = {**hydra_tags, **trk.git_state()}
    run_tags.update({
        "seed": str(cfg.seed), "data_fingerprint": data.fingerprint, "tokenizer": data.tokenizer.name,
        "tokenizer_hash": data.tokenizer.hash, "precision": hw.precision, "precision_reason": hw.precision_reason,
        **_device_tags(hw.accelerator), "torch_version": torch.__version__, "lightning_version": pl.__version__,
        **environment_tags(hw.accelerator), "mfu_peak_flops": f"{peak.flops:.4g}",
        "mfu_peak_source": peak.source, "config_hash": ckpt.config_hash, "world_size": str(shape.world)})
    run_tags.setdefault("variant", "baseline")
    run_tags.update({k: str(v) for k, v in (tags or {}).items()})
    return run_tags


def open_run(cfg: DictConfig, uri: str, run_tags: dict[str, str], hydra_name: str | None,
             resumed: dict | None) -> Run:
    """Create the MLflow run, or reopen the resumed checkpoint's run when it lives in this store."""
    from mlflow.exceptions import MlflowException

    cl = trk.client(uri)
    try:
        exp_id = trk.get_or_create_experiment(cl, uri, str(cfg.tracking.experiment))
    except MlflowException as e:
        raise TrackingError(f"tracking.uri={uri}: cannot open experiment {cfg.tracking.experiment!r} "
                            f"({one_line(e, 200)})") from None
    run_tags = dict(run_tags)
    # a run that ends waits no longer on the store than the outage the user said a run may wait out
    end_timeout = min(trk.END_TIMEOUT_S, trk.max_outage_s(cfg.tracking))
    run_name = trk.fit_run_name(run_tags.pop("mlflow.runName", None) or hydra_name or "default")
    run_id, prev = None, resumed.get("mlflow_run_id") if resumed else None
    if prev:
        try:
            r = cl.get_run(prev)
            run_id = r.info.run_id if r.info.experiment_id == exp_id else None
        except MlflowException:  # the run lives in another store: start a new one
            run_id = None
    if run_id:
        cl.update_run(run_id, status="RUNNING")
        if "failure_reason" in cl.get_run(run_id).data.tags:
            cl.delete_tag(run_id, "failure_reason")
        cl.set_tag(run_id, "resumed_from_step", str(resumed.get("step")))
        return Run(cl, run_id, uri, run_tags, trk.logged_through(cl, run_id), end_timeout)
    run_id = cl.create_run(exp_id, run_name=run_name, tags=run_tags).info.run_id
    return Run(cl, run_id, uri, run_tags, {}, end_timeout)


def log_run_start(cfg: DictConfig, run: Run, model: GPT, accounting: dict, hw: Hardware, peak: Peak,
                  ckpt: CheckpointPlan, resumed: bool) -> None:
    """Tags (again, on a reopened run), params, the resolved config, the accounting at step 0, and run.json in
    the checkpoint dir (which run this checkpoint belongs to); then one line on stdout."""
    cl, run_id = run.client, run.id
    for k, v in (run.tags.items() if resumed else []):
        cl.set_tag(run_id, k, v)
    trk.log_params(cl, run_id, trk.config_params(cfg))
    trk.log_params(cl, run_id, run_params(model, cfg.optim, hw.accelerator))  # optimizer, groups, parametrization
    # the resolved config first: a FAILED / KILLED run can be re-run too (python -m ablations.rerun)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.yaml").write_text(_config_yaml(cfg))
        cl.log_artifact(run_id, str(Path(tmp) / "config.yaml"))
    cl.log_batch(run_id, metrics=trk.drop_logged(_metric_list(dict(accounting), 0), run.logged))
    ckpt.dir.mkdir(parents=True, exist_ok=True)
    (ckpt.dir / "run.json").write_text(json.dumps({"run_id": run_id, "tracking_uri": run.uri,
                                                   "config_hash": ckpt.config_hash}))
    print(f"[ablations] run {run_id} | precision {hw.precision} ({hw.precision_reason}) | peak "
          f"{peak.flops:.3g} FLOP/s ({peak.source}) | params {accounting['params']:,} | ckpt {ckpt.dir}",
          flush=True)


def fit(cfg: DictConfig, trainer: pl.Trainer, lit: LitGPT, datamodule: TokenDataModule,
        ckpt: CheckpointPlan) -> None:
    # the training RNG stream (dropout) depends on the seed only, not on what ran since model init
    seed_all(derived_seed(int(cfg.seed), "fit"))
    relay = Path(tempfile.mkdtemp(prefix="ablations-relay-")) / "error.pkl"
    lit.error_relay = str(relay)
    try:
        trainer.fit(lit, datamodule=datamodule, ckpt_path=str(ckpt.resume_from) if ckpt.resume_from else None,
                    weights_only=True)
    except BaseException as e:  # noqa: BLE001 - re-raised, as the worker's own error where there is one
        mapped = _unwrap_spawn_error(e, relay)
        if mapped is not e:
            raise mapped from None
        raise
    finally:
        shutil.rmtree(relay.parent, ignore_errors=True)
    if trainer.interrupted:
        raise KeyboardInterrupt("training interrupted")


# ---------------------------------------------------------------------------------------------- afterwards


def trained_model(lit: LitGPT, hw: Hardware) -> GPT:
    """The trained model in eval mode, on the device it trained on (Lightning's teardown leaves it on the CPU)."""
    return lit.model.to("cuda" if hw.accelerator == "cuda" else "cpu").eval()


def steps_done(trainer: pl.Trainer, run: Run) -> int:
    steps = int(trainer.global_step)
    if not steps:  # ddp_spawn: the loop ran in the workers; their last logged step is the step count
        hist = run.client.get_metric_history(run.id, "tokens_seen")
        steps = max((h.step for h in hist), default=0)
    return steps


def after_training(cfg: DictConfig, run: Run, model: GPT, data: TokenData, hw: Hardware, accounting: dict,
                   steps: int) -> dict:
    """The generation benchmark, a sample, the final checkpoint and the tokenizer as artifacts; returns the
    summary `train` returns."""
    cl, run_id, tok, block_size = run.client, run.id, data.tokenizer, model.config.block_size
    ac_dtype = hw.infer_dtype if hw.infer_dtype != torch.float32 else None
    toks = data.memmap()
    prompt = torch.from_numpy(toks[data.n_train:data.n_train + block_size].astype("int64"))[None]  # (1, T)
    g = cfg.generate
    bench = generation_benchmark(model, prompt, int(g.bench_decode_tokens), int(g.bench_prefill_tokens),
                                 ac_dtype, hw.infer_dtype)
    sample = sample_text(model, tok, g, ac_dtype, int(cfg.seed))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "config.yaml").write_text(_config_yaml(cfg))
        (tmp / "sample.txt").write_text(sample)
        (tmp / "tokenizer.json").write_text(json.dumps(tok.identity()))
        final = final_checkpoint(model, model.config.to_dict(), tok, (tmp / "config.yaml").read_text(), steps,
                                 run_id)
        save_atomic(final, tmp / "checkpoints" / "final.ckpt")
        for f in ("sample.txt", "tokenizer.json"):
            cl.log_artifact(run_id, str(tmp / f))
        cl.log_artifact(run_id, str(tmp / "checkpoints" / "final.ckpt"), artifact_path="checkpoints")
    cl.log_batch(run_id, metrics=trk.drop_logged(_metric_list(bench, steps), run.logged))
    m = cl.get_run(run_id).data.metrics
    return {"run_id": run_id, "val_loss": m.get("final_val_loss"), "val_bpb": m.get("final_val_bpb"),
            "tokens_per_sec": m.get("final_tokens_per_sec"), "mfu": m.get("final_mfu"),
            "params": accounting["params"], "params_non_embedding": accounting["params_non_embedding"],
            "kv_cache_bytes_per_token": accounting["kv_cache_bytes_per_token"],
            "decode_tokens_per_sec": bench["decode_tokens_per_sec"],
            "flops_per_token": accounting["flops_per_token"], "steps": steps}


def end_run_on_error(run: Run | None, e: BaseException) -> None:
    """Never leave the run RUNNING: KILLED for a pruned trial or an interrupt, else FAILED with the reason."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException
    from mlflow.exceptions import MlflowException
    from optuna import TrialPruned

    if run is not None:
        pruned = isinstance(e, TrialPruned)
        interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
        status = "KILLED" if pruned or interrupted else "FAILED"
        reason = None if pruned else (f"interrupted ({one_line(e, 1000)})" if interrupted else one_line(e, 1000))
        try:
            trk.terminate(run.client, run.id, status, reason=reason,
                          extra_tags={"pruned": "true"} if pruned else None, timeout=run.end_timeout_s)
        except (MlflowException, TrackingError) as e2:
            log.error("could not mark MLflow run %s %s: %s", run.id, status, one_line(e2, 300))
    if isinstance(e, SIGTERMException):  # Lightning's is a SystemExit with code 0: exit 128+SIGTERM
        raise SystemExit(143) from e


# ------------------------------------------------------------------------------------------------- helpers


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
    """sha256 of the resolved config minus `resume`, `progress_every_n_steps`, `tracking.system_metrics*`,
    `tracking.log_checkpoints`, `tracking.max_outage_s` (and hydra): names the checkpoint dir of a run (so how a
    run reports its progress, and how it is watched and kept, do not decide which checkpoint it resumes)."""
    c = _container(cfg)
    c.pop("resume", None)
    c.pop("progress_every_n_steps", None)
    for k in ("system_metrics", "system_metrics_interval", "log_checkpoints", "max_outage_s"):  # how a run is watched
        c.get("tracking", {}).pop(k, None)
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()


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


def _config_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(_container(cfg)))


def _metric_list(d: dict, step: int):
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    return [Metric(k, float(v), ts, int(step)) for k, v in d.items() if v is not None and math.isfinite(float(v))]
