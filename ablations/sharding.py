"""trainer.strategy=fsdp: parameters, gradients and optimizer states sharded across the data-parallel ranks with
PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`), through Lightning's `ModelParallelStrategy`.

Why that strategy: Lightning's `FSDPStrategy` wraps FSDP1 (`FullyShardedDataParallel`, flat parameters), which
PyTorch has deprecated in favour of FSDP2 (per-parameter DTensor shards); `ModelParallelStrategy` is Lightning's path
for FSDP2: it sets up the process group and a device mesh, calls `LightningModule.configure_model` (where
`shard_model` below applies `fully_shard`) and saves and loads checkpoints with torch.distributed.checkpoint (one
shard per rank, reshardable to another world size). It also runs on CPU processes over gloo, which is how the tests
exercise it.

The harness's `FSDP` subclass only changes how the processes start when nobody started them (a plain
`python -m ablations.run`, or a sweep's in-process trial): from inside `train` by ablations/launch.py, as
`trainer=ddp`'s ddp_spawn ranks are. Under torchrun or SLURM each rank runs the command and Lightning starts nothing.
"""
from __future__ import annotations

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from .errors import ConfigError
from .launch import RankLauncher

NAME = "fsdp"  # trainer.strategy=fsdp (Lightning's own "fsdp" is FSDP1: the harness maps the name to FSDP2)


class FSDP(ModelParallelStrategy):
    """FSDP2 over `world` data-parallel ranks (no tensor parallelism); processes started (ablations/launch.py) when
    none were."""

    def __init__(self, world: int):
        super().__init__(data_parallel_size=world, tensor_parallel_size=1)

    def _configure_launcher(self) -> None:
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = RankLauncher(self)


def check_fsdp(cfg) -> None:
    """What FSDP cannot take, refused in one line before anything is built."""
    if str(cfg.optim.get("name", "adamw")) == "muon":
        # Newton-Schulz orthogonalises a whole matrix (each fused block of it); FSDP2 leaves each rank a slice of
        # rows, so Muon would need every matrix gathered (or whole matrices assigned to ranks) at each step.
        raise ConfigError("optim=muon with trainer.strategy=fsdp: Muon orthogonalises whole matrices and FSDP "
                          "shards them by rows; use optim=adamw under FSDP, or trainer=ddp with optim=muon")
    devices = cfg.trainer.get("devices")
    if not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"trainer.devices={devices!r} with trainer.strategy=fsdp: give the number of devices "
                          f"per node, e.g. trainer.devices=2")


def mixed_precision(precision: str):
    """FSDP2's policy for the run's precision: under bf16-mixed (16-mixed) the parameters are gathered and used in
    bf16 (fp16) and gradients reduced in fp32, as the master weights and optimizer states stay fp32; otherwise
    parameters and gradients keep their dtype (32-true; bf16-true has converted the model already)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    low = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low is not None else None)


def shard_model(model: torch.nn.Module, mesh, precision: str) -> None:
    """Shard `model` (a modules.gpt.GPT) in place: one FSDP unit per transformer block (its parameters gathered
    just before its forward and backward, freed after), and the root unit for what is left (embeddings, the final
    norm, the head; a tied head is the embedding's one matrix, so both stay in the same unit)."""
    from torch.distributed.fsdp import fully_shard

    mp = mixed_precision(precision)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def gathered_model(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """The sharded `model`'s full weights as a plain GPT on the CPU of rank 0 (collective: every rank calls it;
    the others get their sharded model back). What the run does after training (the sample, the generation
    benchmark, the final checkpoint) reads this one model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from modules.gpt import GPT

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return model
    plain = GPT(model.config)
    plain.load_state_dict(full)
    return plain
