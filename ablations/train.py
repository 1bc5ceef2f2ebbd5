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
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .data import TokenDataModule, check_windows, prepare_data
from .errors import (AblationsError, CheckpointError, ConfigError, DataError, DivergenceError, TokenizerError,
                     TrackingError)
from . import tracking as trk
from .repro import derived_seed, environment_tags, seed_all

__all__ = ["train", "DivergenceError", "ConfigError", "DataError", "TokenizerError", "TrackingError",
           "CheckpointError", "AblationsError", "config_hash", "load_final_checkpoint"]

log = logging.getLogger("ablations")
FINAL_FORMAT = "ablations-final-v1"

_NOISY = [
    r".*does not have many workers.*", r".*smaller than the logging interval.*", r".*resuming from a checkpoint that ended.*",
    r".*Checkpoint directory .* exists and is not empty.*", r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*Total length of `.*` across ranks is zero.*", r".*The `srun` command is available.*",
    r".*It is recommended to use `self.log\(.*sync_dist=True.*", r".*You are using `torch.load` with `weights_only=False`.*",
    r".*LeafSpec.*", r".*Found .* module\(s\) in eval mode.*",
]


def _quiet_lightning():
    for pat in _NOISY:
        warnings.filterwarnings("ignore", message=pat)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
                 "lightning.fabric.utilities.seed", "lightning.pytorch.trainer.connectors.signal_connector"):
        logging.getLogger(name).setLevel(logging.WARNING)


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
    """sha256 of the resolved config minus `resume` (and hydra): names the checkpoint dir of a run."""
    c = _container(cfg)
    c.pop("resume", None)
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
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(cfg.model)
    except InstantiationException as e:
        cause = e.__cause__ or e
        msg = str(cause).splitlines()[0] if str(cause) else repr(cause)
        raise ConfigError(f"model: {msg}") from None
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None


def _model_dict(cfg: DictConfig) -> dict:
    d = OmegaConf.to_container(cfg.model, resolve=True)
    for k in ("_target_", "_convert_", "_recursive_", "_partial_"):
        d.pop(k, None)
    return d


def _accounting(cfg_model: dict, inference_dtype) -> dict:
    from modules import accounting as acc

    pc = acc.param_counts(cfg_model)
    return {"params": int(pc["params"]), "params_non_embedding": int(pc["params_non_embedding"]),
            "flops_per_token": int(acc.flops_per_token(cfg_model)),
            "kv_cache_bytes_per_token": int(acc.kv_cache_bytes_per_token(cfg_model, dtype=inference_dtype))}


# what torch.load raises for a truncated / corrupt file, not a torch file, or an unsafe pickle
_BAD_CHECKPOINT = (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError)


def _load_checkpoint(path: Path) -> dict:
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except _BAD_CHECKPOINT as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint of this harness "
                              f"({_one_line(e)[:160]}): delete it, or start fresh with resume=null") from None
    if not isinstance(ck, dict) or "state_dict" not in ck or "ablations" not in ck:
        raise CheckpointError(f"checkpoint {path} is not a resumable checkpoint of this harness (no state_dict/"
                              f"ablations record): resume from a <checkpoint.dir>/<hash>/last.ckpt, or use resume=null")
    return ck


def _check_compatible(ck: dict, path: Path, lit, tok) -> None:
    meta = ck["ablations"]
    if meta.get("tokenizer_hash") != tok.hash:
        raise CheckpointError(f"checkpoint {path} was trained with tokenizer {meta.get('tokenizer')!r} "
                              f"(hash {str(meta.get('tokenizer_hash'))[:12]}), this config uses {tok.name} "
                              f"(hash {tok.hash[:12]}): resume with the same tokenizer and data, or resume=null")
    mine = {k: tuple(v.shape) for k, v in lit.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in ck["state_dict"].items()}
    if mine != theirs:
        diff = sorted(set(mine) ^ set(theirs)) or [k for k in mine if mine[k] != theirs[k]]
        k = diff[0]
        raise CheckpointError(f"checkpoint {path} does not match this model (first difference: {k} "
                              f"{theirs.get(k)} vs {mine.get(k)}): resume with the config it was trained with, "
                              f"or resume=null")


