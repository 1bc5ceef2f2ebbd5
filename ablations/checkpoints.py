"""Checkpoints: the resumable training state (`<checkpoint.dir>/<config hash>/last.ckpt`, written atomically by
`AtomicCheckpoint`) and the final weights artifact (`checkpoints/final.ckpt`, format FINAL_FORMAT).

Against an MLflow tracking server (`tracking.log_checkpoints=auto`) each `last.ckpt` is also logged as the run's
artifact `checkpoints/last.ckpt`; `resume=auto` with no local checkpoint fetches it from the newest run of the same
config (tag `config_hash`), so a job continues on another machine or after its node's disk is gone."""
from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path

import lightning.pytorch as pl
import torch

from .errors import CheckpointError, one_line
from .sources import atomic_write_bytes

FINAL_FORMAT = "ablations-final-v1"
SHARDED_META = "meta.pt"  # Lightning's file of a sharded checkpoint folder: everything but the weights and moments
LAST_ARTIFACT = "checkpoints/last.ckpt"  # the resumable checkpoint as a run artifact (tracking.log_checkpoints)

log = logging.getLogger("ablations")


# what torch.load raises for a truncated / corrupt file, not a torch file, or an unsafe pickle
_BAD_CHECKPOINT = (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError)


def load_resumable(path: Path) -> dict:
    """The checkpoint's record: Lightning's dict (torch.load, weights_only) with its `state_dict` shapes under
    "shapes"; for a sharded checkpoint, a folder, its metadata file and the shapes its shards were cut from."""
    try:
        ck = _load_sharded(path) if path.is_dir() else torch.load(path, map_location="cpu", weights_only=True)
    except _BAD_CHECKPOINT as e:
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint of this harness "
                              f"({one_line(e)[:160]}): delete it, or start fresh with resume=null") from None
    if not isinstance(ck, dict) or "ablations" not in ck or ("state_dict" not in ck and "shapes" not in ck):
        raise CheckpointError(f"checkpoint {path} is not a resumable checkpoint of this harness (no state_dict/"
                              f"ablations record): resume from a <checkpoint.dir>/<hash>/last.ckpt, or use resume=null")
    ck.setdefault("shapes", {k: tuple(v.shape) for k, v in ck.get("state_dict", {}).items()})
    return ck


def _load_sharded(path: Path) -> dict:
    """A sharded checkpoint (trainer.strategy=fsdp): Lightning's SHARDED_META (loops, schedules, callbacks, our
    record) and each weight's full shape from torch.distributed.checkpoint's metadata; no shard is read."""
    from torch.distributed.checkpoint import FileSystemReader

    ck = torch.load(path / SHARDED_META, map_location="cpu", weights_only=True)
    md = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    if isinstance(ck, dict):
        ck["shapes"] = {k.removeprefix("state_dict."): tuple(v.size) for k, v in md.items()
                        if k.startswith("state_dict.")}
    return ck


def check_compatible(ck: dict, path: Path, lit, tok, sharded: bool) -> None:
    """`ck` (load_resumable's) against this model, tokenizer and strategy: the first difference in one line."""
    meta = ck["ablations"]
    if path.is_dir() != sharded:
        saved, fix = ("sharded (trainer.strategy=fsdp)", "trainer=fsdp (any trainer.devices)") if path.is_dir() \
            else ("unsharded (one file)", "the trainer it was saved with (not trainer=fsdp)")
        raise CheckpointError(f"checkpoint {path} is {saved}: resume it with {fix}, or start fresh with resume=null")
    if meta.get("tokenizer_hash") != tok.hash:
        raise CheckpointError(f"checkpoint {path} was trained with tokenizer {meta.get('tokenizer')!r} "
                              f"(hash {str(meta.get('tokenizer_hash'))[:12]}), this config uses {tok.name} "
                              f"(hash {tok.hash[:12]}): resume with the same tokenizer and data, or resume=null")
    mine = {k: tuple(v.shape) for k, v in lit.state_dict().items()}
    theirs = ck["shapes"]
    if mine != theirs:
        diff = sorted(set(mine) ^ set(theirs)) or [k for k in mine if mine[k] != theirs[k]]
        k = diff[0]
        raise CheckpointError(f"checkpoint {path} does not match this model (first difference: {k} "
                              f"{theirs.get(k)} vs {mine.get(k)}): resume with the config it was trained with, "
                              f"or resume=null")


