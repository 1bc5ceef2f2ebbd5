"""Corpora as Hugging Face `datasets`: every corpus, built-in or yours, is read as a dataset of documents.

- ``pystdlib``, ``shakespeare``, ``text``: text files, one document per file, named by their relative path. Read
  as ``datasets.IterableDataset.from_generator`` over the file list (streamed: nothing is copied).
- ``hf``: local parquet / jsonl / json / arrow / txt files (a file, a folder searched recursively, or a glob) read by
  ``datasets.load_dataset(<format>, data_files=...)``, or a Hub dataset (``data.hub``, ``data.hub_config``) when the
  machine is online; ``data.text_column`` names the text, ``data.streaming`` reads without converting to Arrow
  (streamed local parquet by pyarrow alone: ``ParquetStream``, the same rows in the same order, without datasets'
  seconds of start-up).

A :class:`Source` carries what the token cache needs before any tokenizing: the corpus fingerprint (content hashes
of the files, remembered by (path, size, mtime) so a large corpus is not re-read at every start), the document count
when known, and a ``build()`` that makes the dataset (importing ``datasets`` takes seconds: a cache hit skips it).
"""
from __future__ import annotations

import glob as globlib
import hashlib
import json
import logging
import os
import socket
import sysconfig
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from .errors import ConfigError, DataError

log = logging.getLogger(__name__)

CORPORA = ("pystdlib", "shakespeare", "text", "hf")
# file suffix -> datasets' packaged builder; compressed variants (.jsonl.gz ...) are read by datasets transparently
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow", ".txt": "text"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4")


def default_cache_dir(cfg_value=None) -> Path:
    if cfg_value:
        return Path(str(cfg_value)).expanduser()
    if os.environ.get("ABLATIONS_CACHE_DIR"):
        return Path(os.environ["ABLATIONS_CACHE_DIR"]).expanduser()
    return Path.home() / ".cache" / "ablations"


def temp_beside(path: Path) -> tuple[int, str]:
    """(fd, name) of a new temporary file in `path`'s folder, to be renamed over `path`: `.<name>.<pid>.<random>.tmp`,
    so a starting writer can tell a dead writer's leftovers from a live one's (``remove_dead_writers_temps``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")


def remove_dead_writers_temps(folder: Path) -> int:
    """Delete the temporary files of writers that died (kill -9) in `folder` -> how many. A file of a live process
    (another prepare writing its shards, or this one) is left alone: removing it would fail that writer's rename."""
    removed = 0
    for tmp in folder.glob(".*.tmp"):
        pid = tmp.name.split(".")[-3]  # .<name>.<pid>.<random>.tmp; mkstemp's random part has no dots
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = False) -> None:
    """Write `path` completely or not at all: a temporary file in the same folder, renamed over it."""
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class Source:
    """A corpus before tokenizing: ``build()`` -> a ``datasets`` (Iterable)Dataset with a ``text_column``."""

    label: str                       # how messages name it: "pystdlib", "data.path=/corpus/*.parquet"
    fingerprint: str                 # sha256 of the corpus content (and of the options that change its documents)
    text_column: str
    key_column: str | None           # names each document for the train/val split; None: its index in the corpus
    build: Callable[[], object]
    n_docs: int | None = None        # known before reading for file corpora; len(dataset) otherwise, if sized
    keys: list[str] | None = None    # the document names, when known before reading (file corpora)
    empty: int = 0                   # empty files skipped while listing (counted in the manifest)
    total_bytes: int | None = None   # on-disk size of the inputs, for progress and the adaptive process count
    info: dict = field(default_factory=dict)


