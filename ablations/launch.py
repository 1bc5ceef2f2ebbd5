"""How `trainer=ddp` (ddp_spawn) and `trainer=fsdp` start their ranks when nobody started them (a plain
`python -m ablations.run`, a sweep's in-process trial): forked from a fork server on CPU, spawned on GPUs.

A spawned rank is a cold interpreter: before it can unpickle the trainer it imports torch, Lightning and MLflow
again, ~6 s of CPU per rank, more than a small model's whole training. Python's fork server (multiprocessing's
"forkserver", the default start method from Python 3.14) is started once per process, imports those modules once
(`PRELOAD`), and forks each rank from itself: the ranks of a launch, and every later launch of the process (a
sweep's next trial, a resumed segment), pay a fork instead of the imports.

A fork server's child inherits the server's state, not the launching process's, and Lightning's launcher gives a
fork-server rank less than a spawned one. So the launcher hands each rank what spawn would have given it:
- the launching process's environment at launch (the server keeps the one it started with; the run's
  MASTER_PORT, cache and tracking variables are read from it), and its OMP_NUM_THREADS as torch's thread count
  (a spawned interpreter reads it at start-up; a forked one has the server's);
- the RNG states and deterministic flags (Lightning restores them in spawned ranks only);
- parameters of its own: tensors sent to a child arrive in shared memory, which Lightning undoes for spawned CPU
  ranks only, so fork-server ranks would otherwise step one shared copy of the weights.
What a rank keeps from the server: its standard streams (those the process had at its first launch) and what the
interpreter read at start-up. On GPUs the ranks are spawned, as before: Lightning refuses a fork server once the
launching process has initialised CUDA, and there a rank's start-up is small beside its training.
"""
from __future__ import annotations

import multiprocessing
import os

import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import (
    _disable_module_memory_sharing, _GlobalStateSnapshot, _MultiProcessingLauncher)

# what a rank unpickles and runs: imported once, in the fork server, when it starts (the process's first launch)
PRELOAD = ["lightning.pytorch", "ablations.train", "ablations.lit", "ablations.metrics", "ablations.checkpoints"]


def start_method(strategy) -> str:
    """"forkserver" for CPU ranks where the platform has it, else "spawn"."""
    cpu = isinstance(strategy.accelerator, CPUAccelerator)
    return "forkserver" if cpu and "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


class RankLauncher(_MultiProcessingLauncher):
    """Lightning's multiprocessing launcher with the start method of `start_method`, and in a fork-server rank the
    launching process's environment, thread count, global states and unshared parameters (module docstring)."""

    def __init__(self, strategy):
        super().__init__(strategy, start_method=start_method(strategy))
        self._parent: tuple[dict, _GlobalStateSnapshot] | None = None

    def launch(self, function, *args, trainer=None, **kwargs):
        if self._start_method == "forkserver":
            multiprocessing.set_forkserver_preload(PRELOAD)  # read once, when the server starts
            # Lightning's launch sets this before starting the ranks; set here first so the copy below holds it
            os.environ["MASTER_PORT"] = str(self._strategy.cluster_environment.main_port)
            self._parent = (dict(os.environ), _GlobalStateSnapshot.capture())
        return super().launch(function, *args, trainer=trainer, **kwargs)

    def _wrapping_function(self, process_idx, trainer, function, args, kwargs, return_queue, global_states=None):
        if self._parent is not None:  # in a rank forked from the server
            env, global_states = self._parent
            os.environ.clear()
            os.environ.update(env)
            if env.get("OMP_NUM_THREADS", "").isdigit():
                torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
            args, kwargs = _disable_module_memory_sharing((args, kwargs))
        super()._wrapping_function(process_idx, trainer, function, args, kwargs, return_queue, global_states)


class DDPSpawn(DDPStrategy):
    """trainer.strategy=ddp_spawn: Lightning's DDP with ranks started from inside `train`, by `RankLauncher`."""

    def __init__(self):
        super().__init__(start_method="spawn")

    def _configure_launcher(self) -> None:
        self._launcher = RankLauncher(self)
