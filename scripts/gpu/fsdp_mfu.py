"""gpt2-124m under trainer=fsdp on the GPU check's device: training tokens/s, MFU and peak memory against the
harness's estimate, through the harness's own FSDP path (LitGPT.configure_model -> fully_shard per block, Lightning's
ModelParallelStrategy as ablations.sharding.FSDP), on the lent GPUs (one on the H200 machine: world size 1, so the
figure is FSDP2's overhead against scripts/gpu_bench.sh's plain bf16-mixed one, not a scaling figure).

    python scripts/gpu/fsdp_mfu.py --out DIR                       # CUDA: gpt2-124m, batch 32 x 1024, bf16-mixed
    python scripts/gpu/fsdp_mfu.py --out DIR --device cpu          # the rehearsal: model=tiny, 2 timed steps

Random tokens (throughput does not depend on the text); no MLflow (the device image has none). Writes DIR/fsdp.json.
MFU is against --peak-tflops (989: the H200's dense bf16, as device.sh uses).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ablations.lit import LitGPT, quiet_lightning  # noqa: E402
from ablations.memory import estimate  # noqa: E402
from ablations.sharding import FSDP  # noqa: E402


class Timer(pl.Callback):
    """Times optimizer steps after `warmup` of them; rank 0 writes the figures at the end of training."""

    def __init__(self, warmup: int, out: Path, tokens_per_step: int, flops_per_token: int, peak: float, extra: dict):
        self.warmup, self.out, self.tokens, self.fpt, self.peak, self.extra = warmup, out, tokens_per_step, \
            flops_per_token, peak, extra

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.warmup:
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        cuda = pl_module.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        steps = trainer.global_step - self.warmup
        tps = steps * self.tokens / (time.perf_counter() - self.t0)
        peak_mem = torch.cuda.max_memory_allocated() if cuda else None
        if not trainer.is_global_zero:
            return
        r = {**self.extra, "timed_steps": steps, "tokens_per_sec": tps, "mfu": self.fpt * tps / self.peak,
             "peak_memory_allocated": peak_mem,
             "estimate_over_measured": self.extra["memory_estimate"] / peak_mem if peak_mem else None}
        self.out.write_text(json.dumps(r, indent=1))
        print(f"fsdp_mfu: {r['model']} FSDP x{r['world']} {r['precision']}: {tps:,.0f} tok/s, MFU {r['mfu']:.1%} "
              f"of {self.peak / 1e12:.3g} TFLOP/s; peak memory {(peak_mem or 0) / 2**30:.2f} GiB (estimate "
              f"{r['memory_estimate'] / 2**30:.2f})")


def main(argv=None) -> int:
    from modules import accounting
    from modules.config import GPTConfig
    from modules.gpt import GPT

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 30 on CUDA, 2 on CPU)")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args(argv)
    quiet_lightning()
    cuda = a.device.startswith("cuda")
    # gpt2-124m (conf/model/gpt2-124m.yaml, tokenizer=gpt2) on CUDA; model=tiny's shape for the CPU rehearsal
    shape = dict(vocab_size=50257, n_layer=12, n_head=12, n_embd=768, block_size=1024, bias=True) if cuda else \
        dict(vocab_size=256, n_layer=2, n_head=4, n_embd=32, block_size=32)
    B, warmup = (32, 5) if cuda else (2, 1)
    steps = a.steps or (30 if cuda else 2)
    world = torch.cuda.device_count() if cuda else 1
    precision = "bf16-mixed" if cuda else "32-true"
    cfg = GPTConfig(**shape)
    torch.manual_seed(0)
    model = GPT(cfg)
    lit = LitGPT(model, {"name": "adamw", "lr": 6e-4, "weight_decay": 0.1, "warmup_steps": 0},
                 max_steps=warmup + steps)
    lit.shard_precision = precision
    T = cfg.block_size
    data = [(x, x) for x in torch.randint(0, cfg.vocab_size, (warmup + steps + 1, B, T))]  # (B, T) pairs
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = {"model": "gpt2-124m" if cuda else "tiny", "world": world, "precision": precision, "batch_size": B,
             "block_size": T, "params": accounting.param_counts(cfg)["params"],
             "flops_per_token": accounting.flops_per_token(cfg), "peak_flops": a.peak_tflops * 1e12,
             "device": torch.cuda.get_device_name(0) if cuda else "cpu",
             "memory_estimate": estimate(cfg, B, shards=world, compute_bytes=2 if cuda else 4).total}
    timer = Timer(warmup, out / "fsdp.json", B * T * world, extra["flops_per_token"], a.peak_tflops * 1e12, extra)
    trainer = pl.Trainer(accelerator="gpu" if cuda else "cpu", devices=world, strategy=FSDP(world),
                         precision=precision, max_steps=warmup + steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         num_sanity_val_steps=0, gradient_clip_val=1.0, callbacks=[timer])
    trainer.fit(lit, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None))
    return 0 if (out / "fsdp.json").is_file() else 1


if __name__ == "__main__":
    sys.exit(main())