def _datasets():
    """The `datasets` module, quiet: its progress bars and info logs would interleave with ours."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


# ------------------------------------------------------------------------------------------ file digests
class _Digests:
    """sha256 of files, remembered by (path, size, mtime_ns) in <cache>/file-digests.json (like make or git)."""

    def __init__(self, cache: Path):
        self.path = cache / "file-digests.json"
        try:
            self.known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.dirty = False

    def get(self, p: Path, decoded: bool) -> str | None:
        """Digest of the raw bytes, or of the UTF-8 of the text as Python reads it (None: not UTF-8)."""
        st = p.stat()
        key = f"{'text' if decoded else 'raw'}:{p.resolve()}"
        hit = self.known.get(key)
        if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        if decoded:
            try:
                digest = hashlib.sha256(p.read_text(encoding="utf-8").encode("utf-8")).hexdigest()
            except UnicodeDecodeError:
                digest = None
        else:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    h.update(block)
            digest = h.hexdigest()
        self.known[key] = [st.st_size, st.st_mtime_ns, digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if self.dirty:
            try:
                atomic_write_bytes(self.path, json.dumps(self.known).encode())
            except OSError as e:  # a read-only cache only costs the re-hashing next time
                log.warning("could not save %s (%s)", self.path, e)


def fingerprint(items, options: dict | None = None) -> str:
    """sha256 over (name, content digest) pairs, plus the options that change what the documents are."""
    h = hashlib.sha256()
    for name, digest in items:
        h.update(name.encode())
        h.update(b"\0")
        h.update(bytes.fromhex(digest))
    if options:
        h.update(json.dumps(options, sort_keys=True).encode())
    return h.hexdigest()


# ------------------------------------------------------------------------------------ file-per-document
def _read_docs(paths: list[str], names: list[str]):
    """The generator behind the file corpora: one row per file (read with universal newlines, as Path.read_text)."""
    for p, n in zip(paths, names):
        yield {"name": n, "text": Path(p).read_text(encoding="utf-8")}


def _file_source(label: str, base: Path, rels: list[str], cfg, skip_undecodable: bool,
                 single_name: str | None = None) -> Source:
    """Files under `base` (relative paths `rels`, in this order; [""]: `base` is the one file, named `single_name`
    or its file name) as documents; empty files are skipped and counted."""
    digests = _Digests(default_cache_dir(cfg.get("cache_dir")))
    names, paths, items, empty, size = [], [], [], 0, 0
    for rel in rels:
        p = base / rel if rel else base
        try:
            st = p.stat()
            digest = None if st.st_size == 0 else digests.get(p, decoded=True)
        except OSError as e:
            raise DataError(f"cannot read corpus file {p}: {e.strerror}") from None
        if st.st_size == 0:
            empty += 1
            continue
        if digest is None:
            if skip_undecodable:
                continue  # a handful of stdlib files are latin-1 fixtures; skipping keeps the order deterministic
            raise DataError(f"corpus file {p} is not UTF-8 text: convert it or exclude it with data.glob")
        name = rel or single_name or p.name
        names.append(name)
        paths.append(str(p))
        items.append((name, digest))
        size += st.st_size
    digests.save()

    def build():
        datasets = _datasets()
        return datasets.IterableDataset.from_generator(_read_docs, gen_kwargs={"paths": paths, "names": names})

    return Source(label, fingerprint(items), "text", "name", build, n_docs=len(names), keys=names, empty=empty,
                  total_bytes=size)


def pystdlib_source(cfg) -> Source:
    """The interpreter's standard-library ``*.py`` files (no test suites, no site-packages), sorted by path."""
    base = Path(str(cfg.get("path") or sysconfig.get_paths()["stdlib"]))
    if not base.is_dir():
        raise DataError(f"data.path={base} (the standard library) is not a directory: set data.path to one")
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    rels = sorted(p.relative_to(base).as_posix() for p in base.rglob("*.py") if p.is_file())
    rels = [r for r in rels if not skip.intersection(r.split("/")[:-1])]
    return _file_source("pystdlib", base, rels, cfg, skip_undecodable=True)


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
    atomic_write_bytes(dest, data)


def shakespeare_source(cfg) -> Source:
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
    if expected and _Digests(default_cache_dir(cfg.get("cache_dir"))).get(p, decoded=False) != expected:
        raise DataError(f"{p} is not tinyshakespeare (sha256 mismatch): use data=text data.path={p} for other corpora")
    return _file_source("shakespeare", p, [""], cfg, skip_undecodable=False, single_name="tinyshakespeare.txt")


def text_source(cfg) -> Source:
    path = cfg.get("path")
    if not path or str(path) == "???":
        raise ConfigError("data=text needs data.path=FILE_OR_DIR")
    p = Path(str(path)).expanduser()
    if p.is_file():
        return _file_source("text", p, [""], cfg, skip_undecodable=False)
    if p.is_dir():
        pattern = cfg.get("glob") or "**/*"
        rels = sorted(f.relative_to(p).as_posix() for f in p.glob(pattern) if f.is_file() and not f.name.startswith("."))
        src = _file_source("text", p, rels, cfg, skip_undecodable=False)
        if not src.n_docs:
            raise DataError(f"data.path={p} has no non-empty files matching data.glob={pattern!r}")
        return src
    raise DataError(f"data.path={p} does not exist: pass an existing text file or directory")


