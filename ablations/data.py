"""Token data for training: prepared shards read as one memory-mapped stream, and the Lightning data module.

``prepare_data`` returns the corpus's :class:`TokenData`, preparing it on first use (``ablations.prepare``: any
corpus of ``ablations.sources``, tokenized in parallel into shards). Train shards come first in the stream, then val
shards; nothing is concatenated and no document is held in memory.

Training reads windows of ``block_size + 1`` tokens (inputs ``w[:-1]``, targets ``w[1:]``) that may cross shard
boundaries but never the train/val boundary. The train stream is cut into ``n = n_train // (block_size + 1)``
disjoint windows per epoch, at a random offset, visited in a random order: window ``i`` of global batch ``g`` is
window ``g * batch_size + i`` of that sequence, found by a keyed permutation (no stored index), so batch ``j``
depends only on (seed, j), a resumed run continues exactly, and data-parallel ranks (global batch
``j * world + rank``) read disjoint windows within an epoch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import ConfigError, DataError
from .prepare import prepare
from .shards import HEADER_BYTES, SPLITS, Segment, TokenStream, read_header
from .sources import default_cache_dir  # noqa: F401 - re-exported: the cache location is part of the data API
from .splits import split_docs  # noqa: F401 - re-exported: the split prepare makes, for lists of documents
from .tokenizers import Tokenizer

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


# ------------------------------------------------------------------------------------------- token data
@dataclass
class TokenData:
    """A tokenized corpus: ``memmap()[:n_train]`` is train, the rest val. ``shards``: the segments in stream order;
    empty means ``path`` is one headerless token file (train then val)."""

    path: Path
    dtype: str
    n_train: int
    n_val: int
    val_bytes: int
    fingerprint: str
    tokenizer: Tokenizer
    shards: tuple = ()
    manifest: dict | None = None

    @property
    def val_tokens_per_byte(self) -> float:
        return self.n_val / max(1, self.val_bytes)

    def memmap(self) -> TokenStream:
        return TokenStream(self.shards or (Segment(Path(self.path), 0, self.n_train + self.n_val),), self.dtype)


def open_shards(folder: Path, m: dict, tok: Tokenizer) -> TokenData:
    """TokenData over a manifest's shards, each header checked against the manifest (sizes and checksums recorded;
    the payload hashes are checked by ``python -m ablations.prepare``)."""
    segments = []
    for split in SPLITS:
        for rec in m["splits"][split]["shards"]:
            head = read_header(folder / rec["file"])
            if head.sha256 != rec["sha256"] or head.n_tokens != rec["tokens"] or head.dtype != m["dtype"]:
                raise DataError(f"shard {folder / rec['file']} does not match {folder / 'manifest.json'} (another "
                                f"prepare wrote it): re-run `python -m ablations.prepare` with the same data= and "
                                f"tokenizer=")
            segments.append(Segment(head.path, HEADER_BYTES, head.n_tokens))
    tr, va = m["splits"]["train"], m["splits"]["val"]
    return TokenData(folder / "manifest.json", m["dtype"], tr["tokens"], va["tokens"], va["bytes"],
                     m["corpus"]["fingerprint"], tok, tuple(segments), m)


def prepare_data(data_cfg, tokenizer_name: str) -> TokenData:
    """The corpus's token data, tokenizing it into shards on first use (headers checked, not the payload hashes)."""
    folder, m, tok = prepare(data_cfg, tokenizer_name, verify=False)
    return open_shards(folder, m, tok)


def check_windows(td: TokenData, block_size: int) -> None:
    need = block_size + 1
    for split, n in (("train", td.n_train), ("val", td.n_val)):
        if n < need:
            raise DataError(
                f"the {split} split has {n} tokens, fewer than one window of model.block_size+1={need}: "
                f"use a longer corpus or a smaller model.block_size")


# ---------------------------------------------------------------------------------------------- windows
def window_batch(tokens, starts: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of block_size+1 tokens at ``starts``: inputs w[:, :-1], targets w[:, 1:] (shift by exactly one)."""
    idx = starts[:, None] + np.arange(block_size + 1)[None, :]  # (B, T+1)
    w = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return w[:, :-1], w[:, 1:]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective scramble of uint64 values (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permute(i: np.ndarray, n: int, key: int) -> np.ndarray:
    """A keyed bijection of [0, n): a 4-round Feistel network on the smallest even power of two >= n, cycle-walking
    values that land outside [0, n) (at most 4x the domain, so a few rounds). O(1) memory whatever n is."""
    half = max(1, math.ceil(math.log2(max(n, 2)) / 2))
    mask = np.uint64((1 << half) - 1)
    keys = [np.uint64((key * 4 + r + 1) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF) for r in range(4)]

    def rounds(x):
        left, right = x >> np.uint64(half), x & mask
        for k in keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << np.uint64(half)) | right

    x = rounds(np.asarray(i, dtype=np.uint64))
    out = x >= np.uint64(n)
    while out.any():
        x[out] = rounds(x[out])
        out = x >= np.uint64(n)
    return x.astype(np.int64)


def _epoch(seed: int, epoch: int, spare: int) -> tuple[int, int]:
    """(offset of the epoch's first window in [0, spare], permutation key) from (seed, epoch)."""
    rng = np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(epoch), 1]))
    return int(rng.integers(0, spare + 1)), int(rng.integers(0, 2**62))


