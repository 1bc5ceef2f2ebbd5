"""Will it fit? The memory a training run needs per device, estimated before it starts.

    python -m ablations.memory             # the estimate against measured peak memory (RSS) at three sizes, CPU

Per device, for N parameters (fp32 master weights) sharded over `shards` ranks (1 without FSDP):
  parameters  4 N / shards
  gradients   4 N / shards
  optimizer   AdamW: two fp32 moments, 8 N / shards
  gathered    FSDP only: the largest unit's full parameters, twice (the one computing and the next, prefetched),
              and its full fp32 gradient before the reduce-scatter
  activations what autograd keeps from the forward for the backward, per token (bytes of the compute dtype a):
              each layer: the inputs of its matmuls (sum of in_features of the block's Linears), the outputs that
              feed a nonlinearity or the attention (out_features of the Linears that do not write into the
              residual stream), the two norm inputs (2 C); times n_layer; then the final norm's input (C), the head's
              input (C), the logits in fp32 and log-softmax's output, and the two fp32 gradients of those that
              the head's backward holds at once at the peak (16 V bytes).
              With activation checkpointing a layer keeps only its input (C) and one layer's full set is live
              again during its recomputation.
Live tensors only: the allocator's slack is not counted. Checked against peak RSS on CPU (this command, RSS made to
follow the live tensors): within 15% at three sizes and with checkpointing; arithmetic worked by hand in
tests/test_memory.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ablations.cli import Command, Option

GiB = 2**30


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device."""
    params: int
    grads: int
    optimizer: int
    gathered: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations

    def line(self) -> str:
        parts = ", ".join(f"{k} {size(v)}" for k, v in asdict(self).items())
        return f"{size(self.total)} per device ({parts})"


def size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def _layer_widths(model) -> tuple[int, int]:
    """(sum of in_features of one block's Linears, sum of out_features of those not writing into the residual)."""
    block = model.blocks[0]
    residual = {id(getattr(part, name)) for part in (block.attn, block.mlp)
                for name in type(part).residual_projections}
    linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
    return (sum(m.in_features for m in linears),
            sum(m.out_features for m in linears if id(m) not in residual))


def estimate(cfg, batch_size: int, seq_len: int | None = None, shards: int = 1, compute_bytes: int = 4,
             checkpointing: bool = False) -> MemoryEstimate:
    """The estimate for GPT config `cfg` (a GPTConfig or what GPT takes) training micro-batches of
    batch_size x seq_len tokens (default block_size) with AdamW, sharded over `shards` ranks."""
    from modules.accounting import _cfg
    from modules.gpt import GPT

    c = _cfg(cfg)
    T = c.block_size if seq_len is None else int(seq_len)
    with torch.device("meta"):
        model = GPT(c)
    n = model.num_params()
    p = -(-4 * n // shards)  # ceil: FSDP pads each shard to equal size
    gathered = 0
    if shards > 1:
        unit = max(sum(q.numel() for q in b.parameters()) for b in model.blocks)
        root = n - sum(q.numel() for q in model.blocks.parameters())
        gathered = max(unit, root) * (2 * compute_bytes + 4)
    ins, outs = _layer_widths(model)
    C, V, L = c.n_embd, c.vocab_size, c.n_layer
    layer = ins + outs + 2 * C  # numbers per token
    kept = (C * L + layer) if checkpointing else layer * L
    tokens = batch_size * T
    act = tokens * ((kept + 2 * C) * compute_bytes + 16 * V)
    return MemoryEstimate(params=p, grads=p, optimizer=2 * p, gathered=gathered, activations=act)


def checkpoint_blocks(model) -> None:
    """activation_checkpointing=true: each transformer block keeps only its input for the backward and recomputes
    the rest (torch's composable checkpoint: the parameter names, hence checkpoints, are unchanged; it composes
    with FSDP2's fully_shard, applied after it)."""
    from torch.distributed._composable import checkpoint

    for block in model.blocks:
        checkpoint(block)


def device_memory(accelerator: str, processes_here: int) -> tuple[int, str]:
    """(bytes, what) one rank may use: a CUDA device's memory, or on CPU this machine's RAM shared by the ranks
    that run on it."""
    if accelerator == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, f"the GPU ({torch.cuda.get_device_name(0)})"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = max(1, processes_here)
    return total // n, "this machine's RAM" + (f" / {n} processes" if n > 1 else "")


# ------------------------------------------------------------------------------------------------ the bench
SIZES = (  # (n_layer, n_head, n_embd, block_size, batch, activation checkpointing)
    (4, 4, 256, 256, 8, False),
    (6, 6, 384, 256, 16, False),
    (8, 8, 512, 512, 8, False),
    (8, 8, 512, 512, 8, True),
)
VOCAB = 8192  # a vocabulary whose logits do not dwarf the layers' activations
# The children's allocator: every allocation over 128 KiB its own mapping, unmapped when freed, so RSS follows the
# live tensors (what the estimate counts, and what torch.cuda.max_memory_allocated reports on a GPU) instead of
# the freed memory glibc keeps (ablations.malloc keeps up to 2 GiB of it by design; it leaves glibc's own MALLOC_*
# settings alone).
LIVE_RSS = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "0"}


def _rss_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(size) -> dict:
    """In a fresh process: peak RSS growth over 3 fp32 AdamW steps of the default GPT at `size`."""
    from modules.config import GPTConfig
    from modules.gpt import GPT

    from .malloc import keep_freed_memory

    torch.set_num_threads(1)
    keep_freed_memory()
    L, H, C, T, B, ckpt = size
    cfg = GPTConfig(vocab_size=VOCAB, n_layer=L, n_head=H, n_embd=C, block_size=T)
    x = torch.randint(0, VOCAB, (B, T))
    base = _rss_kib("VmRSS")
    model = GPT(cfg)
    if ckpt:
        checkpoint_blocks(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    for _ in range(3):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.float().view(-1, VOCAB), x.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"measured": (_rss_kib("VmHWM") - base) * 1024, "estimate": estimate(cfg, B, checkpointing=ckpt).total}


def bench() -> int:
    print("size (layers, heads, width, context, batch, checkpointed) | estimate | measured peak RSS growth | "
          "estimate/measured")
    worst = 0.0
    for size in SIZES:
        out = subprocess.run([sys.executable, "-m", "ablations.memory", f"measure={json.dumps(size)}"],
                             capture_output=True, text=True, check=True, env={**os.environ, **LIVE_RSS})
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = r["estimate"] / r["measured"]
        worst = max(worst, abs(ratio - 1))
        print(f"{size} | {r['estimate'] / GiB:.3f} GiB | {r['measured'] / GiB:.3f} GiB | {ratio:.3f}")
    print(f"largest difference: {worst:.1%} (target: within 15%)")
    return 0


COMMAND = Command(
    "ablations.memory", "", __doc__.splitlines()[0],
    options=(Option("bench", "estimate against measured peak RSS at three sizes (what the command does)", True,
                    switch=True),
             Option("measure", "internal: one size as JSON, measured in the bench's child process", parse=json.loads)))


def main(argv=None) -> int:
    o, _ = COMMAND.read(list(sys.argv[1:] if argv is None else argv))
    if o["measure"]:
        print(json.dumps(_measure(tuple(o["measure"]))))
        return 0
    return bench()


if __name__ == "__main__":
    sys.exit(main())