@torch.no_grad()
def generation_benchmark(model, prompt: torch.Tensor, decode_tokens: int, prefill_tokens: int,
                         autocast_dtype=None, cache_dtype=None) -> dict:
    """Batch-1 prefill tokens/sec, cached and uncached decode tokens/sec, and the cache bytes measured."""
    model.eval()
    dev = next(model.parameters()).device
    T = model.config.block_size
    n_new = max(1, min(int(decode_tokens), T // 2))
    n_pre = max(1, min(int(prefill_tokens), T))
    ctx = (torch.autocast(dev.type, dtype=autocast_dtype) if autocast_dtype is not None
           else torch.autocast(dev.type, enabled=False))

    def now():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    with ctx:
        x = prompt[:, :n_pre].to(dev)
        model(x)  # warm-up
        best = float("inf")
        for _ in range(3):
            t0 = now()
            model(x)
            best = min(best, now() - t0)
        prefill = x.size(1) / best
        p = prompt[:, :max(1, T - n_new)].to(dev)
        decode, nocache, nbytes = 0.0, 0.0, 0
        for _ in range(3):  # best of 3: the machine may be shared
            cache = model.new_cache(1, dtype=cache_dtype)
            nxt = model(p, cache=cache)[:, -1:].argmax(-1)
            t0 = now()
            for _ in range(n_new):
                nxt = model(nxt, cache=cache)[:, -1:].argmax(-1)
            decode = max(decode, n_new / (now() - t0))
            nbytes = int(cache.nbytes)
            seq = p
            t0 = now()
            for _ in range(n_new):
                nxt = model(seq[:, -T:])[:, -1:].argmax(-1)
                seq = torch.cat([seq, nxt], dim=1)
            nocache = max(nocache, n_new / (now() - t0))
    return {"prefill_tokens_per_sec": prefill, "decode_tokens_per_sec": decode,
            "decode_tokens_per_sec_nocache": nocache, "kv_cache_bytes_measured": nbytes}


def _save_atomic(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_final_checkpoint(path) -> dict:
    """Load a `checkpoints/final.ckpt` artifact (weights_only) and check its format."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except _BAD_CHECKPOINT as e:
        raise CheckpointError(f"{path} is corrupt or not a checkpoint ({_one_line(e)[:160]})") from None
    if not isinstance(ck, dict) or ck.get("format") != FINAL_FORMAT:
        raise CheckpointError(f"{path} is not a final checkpoint of this harness (format {FINAL_FORMAT})")
    return ck


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
    name = "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"device": accel, "device_name": name}


def train(cfg: DictConfig, callbacks=(), tags: dict | None = None) -> dict:
    """Train `cfg` (a composed config of conf/config.yaml) and record one MLflow run.

    Returns {run_id, val_loss, val_bpb, tokens_per_sec, mfu, params, params_non_embedding,
    kv_cache_bytes_per_token, decode_tokens_per_sec, flops_per_token, steps}.
    Raises ConfigError / DataError / TokenizerError / TrackingError / CheckpointError (before any run is created,
    where possible), DivergenceError on a NaN/inf loss. A run that was created is always ended: FINISHED, FAILED
    (tag failure_reason) or, for an exception class named TrialPruned, KILLED (tag pruned=true); then re-raised.
    `tags` are added to the run; `tags["mlflow.runName"]` names it. `callbacks` are extra Lightning callbacks.
    """
    import lightning.pytorch as pl
    from mlflow.exceptions import MlflowException

    from .lit import AtomicCheckpoint, LitGPT, resolve_accelerator, resolve_precision
    from .metrics import MetricsCallback, measure_peak_flops

    _quiet_lightning()
    t_start = time.time()
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
    rank = _env_rank()
    is_main = rank == 0

    # 1. tracking store first: an unreachable store fails before any data work or training
    uri = trk.tracking_uri(cfg)
    trk.check_reachable(uri)

    # 2. data and tokenizer (cached), model (validated by modules.config)
    td = prepare_data(cfg.data, str(cfg.tokenizer.name))
    tok = td.tokenizer
    if cfg.tokenizer.get("vocab_size") is None:
        cfg.tokenizer.vocab_size = tok.vocab_size
    elif int(cfg.tokenizer.vocab_size) != tok.vocab_size:
        raise ConfigError(f"tokenizer.vocab_size={cfg.tokenizer.vocab_size} but tokenizer {tok.name} has "
                          f"{tok.vocab_size} ids: leave tokenizer.vocab_size at its default")
    block_size = int(cfg.model.block_size)
    check_windows(td, block_size)
    seed_all(int(cfg.seed))  # model init depends on the seed only (see ablations.repro)
    model = _build_model(cfg)
    model_dict = _model_dict(cfg)

    # 3. hardware, precision, peak FLOP/s
    accel = resolve_accelerator(cfg.trainer.get("accelerator", "auto"))
    if accel == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={cfg.trainer.get('accelerator')} but no CUDA device is available: "
                          f"use trainer.accelerator=auto or cpu")
    precision, why = resolve_precision(cfg.trainer.get("precision", "auto"), accel)
    bf16 = precision.startswith("bf16")
    infer_dtype = torch.bfloat16 if bf16 else (torch.float16 if precision.startswith("16") else torch.float32)
    acct = _accounting(model_dict, infer_dtype)
    if cfg.tracking.get("peak_flops"):
        peak, peak_src = float(cfg.tracking.peak_flops), "configured"
    else:
        dev = "cuda" if accel == "cuda" else "cpu"
        peak, peak_src = measure_peak_flops(dev, infer_dtype if bf16 or precision.startswith("16") else torch.float32), "measured"
    devices = cfg.trainer.get("devices", 1)
    n_dev = devices if isinstance(devices, int) and devices > 0 else 1
    world = n_dev * int(cfg.trainer.get("num_nodes", 1))
    peak_total = peak * (world if accel == "cuda" else 1)

    # 4. checkpoint dir and resume
    chash = config_hash(cfg)
    ckpt_dir = Path(str(cfg.checkpoint.dir)).expanduser() / chash[:16]
    resume = cfg.get("resume")
    ckpt_path, resume_meta = None, None
    lit_meta = {"tokenizer": tok.identity(), "tokenizer_hash": tok.hash, "config_hash": chash,
                "data_fingerprint": td.fingerprint, "model_config": model_dict}
    lit = LitGPT(model, OmegaConf.to_container(cfg.optim, resolve=True), int(cfg.trainer.max_steps), lit_meta)
    if resume == "auto":
        if (ckpt_dir / "last.ckpt").is_file():
            ckpt_path = ckpt_dir / "last.ckpt"
        else:
            log.info("resume=auto: no checkpoint in %s, starting fresh", ckpt_dir)
    elif resume:
        ckpt_path = Path(str(resume)).expanduser()
        if not ckpt_path.is_file():
            raise ConfigError(f"resume={resume}: no such checkpoint file: use resume=auto or an existing .ckpt path")
    if ckpt_path is not None:
        ck = _load_checkpoint(ckpt_path)
        _check_compatible(ck, ckpt_path, lit, tok)
        resume_meta = ck["ablations"]
        del ck

    # the Trainer is built before the MLflow run: a bad trainer.* value leaves nothing behind
    dm = TokenDataModule(td, block_size, int(cfg.data.batch_size), int(cfg.seed),
                         int(cfg.data.get("val_windows", 128)))
    accum = int(cfg.trainer.get("accumulate_grad_batches", 1))
    tokens_per_step = int(cfg.data.batch_size) * block_size * accum * world
    metrics_cb = MetricsCallback(None, uri, tokens_per_step, acct["flops_per_token"], peak_total,
                                 int(cfg.tracking.get("log_every_n_steps") or cfg.trainer.get("log_every_n_steps", 10)),
                                 td.val_tokens_per_byte, int(cfg.trainer.max_steps))
    ckpt_cb = AtomicCheckpoint(ckpt_dir, int(cfg.checkpoint.get("every_n_steps", 100)), metrics_cb)
    tk = OmegaConf.to_container(cfg.trainer, resolve=True)
    tk["precision"] = precision
    if tk.get("limit_val_batches") is None:
        tk.pop("limit_val_batches", None)
    tk.update(logger=False, enable_checkpointing=False, num_sanity_val_steps=0, check_val_every_n_epoch=None,
              max_epochs=-1, enable_model_summary=False,
              callbacks=[metrics_cb, ckpt_cb, *callbacks])
    if cfg.get("compile"):
        lit.compile_model = True
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        trainer = pl.Trainer(**tk)
    except (TypeError, ValueError, MisconfigurationException) as e:
        raise ConfigError(f"trainer: {str(e).splitlines()[0]}") from None

    # 5. the MLflow run (rank 0 only; other ranks of a torchrun/SLURM job only train)
    cl, run_id = None, None
    if is_main:
        cl = trk.client(uri)
        try:
            exp_id = trk.get_or_create_experiment(cl, uri, str(cfg.tracking.experiment))
        except MlflowException as e:
            raise TrackingError(f"tracking.uri={uri}: cannot open experiment {cfg.tracking.experiment!r} "
                                f"({_one_line(e)[:200]})") from None
        run_tags = {**hydra_tags, **trk.git_state()}
        run_tags.update({
            "seed": str(cfg.seed), "data_fingerprint": td.fingerprint, "tokenizer": tok.name,
            "tokenizer_hash": tok.hash, "precision": precision, "precision_reason": why, **_device_tags(accel),
            "torch_version": torch.__version__, "lightning_version": pl.__version__,
            **environment_tags(accel), "mfu_peak_flops": f"{peak_total:.4g}",
            "mfu_peak_source": peak_src, "config_hash": chash, "world_size": str(world)})
        run_tags.setdefault("variant", "baseline")
        run_tags.update({k: str(v) for k, v in (tags or {}).items()})
        run_name = run_tags.pop("mlflow.runName", None) or name_from_hydra or "default"
        prev = resume_meta.get("mlflow_run_id") if resume_meta else None
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
            cl.set_tag(run_id, "resumed_from_step", str(resume_meta.get("step")))
        else:
            run_id = cl.create_run(exp_id, run_name=run_name, tags=run_tags).info.run_id
    lit.ckpt_meta["mlflow_run_id"] = run_id
    metrics_cb.run_id = run_id

    try:
        if is_main:
            for k, v in (run_tags.items() if resume_meta and run_id else []):
                cl.set_tag(run_id, k, v)
            trk.log_params(cl, run_id, trk.config_params(cfg))
            # the resolved config first: a FAILED / KILLED run can be re-run too (python -m ablations.rerun)
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "config.yaml").write_text(_config_yaml(cfg))
                cl.log_artifact(run_id, str(Path(tmp) / "config.yaml"))
            cl.log_batch(run_id, metrics=_metric_list({k: v for k, v in acct.items()}, 0))
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            (ckpt_dir / "run.json").write_text(json.dumps({"run_id": run_id, "tracking_uri": uri, "config_hash": chash}))
            print(f"[ablations] run {run_id} | precision {precision} ({why}) | peak {peak_total:.3g} FLOP/s "
                  f"({peak_src}) | params {acct['params']:,} | ckpt {ckpt_dir}", flush=True)

        # the training RNG stream (dropout) depends on the seed only, not on what ran since model init
        seed_all(derived_seed(int(cfg.seed), "fit"))
        relay = Path(tempfile.mkdtemp(prefix="ablations-relay-")) / "error.pkl"
        lit.error_relay = str(relay)
        try:
            trainer.fit(lit, datamodule=dm, ckpt_path=str(ckpt_path) if ckpt_path else None, weights_only=True)
        except BaseException as e:  # noqa: BLE001 - re-raised, as the worker's own error where there is one
            mapped = _unwrap_spawn_error(e, relay)
            if mapped is not e:
                raise mapped from None
            raise
        finally:
            shutil.rmtree(relay.parent, ignore_errors=True)
        if trainer.interrupted:
            raise KeyboardInterrupt("training interrupted")
        if not is_main:
            return {"run_id": None}

        # 6. after training: generation benchmark, sample, artifacts, summaries
        model = lit.model.to("cuda" if accel == "cuda" else "cpu")  # Lightning's teardown leaves it on CPU
        model.eval()
        ac_dtype = infer_dtype if infer_dtype != torch.float32 else None
        toks = td.memmap()
        prompt = torch.from_numpy(toks[td.n_train:td.n_train + block_size].astype("int64"))[None]
        g = cfg.generate
        bench = generation_benchmark(model, prompt, int(g.bench_decode_tokens), int(g.bench_prefill_tokens),
                                     ac_dtype, infer_dtype)
        sample = _sample_text(model, tok, g, ac_dtype, int(cfg.seed))
        steps = int(trainer.global_step)
        if not steps:  # ddp_spawn: the loop ran in the workers; their last logged step is the step count
            hist = cl.get_metric_history(run_id, "tokens_seen")
            steps = max((h.step for h in hist), default=0)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            (tmp / "config.yaml").write_text(_config_yaml(cfg))
            (tmp / "sample.txt").write_text(sample)
            (tmp / "tokenizer.json").write_text(json.dumps(tok.identity()))
            final = {"format": FINAL_FORMAT, "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                     "model_config": model_dict, "tokenizer": tok.identity(), "tokenizer_hash": tok.hash,
                     "config_yaml": (tmp / "config.yaml").read_text(), "step": steps, "run_id": run_id}
            _save_atomic(final, tmp / "checkpoints" / "final.ckpt")
            for f in ("sample.txt", "tokenizer.json"):
                cl.log_artifact(run_id, str(tmp / f))
            cl.log_artifact(run_id, str(tmp / "checkpoints" / "final.ckpt"), artifact_path="checkpoints")
        cl.log_batch(run_id, metrics=_metric_list(bench, steps))
        m = cl.get_run(run_id).data.metrics
        result = {"run_id": run_id, "val_loss": m.get("final_val_loss"), "val_bpb": m.get("final_val_bpb"),
                  "tokens_per_sec": m.get("final_tokens_per_sec"), "mfu": m.get("final_mfu"),
                  "params": acct["params"], "params_non_embedding": acct["params_non_embedding"],
                  "kv_cache_bytes_per_token": acct["kv_cache_bytes_per_token"],
                  "decode_tokens_per_sec": bench["decode_tokens_per_sec"],
                  "flops_per_token": acct["flops_per_token"], "steps": steps}
        cl.set_tag(run_id, "wall_sec", f"{time.time() - t_start:.1f}")
        trk.terminate(cl, run_id, "FINISHED")
        return result
    except BaseException as e:
        from lightning.pytorch.utilities.exceptions import SIGTERMException
        from optuna import TrialPruned

        if cl is not None and run_id is not None:
            pruned = isinstance(e, TrialPruned)
            interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
            status = "KILLED" if pruned or interrupted else "FAILED"
            reason = None if pruned else (f"interrupted ({_one_line(e)})" if interrupted else _one_line(e))
            try:
                trk.terminate(cl, run_id, status, reason=reason,
                              extra_tags={"pruned": "true"} if pruned else None)
            except MlflowException as e2:
                log.error("could not mark MLflow run %s %s: %s", run_id, status, e2)
        if isinstance(e, SIGTERMException):  # Lightning's is a SystemExit with code 0: exit 128+SIGTERM
            raise SystemExit(143) from e
        raise


def _config_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(_container(cfg)))


def _metric_list(d: dict, step: int):
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    return [Metric(k, float(v), ts, int(step)) for k, v in d.items() if v is not None and math.isfinite(float(v))]


def _sample_text(model, tok, g, ac_dtype, seed: int) -> str:
    try:
        ids = tok.encode(str(g.prompt)) or [tok.sep_id or 0]
    except TokenizerError:
        ids = [tok.sep_id or 0]
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.tensor([ids[-model.config.block_size:]], dtype=torch.long, device=dev)
    ctx = torch.autocast(dev.type, dtype=ac_dtype) if ac_dtype is not None else torch.autocast(dev.type, enabled=False)
    with ctx:
        out = model.generate(x, int(g.max_new_tokens), temperature=float(g.temperature),
                             top_k=int(g.top_k) if g.get("top_k") else None,
                             top_p=float(g.top_p) if g.get("top_p") else None, generator=gen)
    return tok.decode(out[0].tolist())