def train_starts(seed: int, batch_index: int, batch_size: int, n_train: int, block_size: int) -> np.ndarray:
    """Start of each window of global batch ``batch_index``: disjoint windows of block_size+1 tokens, a random
    order and offset per epoch, all from (seed, batch_index). Last possible start: n_train - block_size - 1."""
    span = block_size + 1
    n = n_train // span
    if n < 1:
        raise DataError(f"the train split has {n_train} tokens, fewer than one window of model.block_size+1={span}: "
                        f"use a longer corpus or a smaller model.block_size")
    w = int(batch_index) * int(batch_size) + np.arange(int(batch_size), dtype=np.int64)  # global window numbers
    epoch, i = w // n, w % n
    starts = np.empty(len(w), dtype=np.int64)
    for e in np.unique(epoch):
        offset, key = _epoch(seed, int(e), n_train - n * span)
        m = epoch == e
        starts[m] = offset + span * permute(i[m], n, key)
    return starts


def val_starts(n_val: int, block_size: int, n_windows: int) -> np.ndarray:
    hi = n_val - block_size - 1
    n = max(1, min(int(n_windows), hi // block_size + 1))
    return np.unique(np.linspace(0, hi, n).astype(np.int64))


def data_rank() -> tuple[int, int]:
    """(world size, rank) of the data-parallel process group, (1, 0) outside one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


# ---------------------------------------------------------------------------------------------- loaders
class TrainBatches(torch.utils.data.IterableDataset):
    """Endless training batches; batch ``j`` of rank ``r`` is global batch ``j * world + r``."""

    def __init__(self, dm: "TokenDataModule", start: int):
        self.dm, self.start = dm, start

    def __iter__(self):
        dm = self.dm
        tokens = dm.tokens()
        world, rank = data_rank()
        j = self.start
        while True:
            s = train_starts(dm.seed, j * world + rank, dm.batch_size, dm.td.n_train, dm.block_size)
            yield window_batch(tokens, s, dm.block_size)
            j += 1


class ValBatches(torch.utils.data.Dataset):
    def __init__(self, dm: "TokenDataModule"):
        self.dm = dm
        self.starts = val_starts(dm.td.n_val, dm.block_size, dm.val_windows) + dm.td.n_train

    def __len__(self):
        return math.ceil(len(self.starts) / self.dm.batch_size)

    def __getitem__(self, i):
        b = self.dm.batch_size
        return window_batch(self.dm.tokens(), self.starts[i * b:(i + 1) * b], self.dm.block_size)


def _lightning_datamodule_base():
    import lightning.pytorch as pl

    return pl.LightningDataModule


class TokenDataModule(_lightning_datamodule_base()):
    """Train/val loaders over a :class:`TokenData`. State: ``position`` = training batches consumed."""

    def __init__(self, td: TokenData, block_size: int, batch_size: int, seed: int, val_windows: int = 128):
        super().__init__()
        if batch_size < 1:
            raise ConfigError(f"data.batch_size={batch_size} must be >= 1")
        self.td, self.block_size, self.batch_size, self.seed = td, int(block_size), int(batch_size), int(seed)
        self.val_windows = int(val_windows)
        self.position = 0
        self._tokens = None

    def __getstate__(self):  # ddp_spawn pickles the data module: reopen the memmaps in the worker
        d = dict(self.__dict__)
        d["_tokens"] = None
        return d

    def tokens(self) -> TokenStream:
        if self._tokens is None:
            self._tokens = self.td.memmap()
        return self._tokens

    def train_dataloader(self):
        return torch.utils.data.DataLoader(TrainBatches(self, self.position), batch_size=None, num_workers=0)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(ValBatches(self), batch_size=None, num_workers=0, shuffle=False)

    def state_dict(self):
        t = self.trainer
        pos = self.position
        if t is not None:  # checkpoints are taken at optimizer-step boundaries
            pos = int(t.global_step) * int(t.accumulate_grad_batches)
        return {"position": pos, "seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state):
        self.position = int(state.get("position", 0))
