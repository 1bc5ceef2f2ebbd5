"""The thin LightningModule around modules.gpt.GPT, the atomic checkpoint callback, and precision selection."""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F

from .compiling import compile_model
from .errors import DivergenceError
from .schedule import build_lr_lambda

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ noise
_NOISY = [
    r".*does not have many workers.*", r".*smaller than the logging interval.*", r".*resuming from a checkpoint that ended.*",
    r".*Checkpoint directory .* exists and is not empty.*", r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*Total length of `.*` across ranks is zero.*", r".*The `srun` command is available.*",
    r".*It is recommended to use `self.log\(.*sync_dist=True.*", r".*You are using `torch.load` with `weights_only=False`.*",
    r".*LeafSpec.*", r".*Found .* module\(s\) in eval mode.*",
]


def quiet_lightning():
    """Silence Lightning's warnings that say nothing about this harness's runs."""
    for pat in _NOISY:
        warnings.filterwarnings("ignore", message=pat)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
                 "lightning.fabric.utilities.seed", "lightning.pytorch.trainer.connectors.signal_connector"):
        logging.getLogger(name).setLevel(logging.WARNING)


# ------------------------------------------------------------------------------------------------ precision
def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    words = set()
    for line in flags.splitlines():
        if line.startswith("flags"):
            words.update(line.split(":", 1)[1].split())
            break
    return bool(words & {"amx_bf16", "avx512_bf16"})


def resolve_accelerator(accelerator: str) -> str:
    if accelerator in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if accelerator == "gpu" else str(accelerator)


def resolve_precision(requested, accelerator: str) -> tuple[str, str]:
    """-> (precision, why). ``auto``: bf16-mixed where bf16 is native (CUDA bf16, CPU AMX/AVX512-BF16), else 32-true."""
    if requested not in (None, "auto"):
        return str(requested), "configured"
    if accelerator == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return "bf16-mixed", "auto: CUDA device supports bf16"
        return "32-true", "auto: CUDA device without bf16"
    if accelerator == "cpu":
        if cpu_has_native_bf16():
            return "bf16-mixed", "auto: CPU has amx_bf16/avx512_bf16"
        return "32-true", "auto: CPU without native bf16"
    return "32-true", f"auto: accelerator {accelerator}"


# --------------------------------------------------------------------------------------------- the module
def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class LitGPT(pl.LightningModule):
    def __init__(self, model: torch.nn.Module, optim: dict, max_steps: int, ckpt_meta: dict | None = None):
        super().__init__()
        self.model = model
        self.optim = dict(optim)
        self.max_steps = int(max_steps)
        self.ckpt_meta = dict(ckpt_meta or {})
        self.grad_norm: float | None = None
        self._loss_sum = None
        self._loss_n = 0
        self.compile_model = False
        self._compiled = None
        # set by train(): where a ddp_spawn worker leaves its harness error for the parent (see _relay)
        self.error_relay: str | None = None
        # trainer.strategy=fsdp: the run's precision, for FSDP2's mixed-precision policy (None: not sharded)
        self.shard_precision: str | None = None
        self.activation_checkpointing = False  # activation_checkpointing=true: applied in configure_model
        self._checkpointed = False

    def __getstate__(self):  # ddp_spawn pickles the module: compile in the worker
        d = super().__getstate__()
        d["_compiled"] = None
        return d

    def setup(self, stage):
        quiet_lightning()  # also in ddp_spawn workers

    def on_fit_start(self):
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # Lightning never destroys the process group; a ddp_spawn worker that exits with gloo's threads still
            # alive can die in std::terminate (SIGABRT) at interpreter shutdown. Destroy it cleanly on exit instead.
            atexit.register(_destroy_process_group)
        if self.compile_model and self._compiled is None:
            # not registered as a submodule: state_dict keys stay those of the eager model
            object.__setattr__(self, "_compiled", compile_model(self.model))

    def configure_model(self):
        # ModelParallelStrategy calls this on every rank once its device mesh exists (ablations/sharding.py)
        from .memory import checkpoint_blocks
        from .sharding import is_sharded, shard_model

        if self.activation_checkpointing and not self._checkpointed:  # before sharding: FSDP2 wraps the result
            checkpoint_blocks(self.model)
            self._checkpointed = True
        if self.shard_precision is not None and not is_sharded(self.model):
            shard_model(self.model, self.device_mesh["data_parallel"], self.shard_precision)

    def on_fit_end(self):
        # the full weights on rank 0 (collective), for what the run does after training and for ddp_spawn-style
        # workers to hand back to the parent process
        from .sharding import gathered_model, is_sharded

        if is_sharded(self.model):
            self.model = gathered_model(self.model, self.global_rank)

    def forward(self, idx):
        return self.model(idx)

    def _loss(self, batch):
        x, y = batch
        logits = (self._compiled if self._compiled is not None else self.model)(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        # on CUDA a host sync every step would cost throughput: check every 10 steps (NaN weights stay NaN)
        if (self.device.type != "cuda" or self.global_step % 10 == 0) and not torch.isfinite(loss):
            raise self._relay(DivergenceError(
                f"training loss is {loss.item()} at step {self.global_step} (optim.lr={self.optim.get('lr')}): "
                f"lower optim.lr, raise optim.warmup_steps or keep trainer.gradient_clip_val"))
        d = loss.detach()
        self._loss_sum = d if self._loss_sum is None else self._loss_sum + d
        self._loss_n += 1
        return loss

    def _relay(self, err: Exception) -> Exception:
        """Pickle `err` where the parent of a ddp_spawn worker finds it: the parent only gets the traceback text."""
        if self.error_relay:
            tmp = f"{self.error_relay}.{os.getpid()}"
            with open(tmp, "wb") as f:
                pickle.dump(err, f)
            os.replace(tmp, self.error_relay)
        return err

    def pop_train_loss(self) -> float | None:
        """The mean training loss since the last call, over every data-parallel rank (the global batch's; every
        rank calls it at the same step)."""
        if not self._loss_n:
            return None
        total = self._loss_sum.float() / self._loss_n
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            total = total.clone()
            torch.distributed.all_reduce(total)
            total /= torch.distributed.get_world_size()
        v = float(total)
        self._loss_sum, self._loss_n = None, 0
        return v

    def validation_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=batch[0].size(0), logger=False)
        return loss

    def configure_optimizers(self):
        from .optim import build_optimizer  # AdamW, or Muon + AdamW, over the roles the model declares

        o = self.optim
        opt = build_optimizer(self.model, o)
        # every group: its own lr times the same multiplier (warm-up, then cosine or warm-up-stable-decay)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, build_lr_lambda(o, self.max_steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else None
        if hasattr(norm, "full_tensor"):  # FSDP: each rank's norm is of its shards; the total is their reduction
            norm = norm.full_tensor()
        self.grad_norm = norm
        if gradient_clip_val and (gradient_clip_algorithm in (None, "norm")):
            torch.nn.utils.clip_grads_with_norm_(params, float(gradient_clip_val), norm)
        elif gradient_clip_val:
            torch.nn.utils.clip_grad_value_(params, float(gradient_clip_val))

    def on_save_checkpoint(self, checkpoint):
        checkpoint["ablations"] = dict(self.ckpt_meta, step=int(self.global_step))
