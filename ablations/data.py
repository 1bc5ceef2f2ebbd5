"""Corpora, the token cache and the Lightning data module.

A corpus is a list of documents ``(name, text)`` in a deterministic order. It is split into train/val
deterministically (by a hash of each document's name when there are enough documents, else by cutting each
document at a line break), tokenized once, packed with the tokenizer's separator, and cached as one memory-mapped
token file keyed by (corpus fingerprint, tokenizer identity, split). Training reads random windows of
``block_size + 1`` tokens: inputs ``w[:-1]``, targets ``w[1:]``. Window ``i`` of batch ``j`` depends only on
(seed, j), so the data position is just the number of batches consumed, restored on resume.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sysconfig
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import AblationsError, ConfigError, DataError
from .tokenizers import CharTokenizer, Tokenizer, build_tokenizer, tokenizer_from_identity

log = logging.getLogger(__name__)

DATASETS = ("pystdlib", "shakespeare", "text")
SPLIT_VERSION = 1
MIN_DOCS_FOR_DOC_SPLIT = 20


def default_cache_dir(cfg_value=None) -> Path:
    if cfg_value:
        return Path(str(cfg_value)).expanduser()
    if os.environ.get("ABLATIONS_CACHE_DIR"):
        return Path(os.environ["ABLATIONS_CACHE_DIR"]).expanduser()
    return Path.home() / ".cache" / "ablations"


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------------------------- corpora
def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"corpus file {path} is not UTF-8 text ({e.reason} at byte {e.start}): "
                        f"convert it or exclude it with data.glob") from None
    except OSError as e:
        raise DataError(f"cannot read corpus file {path}: {e.strerror}") from None


def pystdlib_docs(root: str | None = None) -> list[tuple[str, str]]:
    """The interpreter's standard-library ``*.py`` files (no test suites, no site-packages), sorted by path."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise DataError(f"data.path={base} (the standard library) is not a directory: set data.path to one")
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    docs = []
    for p in sorted(base.rglob("*.py"), key=lambda p: p.relative_to(base).as_posix()):
        rel = p.relative_to(base)
        if skip.intersection(rel.parts[:-1]) or not p.is_file():
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a handful of stdlib files are latin-1 fixtures; skipping keeps the order deterministic
        if text:
            docs.append((rel.as_posix(), text))
    return docs


def _download(url: str, dest: Path, sha256: str) -> None:
    log.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - fixed https URL from the config
            data = r.read()
    except OSError as e:  # URLError, timeouts, resets: all OSError
        raise DataError(
            f"could not download {url} ({type(e).__name__}: {e}): offline, point data.path= (or "
            f"ABLATIONS_SHAKESPEARE_PATH) at a local copy of tinyshakespeare") from None
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise DataError(f"downloaded {url} has sha256 {got[:16]}..., expected {sha256[:16]}...: the file changed "
                        f"upstream; download it yourself and pass data.path=")
    _atomic_write_bytes(dest, data)


def shakespeare_docs(cfg) -> list[tuple[str, str]]:
    path = cfg.get("path") or os.environ.get("ABLATIONS_SHAKESPEARE_PATH")
    expected = cfg.get("sha256")
    if path:
        p = Path(str(path)).expanduser()
        if not p.is_file():
            src = "data.path" if cfg.get("path") else "ABLATIONS_SHAKESPEARE_PATH"
            raise DataError(f"{src}={p} does not exist: point it at tinyshakespeare's input.txt, or unset it to download")
    else:
        p = default_cache_dir(cfg.get("cache_dir")) / "tinyshakespeare.txt"
        if not p.is_file():
            _download(str(cfg.url), p, expected)
    data = p.read_bytes()
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise DataError(f"{p} is not tinyshakespeare (sha256 mismatch): use data=text data.path={p} for other corpora")
    return [("tinyshakespeare.txt", data.decode("utf-8"))]


def text_docs(cfg) -> list[tuple[str, str]]:
    path = cfg.get("path")
    if not path or str(path) == "???":
        raise ConfigError("data=text needs data.path=FILE_OR_DIR")
    p = Path(str(path)).expanduser()
    if p.is_file():
        return [(p.name, _read_text(p))]
    if p.is_dir():
        files = sorted((f for f in p.glob(cfg.get("glob") or "**/*") if f.is_file() and not f.name.startswith(".")),
                       key=lambda f: f.relative_to(p).as_posix())
        docs = [(f.relative_to(p).as_posix(), _read_text(f)) for f in files]
        docs = [d for d in docs if d[1]]
        if not docs:
            raise DataError(f"data.path={p} has no non-empty files matching data.glob={cfg.get('glob')!r}")
        return docs
    raise DataError(f"data.path={p} does not exist: pass an existing text file or directory")


def load_docs(cfg) -> list[tuple[str, str]]:
    name = cfg.get("name")
    if name == "pystdlib":
        return pystdlib_docs(cfg.get("path"))
    if name == "shakespeare":
        return shakespeare_docs(cfg)
    if name == "text":
        return text_docs(cfg)
    raise ConfigError(f"data.name={name!r} is unknown: use one of {', '.join(DATASETS)}")


def fingerprint(docs) -> str:
    h = hashlib.sha256()
    for name, text in docs:
        h.update(name.encode())
        h.update(b"\0")
        h.update(hashlib.sha256(text.encode("utf-8")).digest())
    return h.hexdigest()