def save_atomic(obj, path: Path) -> None:
    """torch.save `obj` to `path` completely or not at all, through the harness's one atomic writer
    (ablations.sources.atomic_write_bytes). The bytes are held in memory once: a final checkpoint is the weights."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue(), fsync=True)


def load_final_checkpoint(path) -> dict:
    """Load a `checkpoints/final.ckpt` artifact (weights_only) and check its format."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except _BAD_CHECKPOINT as e:
        raise CheckpointError(f"{path} is corrupt or not a checkpoint ({one_line(e)[:160]})") from None
    if not isinstance(ck, dict) or ck.get("format") != FINAL_FORMAT:
        raise CheckpointError(f"{path} is not a final checkpoint of this harness (format {FINAL_FORMAT})")
    return ck


class AtomicCheckpoint(pl.Callback):
    """Every `every_n_steps` optimizer steps and at the end: write `<dir>/last.ckpt` atomically (tmp + os.replace).

    `trainer.save_checkpoint` is collective (every rank calls it; rank 0 writes)."""

    def __init__(self, dirpath: str | Path, every_n_steps: int, metrics=None, upload: bool = False):
        self.metrics = metrics  # MetricsCallback: its run_id / uri name the run an upload goes to
        self.dirpath = Path(dirpath)
        self.every = int(every_n_steps)
        self.upload = bool(upload)
        self._last_saved = -1

    @property
    def last_path(self) -> Path:
        return self.dirpath / "last.ckpt"

    def save(self, trainer: pl.Trainer):
        step = trainer.global_step
        if step == self._last_saved:
            return
        sharded = is_sharding(trainer.strategy)  # a folder of one shard per rank (rank 0's name: it is broadcast)
        tmp = self.dirpath / (f"shards-{step}-{os.getpid()}" if sharded else f".last.ckpt.tmp-{os.getpid()}")
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        trainer.strategy.barrier("ablations.ckpt.mkdir")
        t0 = time.perf_counter()
        trainer.save_checkpoint(tmp, weights_only=False)
        if trainer.is_global_zero:
            if sharded:
                publish_folder(tmp, self.last_path)
            else:
                os.replace(tmp, self.last_path)
            if self.upload:
                self.log_artifact()
        trainer.strategy.barrier("ablations.ckpt.replace")
        self._last_saved = step
        if self.metrics is not None:  # checkpoint time is not training time
            self.metrics.pause(time.perf_counter() - t0)

    def log_artifact(self) -> None:
        """`last.ckpt` -> the run's artifact checkpoints/last.ckpt. A failed upload (the server down past MLflow's
        own retries) is a warning: the local checkpoint stands and the next one uploads again."""
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        run_id = getattr(self.metrics, "run_id", None)
        if not run_id:
            return
        cl, last = MlflowClient(tracking_uri=self.metrics.uri), self.last_path
        try:
            if last.is_dir():  # sharded: the folder's files under checkpoints/last.ckpt/
                self.metrics.call(cl.log_artifacts, run_id, str(last.resolve()), artifact_path=LAST_ARTIFACT)
            else:
                self.metrics.call(cl.log_artifact, run_id, str(last),  # outage-bounded
                                  artifact_path=str(Path(LAST_ARTIFACT).parent))
        except (MlflowException, OSError) as e:
            log.warning("could not log %s as artifact %s of run %s: %s", self.last_path, LAST_ARTIFACT, run_id,
                        one_line(e)[:200])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every > 0 and step > 0 and step % self.every == 0 and step != self._last_saved:
            self.save(trainer)

    def on_train_end(self, trainer, pl_module):
        self.save(trainer)


