"""Token shards on disk and reading them as one stream.

A prepared corpus is a folder: ``train-000000.bin, train-000001.bin, ..., val-000000.bin, ...`` and
``manifest.json``. Every shard but the last of its split holds exactly ``shard_tokens`` tokens. A shard file is::

    header (1024 bytes)  magic b"ABLSHARD" | u32 format version | u32 bytes per token (2: uint16, 4: uint32)
                         | u64 token count | 32-byte sha256 of the payload | u32 n | n bytes of JSON: the cursor
                         (where the split's next shard starts in the corpus, for resuming a killed prepare) | zeros
    payload              the token ids, little-endian

Shards are written to a temporary name and renamed, so a shard file is complete or absent. :class:`TokenStream`
memory-maps the shards lazily and reads them as one sequence (train shards, then val shards): indexing and slicing
gather across shard boundaries without ever concatenating the shards.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DataError
from .sources import atomic_write_bytes, temp_beside

MAGIC = b"ABLSHARD"
FORMAT_VERSION = 1
HEADER_BYTES = 1024
_HEAD = struct.Struct("<8sIIQ32sI")  # magic, version, itemsize, n_tokens, sha256, cursor length
SPLITS = ("train", "val")
MANIFEST = "manifest.json"
RERUN = "re-run `python -m ablations.prepare` with the same data= and tokenizer= (it rewrites bad shards)"


def shard_name(split: str, k: int) -> str:
    return f"{split}-{k:06d}.bin"


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class ShardWriter:
    """One shard written as its tokens arrive, so memory holds one chunk, not the shard: a temporary file in the
    shard's folder (header space, then the payload, hashed as it is written); ``close(cursor)`` writes the header,
    fsyncs and renames it into place (a killed writer leaves only a ``.<name>.<pid>.*.tmp`` file, never a shard)."""

    def __init__(self, path: Path, dtype: str):
        self.path, self.dtype = Path(path), np.dtype(dtype).newbyteorder("<")
        fd, self.tmp = temp_beside(self.path)
        self.f = os.fdopen(fd, "wb")
        self.f.write(bytes(HEADER_BYTES))
        self.sha, self.n = hashlib.sha256(), 0

    def write(self, tokens: np.ndarray) -> None:
        payload = np.ascontiguousarray(tokens, dtype=self.dtype).data
        self.sha.update(payload)
        self.f.write(payload)
        self.n += len(tokens)

    def close(self, cursor: dict) -> str:
        """Complete the shard -> the sha256 of its payload."""
        try:
            cur = json.dumps(cursor, sort_keys=True).encode()
            sha = self.sha.digest()
            head = _HEAD.pack(MAGIC, FORMAT_VERSION, self.dtype.itemsize, self.n, sha, len(cur)) + cur
            if len(head) > HEADER_BYTES:
                raise ValueError(f"shard cursor too long ({len(cur)} bytes)")
            self.f.seek(0)
            self.f.write(head.ljust(HEADER_BYTES, b"\0"))
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return sha.hex()

    def abort(self) -> None:
        self.f.close()
        Path(self.tmp).unlink(missing_ok=True)


def write_shard(path: Path, tokens: np.ndarray, dtype: str, cursor: dict) -> str:
    """Write one shard atomically (fsynced before the rename); -> the sha256 of its payload."""
    w = ShardWriter(path, dtype)
    try:
        w.write(tokens)
    except BaseException:
        w.abort()
        raise
    return w.close(cursor)


@dataclass
class ShardHeader:
    path: Path
    itemsize: int
    n_tokens: int
    sha256: str
    cursor: dict

    @property
    def dtype(self) -> str:
        return {2: "uint16", 4: "uint32"}[self.itemsize]


def read_header(path: Path) -> ShardHeader:
    """Read and check a shard's header and size (cheap: no hashing). A bad shard is one DataError line."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
        size = path.stat().st_size
    except OSError as e:
        raise DataError(f"shard {path} cannot be read ({e.strerror}): {RERUN}") from None
    if len(raw) < HEADER_BYTES or raw[:8] != MAGIC:
        raise DataError(f"shard {path} is not a token shard (bad or truncated header): {RERUN}")
    magic, version, itemsize, n, sha, ncur = _HEAD.unpack_from(raw)
    if version != FORMAT_VERSION or itemsize not in (2, 4):
        raise DataError(f"shard {path} has format version {version} (this harness reads {FORMAT_VERSION}): {RERUN}")
    if size != HEADER_BYTES + n * itemsize:
        raise DataError(f"shard {path} is truncated or padded ({size} bytes, its header says "
                        f"{HEADER_BYTES + n * itemsize}): {RERUN}")
    try:
        cursor = json.loads(raw[_HEAD.size:_HEAD.size + ncur])
    except ValueError:
        raise DataError(f"shard {path} has a corrupt header: {RERUN}") from None
    return ShardHeader(path, itemsize, n, sha.hex(), cursor)