# ---------------------------------------------------------------------------------------- data=hf (local)
def _format_of(p: Path) -> str | None:
    suffixes = [s.lower() for s in p.suffixes]
    while suffixes and suffixes[-1] in COMPRESSED:
        suffixes.pop()
    return FORMATS.get(suffixes[-1]) if suffixes else None


def resolve_files(path: str) -> tuple[list[Path], str]:
    """data.path (a file, a folder searched recursively, or a glob) -> (sorted files, their datasets builder)."""
    p = Path(path).expanduser()
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted((f for f in p.rglob("*") if f.is_file() and _format_of(f) and not f.name.startswith(".")),
                       key=lambda f: f.relative_to(p).as_posix())
        if not files:
            raise DataError(f"data.path={p} holds no {', '.join(sorted(set(FORMATS)))} files: point it at the "
                            f"corpus files, or a glob such as {p}/**/*.parquet")
    else:
        files = sorted(Path(f) for f in globlib.glob(str(p), recursive=True) if Path(f).is_file())
        if not files:
            raise DataError(f"data.path={path} matches no files: check the path (a glob such as /corpus/*.parquet "
                            f"or /corpus/**/*.jsonl, a folder, or a file)")
    kinds = {f: _format_of(f) for f in files}
    unknown = [f for f, k in kinds.items() if k is None]
    if unknown:
        raise DataError(f"data.path={path}: {unknown[0]} is not one of {', '.join(sorted(FORMATS))}: "
                        f"narrow data.path to the corpus files (e.g. a *.parquet glob)")
    found = sorted(set(kinds.values()))
    if len(found) > 1:
        raise DataError(f"data.path={path} mixes {' and '.join(found)} files: pass a glob for one format")
    return files, found[0]


def _parquet_scan_options() -> dict:
    """Read parquet without pre-buffering when datasets converts it to Arrow, so memory does not grow with the size
    of a file (a FineWeb-edu file holds ~2 GB). datasets (5.2 here) scans each file as one pyarrow.dataset fragment:
    its default pre_buffer=True reads the whole file's column chunks ahead (apache/arrow#39808), and its threaded
    scanner keeps decoding ahead of a consumer slower than it. Measured on one 198 MB parquet file of 315 MB of text,
    streamed: prepare's peak 868 MB, 689 MB with pre_buffer=False, and read a row group at a time (now
    ``ParquetStream``) the 430 MB of the same text in 16 MB files. A datasets without these options gets none."""
    import pyarrow.dataset as pds
    from datasets.packaged_modules.parquet.parquet import ParquetConfig

    if "fragment_scan_options" not in {f.name for f in fields(ParquetConfig)}:
        return {}
    return {"fragment_scan_options": pds.ParquetFragmentScanOptions(pre_buffer=False)}