def split_docs(docs, val_fraction: float) -> tuple[list[str], list[str]]:
    """Deterministic train/val split (independent of the tokenizer, so bpb compares across tokenizers)."""
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"data.val_fraction={val_fraction} must be in (0, 1), e.g. 0.1")
    if len(docs) >= MIN_DOCS_FOR_DOC_SPLIT:
        cut = int(val_fraction * 2**32)
        train, val = [], []
        for name, text in docs:
            h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
            (val if h < cut else train).append(text)
        if val and train:
            return train, val
    train, val = [], []
    for _, text in docs:  # cut each document at a line break near (1 - val_fraction) of its length
        i = int(len(text) * (1.0 - val_fraction))
        j = text.find("\n", i)
        i = j + 1 if 0 <= j < len(text) - 1 else i
        train.append(text[:i])
        val.append(text[i:])
    return [t for t in train if t], [t for t in val if t]


# ------------------------------------------------------------------------------------------ token cache
@dataclass
class TokenData:
    """A tokenized corpus on disk: ``tokens[:n_train]`` is train, the rest val."""

    path: Path
    dtype: str
    n_train: int
    n_val: int
    val_bytes: int
    fingerprint: str
    tokenizer: Tokenizer

    @property
    def val_tokens_per_byte(self) -> float:
        return self.n_val / max(1, self.val_bytes)

    def memmap(self) -> np.memmap:
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.n_train + self.n_val,))


def prepare_data(data_cfg, tokenizer_name: str) -> TokenData:
    """Load the corpus, build the tokenizer, and return the cached token file (tokenizing on a cache miss)."""
    docs = load_docs(data_cfg)
    if not docs:
        raise DataError(f"data={data_cfg.get('name')}: the corpus is empty")
    fp = fingerprint(docs)
    val_fraction = float(data_cfg.get("val_fraction", 0.1))
    cache = default_cache_dir(data_cfg.get("cache_dir")) / "tokens"
    key = hashlib.sha256(json.dumps([fp, tokenizer_name, val_fraction, SPLIT_VERSION]).encode()).hexdigest()[:20]
    meta_path = cache / f"{data_cfg.get('name')}-{tokenizer_name}-{key}.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            tok = tokenizer_from_identity(meta["tokenizer"])
            td = TokenData(cache / meta["file"], meta["dtype"], meta["n_train"], meta["n_val"], meta["val_bytes"], fp, tok)
            if td.path.is_file() and td.path.stat().st_size == (td.n_train + td.n_val) * np.dtype(td.dtype).itemsize:
                return td
        except (OSError, ValueError, KeyError, TypeError, AblationsError) as e:  # stale / foreign entry: rebuild
            log.warning("token cache %s unusable (%s); rebuilding", meta_path, e)
    train, val = split_docs(docs, val_fraction)
    if not val or not train:
        raise DataError(f"data={data_cfg.get('name')}: the corpus is too small to split with "
                        f"data.val_fraction={val_fraction}: use a longer corpus")
    if tokenizer_name == "char":
        tok = CharTokenizer.from_texts((t for t in train + val), with_separator=len(train) > 1 or len(val) > 1)
    else:
        tok = build_tokenizer(tokenizer_name)
    log.info("tokenizing %s (%d documents) with %s ...", data_cfg.get("name"), len(docs), tok.name)
    tr = tok.encode_docs(train)
    va = tok.encode_docs(val)
    dtype = "uint16" if tok.vocab_size <= 65536 else "uint32"
    val_bytes = sum(len(t.encode("utf-8")) for t in val) + (len(val) - 1) * (tok.sep_id is not None)
    fname = meta_path.with_suffix(".bin").name
    _atomic_write_bytes(cache / fname, np.concatenate([tr, va]).astype(dtype).tobytes())
    meta = {"file": fname, "dtype": dtype, "n_train": int(len(tr)), "n_val": int(len(va)), "val_bytes": int(val_bytes),
            "fingerprint": fp, "tokenizer": tok.identity(), "n_docs": len(docs), "val_fraction": val_fraction}
    _atomic_write_bytes(meta_path, json.dumps(meta).encode())
    return TokenData(cache / fname, dtype, int(len(tr)), int(len(va)), int(val_bytes), fp, tok)


def check_windows(td: TokenData, block_size: int) -> None:
    need = block_size + 1
    for split, n in (("train", td.n_train), ("val", td.n_val)):
        if n < need:
            raise DataError(
                f"the {split} split has {n} tokens, fewer than one window of model.block_size+1={need}: "
                f"use a longer corpus or a smaller model.block_size")


# ---------------------------------------------------------------------------------------------- loaders
def window_batch(tokens: np.ndarray, starts: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of block_size+1 tokens at ``starts``: inputs w[:, :-1], targets w[:, 1:] (shift by exactly one)."""
    idx = starts[:, None] + np.arange(block_size + 1)[None, :]
    w = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return w[:, :-1], w[:, 1:]


def train_starts(seed: int, batch_index: int, batch_size: int, n_train: int, block_size: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64([int(seed) & 0xFFFFFFFF, int(batch_index)]))
    return rng.integers(0, n_train - block_size, size=batch_size)  # last start: n_train - block_size - 1


def val_starts(n_val: int, block_size: int, n_windows: int) -> np.ndarray:
    hi = n_val - block_size - 1
    n = max(1, min(int(n_windows), hi // block_size + 1))
    return np.unique(np.linspace(0, hi, n).astype(np.int64))


class TrainBatches(torch.utils.data.IterableDataset):
    """Endless random training batches; batch ``j`` of rank ``r`` is global batch ``j * world + r``."""

    def __init__(self, dm: "TokenDataModule", start: int):
        self.dm, self.start = dm, start

    def __iter__(self):
        dm = self.dm
        tokens = dm.tokens()
        world, rank = 1, 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
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

    def __getstate__(self):  # ddp_spawn pickles the data module: reopen the memmap in the worker
        d = dict(self.__dict__)
        d["_tokens"] = None
        return d

    def tokens(self) -> np.memmap:
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