def verify_shard(path: Path, expected_sha: str | None = None) -> ShardHeader:
    """read_header plus the payload's sha256 against the header (and the manifest's record, when given)."""
    head = read_header(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(HEADER_BYTES)
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    got = h.hexdigest()
    if got != head.sha256 or (expected_sha and got != expected_sha):
        raise DataError(f"shard {path} fails its checksum (payload sha256 {got[:12]}, recorded "
                        f"{(expected_sha or head.sha256)[:12]}): {RERUN}")
    return head


def read_shard(path: Path) -> np.ndarray:
    """A shard's tokens, memory-mapped (read-only)."""
    head = read_header(path)
    return np.memmap(path, dtype=np.dtype(head.dtype).newbyteorder("<"), mode="r", offset=HEADER_BYTES,
                     shape=(head.n_tokens,))


def write_manifest(folder: Path, manifest: dict) -> None:
    atomic_write_bytes(folder / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode(), fsync=True)


def read_manifest(folder: Path) -> dict | None:
    p = folder / MANIFEST
    if not p.is_file():
        return None
    try:
        m = json.loads(p.read_text())
    except (OSError, ValueError):
        raise DataError(f"{p} is corrupt: delete it and {RERUN}") from None
    if m.get("format") != FORMAT_VERSION:
        raise DataError(f"{p} has format {m.get('format')} (this harness reads {FORMAT_VERSION}): delete {folder} "
                        f"and {RERUN}")
    return m


# ------------------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class Segment:
    """``count`` tokens of ``path`` from byte ``offset``: a shard's payload, or a whole headerless token file."""

    path: Path
    offset: int
    count: int


class TokenStream:
    """Segments read as one token sequence, memory-mapped on first use. ``stream[i]``, ``stream[a:b]`` and
    ``stream[idx]`` (an integer array of any shape) return numpy arrays; nothing is concatenated beyond the request."""

    def __init__(self, segments, dtype: str):
        self.segments, self.dtype = tuple(segments), np.dtype(dtype).newbyteorder("<")
        self.bounds = np.cumsum([0] + [s.count for s in self.segments])  # (n_segments + 1,)
        self._maps: dict[int, np.memmap] = {}

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def __getstate__(self):  # worker processes reopen the maps
        return {**self.__dict__, "_maps": {}}

    def _map(self, k: int) -> np.memmap:
        m = self._maps.get(k)
        if m is None:
            s = self.segments[k]
            m = self._maps[k] = np.memmap(s.path, dtype=self.dtype, mode="r", offset=s.offset, shape=(s.count,))
        return m

    def __getitem__(self, key):
        if isinstance(key, slice):
            a, b, step = key.indices(len(self))
            if step != 1:
                raise IndexError("TokenStream slices take step 1")
            return self._range(a, max(a, b))
        idx = np.asarray(key, dtype=np.int64)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"token index out of range [0, {len(self)})")
        seg = np.searchsorted(self.bounds, flat, side="right") - 1  # segment of each index
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(seg):
            m = seg == k
            out[m] = self._map(int(k))[flat[m] - self.bounds[k]]
        return out.reshape(idx.shape) if idx.ndim else out[0]

    def _range(self, a: int, b: int) -> np.ndarray:
        first = int(np.searchsorted(self.bounds, a, side="right")) - 1
        parts = []
        k = first
        while a < b:
            lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
            take = min(b, hi)
            parts.append(np.asarray(self._map(k)[a - lo:take - lo]))
            a, k = take, k + 1
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, self.dtype)