def is_sharding(strategy) -> bool:
    from .sharding import FSDP

    return isinstance(strategy, FSDP)


def publish_folder(folder: Path, last: Path) -> None:
    """Make `last` name the complete checkpoint `folder` atomically: `last` is a symbolic link to it (a folder cannot
    be os.replace'd over another), swapped in one os.replace; then the folders it no longer names (the previous
    checkpoint, a save a kill left unfinished) are removed. At every instant `last` names a complete checkpoint."""
    link = last.parent / f".{last.name}.link-{os.getpid()}"
    link.unlink(missing_ok=True)
    os.symlink(folder.name, link)
    if last.is_dir() and not last.is_symlink():  # a folder fetched from a run's artifacts: replaced by the link
        shutil.rmtree(last)
    os.replace(link, last)
    for old in last.parent.glob("shards-*"):
        if old.name != folder.name:
            shutil.rmtree(old, ignore_errors=True)


def final_checkpoint(model, model_dict: dict, tok, config_yaml: str, step: int, run_id: str) -> dict:
    """The `checkpoints/final.ckpt` artifact: weights, model config and tokenizer identity (loads weights_only)."""
    return {"format": FINAL_FORMAT, "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "model_config": model_dict, "tokenizer": tok.identity(), "tokenizer_hash": tok.hash,
            "config_yaml": config_yaml, "step": step, "run_id": run_id}


def locate_auto(ckpt_dir: Path, uri: str, tracking_cfg, config_hash: str) -> tuple[Path | None, str | None]:
    """`resume=auto`: (`ckpt_dir`/last.ckpt, None) if it exists; else, where checkpoints are logged
    (`tracking.log_checkpoints`), the one the newest run of this config logged, downloaded there, and a note of
    where it came from; else (None, None): start fresh."""
    from .tracking import logs_checkpoints

    last = ckpt_dir / "last.ckpt"
    if last.exists():  # a file, or (sharded) a link to a folder
        return last, None
    if not logs_checkpoints(tracking_cfg.get("log_checkpoints"), uri):
        return None, None
    run_id = fetch_logged_checkpoint(uri, str(tracking_cfg.get("experiment")), config_hash, last)
    return (last, f"artifact {LAST_ARTIFACT} of run {run_id}") if run_id else (None, None)


def fetch_logged_checkpoint(uri: str, experiment: str, config_hash: str, dest: Path) -> str | None:
    """Download LAST_ARTIFACT of the newest run of `experiment` tagged `config_hash` to `dest` (atomically).
    Returns that run's id, or None when no run of this config logged one."""
    from mlflow.exceptions import MlflowException

    from .tracking import client

    cl = client(uri)
    exp = cl.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = cl.search_runs([exp.experiment_id], filter_string=f"tags.config_hash = '{config_hash}'",
                          order_by=["attributes.start_time DESC"], max_results=20)
    folder = str(Path(LAST_ARTIFACT).parent)
    for run in runs:
        if LAST_ARTIFACT not in {f.path for f in cl.list_artifacts(run.info.run_id, folder)}:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
            try:
                got = cl.download_artifacts(run.info.run_id, LAST_ARTIFACT, tmp)
            except (MlflowException, OSError) as e:
                raise CheckpointError(f"checkpoint {LAST_ARTIFACT} of run {run.info.run_id} at {uri} could not be "
                                      f"downloaded ({one_line(e)[:160]}): retry, or start fresh with resume=null"
                                      ) from None
            os.replace(got, dest)
        return run.info.run_id
    return None


def resumed_line(meta: dict, path: Path, source: str | None = None) -> str:
    """The one line a resumed run prints: where it continues."""
    return f"[ablations] resumed from step {meta.get('step')} (checkpoint {path}{'; ' + source if source else ''})"