class ParquetStream:
    """Local parquet files streamed with pyarrow alone, in file and row-group order, one row group in memory: the
    part of a ``datasets`` IterableDataset that prepare reads (``column_names``, ``skip``, ``iter``). datasets'
    streamed parquet reads the same rows in the same order (resharded per row group), but importing and setting it
    up took ~2 s of a prepare's start (it imports torch when torch is installed): more than a third of preparing
    50 MB of text."""

    def __init__(self, files: list[Path], label: str, columns: list[str], start: int = 0):
        import pyarrow.parquet as pq

        self.files, self.label, self.columns, self.start = files, label, columns, start
        self.column_names = pq.read_schema(files[0]).names

    def skip(self, n: int) -> "ParquetStream":
        return ParquetStream(self.files, self.label, self.columns, self.start + n)

    def iter(self, batch_size: int):
        """{column: [values]} batches of up to `batch_size` rows from row `start` on, of `columns` only (a
        FineWeb-edu file has ten more: decoding them was wasted)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        skip = self.start
        for f in self.files:
            try:
                pf = pq.ParquetFile(f, pre_buffer=False)
                for g in range(pf.num_row_groups):
                    rows = pf.metadata.row_group(g).num_rows
                    if skip >= rows:
                        skip -= rows
                        continue
                    table, skip = pf.read_row_group(g, columns=self.columns).slice(skip), 0
                    for b in table.to_batches(max_chunksize=batch_size):
                        yield b.to_pydict()
            except (pa.ArrowException, OSError) as e:
                raise DataError(f"{self.label}: pyarrow could not read {f} ({type(e).__name__}: "
                                f"{str(e).splitlines()[0][:200] if str(e) else ''}): check that it is a valid "
                                f"parquet file with the columns of the first") from None


def hf_local_source(cfg) -> Source:
    files, builder = resolve_files(str(cfg.path))
    root = Path(os.path.commonpath([str(f.parent) for f in files]))
    cache = default_cache_dir(cfg.get("cache_dir"))
    digests = _Digests(cache)
    items = [(f.relative_to(root).as_posix(), digests.get(f, decoded=False)) for f in files]
    digests.save()
    text_column, key_column = str(cfg.get("text_column") or "text"), cfg.get("id_column")
    streaming = bool(cfg.get("streaming"))
    options = {"builder": builder, "text_column": text_column, "id_column": key_column}
    kwargs = {"sample_by": str(cfg.get("sample_by") or "document")} if builder == "text" else {}
    options.update(kwargs)

    def build():
        try:
            if streaming and builder == "parquet" and all(f.suffix.lower() == ".parquet" for f in files):
                return ParquetStream(files, f"data.path={cfg.path}", [c for c in (text_column, key_column) if c])
            datasets = _datasets()
            # local files converted to Arrow are a derived cache like the shards: kept beside them
            return datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                         streaming=streaming, cache_dir=str(cache / "hf-datasets"), **kwargs,
                                         **(_parquet_scan_options() if builder == "parquet" else {}))
        except (ValueError, OSError, TypeError) as e:
            raise DataError(f"data.path={cfg.path}: datasets could not read the {builder} files "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}): check that "
                            f"they are valid {builder} files") from None

    return Source(f"data.path={cfg.path}", fingerprint(items, options), text_column, key_column, build,
                  total_bytes=sum(f.stat().st_size for f in files),
                  info={"files": len(files), "format": builder, "streaming": streaming})


# ------------------------------------------------------------------------------------------ data=hf (Hub)
def hub_reachable(timeout: float = 3.0) -> str | None:
    """None when the Hub can be reached, else why not (offline flags first: no network call at all then)."""
    for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(flag, "").strip().lower() in {"1", "true", "yes", "on"}:
            return f"{flag}={os.environ[flag]}"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urllib.parse.urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
    except OSError as e:
        return f"{url.hostname} unreachable: {type(e).__name__}"
    return None


def hub_source(cfg) -> Source:
    name, config = str(cfg.hub), cfg.get("hub_config")
    split, revision = str(cfg.get("hub_split") or "train"), cfg.get("hub_revision")
    why = hub_reachable()
    if why:
        raise DataError(f"data.hub={name} needs the Hugging Face Hub, which this machine cannot reach ({why}): "
                        f"download the corpus files elsewhere and pass data.path=/dir/*.parquet (or *.jsonl) instead")
    text_column, key_column = str(cfg.get("text_column") or "text"), cfg.get("id_column")
    streaming = bool(cfg.get("streaming"))
    options = {"hub": name, "config": config, "split": split, "revision": revision, "text_column": text_column,
               "id_column": key_column}

    def build():
        datasets = _datasets()
        try:
            return datasets.load_dataset(name, config, split=split, revision=revision, streaming=streaming)
        except (ConnectionError, OSError, ValueError) as e:
            raise DataError(f"data.hub={name} (config {config}, split {split}) could not be loaded "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}): check the "
                            f"name and data.hub_config, or pass local files with data.path=") from None

    # a Hub corpus is named, not hashed: pin data.hub_revision to a commit for a fingerprint that cannot drift
    fp = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()
    return Source(f"data.hub={name}", fp, text_column, key_column, build, info={"streaming": streaming})


def open_source(cfg) -> Source:
    name = cfg.get("name")
    if name == "pystdlib":
        return pystdlib_source(cfg)
    if name == "shakespeare":
        return shakespeare_source(cfg)
    if name == "text":
        return text_source(cfg)
    if name == "hf":
        if cfg.get("hub") and cfg.get("path"):
            raise ConfigError(f"data.path={cfg.path} and data.hub={cfg.hub} are both set: keep one")
        if cfg.get("hub"):
            return hub_source(cfg)
        if not cfg.get("path"):
            raise ConfigError("data=hf needs data.path=FILES_DIR_OR_GLOB (parquet, jsonl, json, arrow, txt) or "
                              "data.hub=NAME")
        return hf_local_source(cfg)
    raise ConfigError(f"data.name={name!r} is unknown: use one of {', '.join(CORPORA)}")
