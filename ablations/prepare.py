"""`python -m ablations.prepare data=... tokenizer=...`: tokenize a corpus into token shards with N workers.

The corpus (an ``ablations.sources.Source``) is read in order in this process and handed out in batches of
documents to ``data.num_proc`` workers, which tokenize them: threads where the tokenizer encodes without the GIL
(gpt2: tiktoken), so no text or token is copied between processes and no worker rebuilds the tokenizer, else
processes; the results come back in corpus order, so the shards do not depend on how the workers were scheduled.
Each split (train, val) is one token stream, documents joined by the tokenizer's separator, cut into shards of
exactly ``data.shard_tokens`` tokens (the last one shorter), each written atomically (``ablations.shards``), then
``manifest.json``.

Resume: every shard's header records where its split's next shard starts (document index, offset into that
document's tokens, and the counts so far). A re-run verifies the shards on disk and keeps the complete ones; each
document's split is decided before it is tokenized (``ablations.splits``), so the re-run reads the corpus from the
earliest unfinished point but tokenizes only what a split has not written yet: a kill loses at most the shard each
split was writing. What it writes is byte-identical to an uninterrupted run.

One writer per shards folder: a prepare holds an exclusive lock on ``<folder>/.prepare.lock`` (``fcntl.flock``, let
go when the process ends, even by kill -9). A second prepare of the same folder (the parallel trials of a sweep on
a new corpus all prepare on first use) waits for it, then finds the manifest. A starting writer removes the
temporary files of dead writers only (their names carry the writer's pid).

The manifest records everything that changes the shards' bytes (corpus fingerprint, tokenizer and dtype, shard
size, split rule and val fraction, text and id columns); opening a folder made under other settings is one line.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .errors import AblationsError, ConfigError, DataError, TokenizerError, exit_code
from .shards import (FORMAT_VERSION, MANIFEST, SPLITS, ShardWriter, dtype_for, read_manifest, shard_name,
                     verify_shard, write_manifest)
from .sources import Source, atomic_write_bytes, default_cache_dir, open_source, remove_dead_writers_temps
from .splits import RULES_VERSION, check_val_fraction, choose_rule, split_parts
from .tokenizers import CharTokenizer, Tokenizer, build_tokenizer, tokenizer_from_identity

SMALL_CORPUS_BYTES = 4 << 20       # below this, one process: starting workers costs more than they save
BATCH_BYTES, BATCH_DOCS = 1 << 20, 1024  # one task for a worker
# batches queued per worker: a deeper queue keeps the workers busy while this thread, descheduled on a loaded machine,
# is late to read and write (at most ~4 MB of text per worker). Side by side with 2 (50 MB, gpt2, 2 threads, load
# 5.5, 4 rounds) 2 took 1.15x as long, 95% interval [0.87, 1.53]: inconclusive.
IN_FLIGHT = 4
PLAN, LOCK = "plan.json", ".prepare.lock"
PASS_STARTED: dict[str, float] = {}  # "at": this process's age when its tokenizing pass began (main's last line)


def process_seconds() -> float:
    """Seconds since this process started, the interpreter's own start and the imports included."""
    try:  # Linux: the start time in clock ticks since boot (field 22 of /proc/self/stat), no import needed
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        import psutil

        return time.time() - psutil.Process().create_time()


# ------------------------------------------------------------------------------------------ the workers
_W: dict = {}  # per-process state: the tokenizer (None while scanning for the char vocabulary) and the dtype


def _init_worker(tok, dtype, parent: int | None = None) -> None:
    """tok: the tokenizer (this process's, or inherited by a forked worker), its identity (a spawned worker rebuilds
    it, a tenth of a second or more for gpt2) or None."""
    _W.update(tok=tokenizer_from_identity(tok) if isinstance(tok, dict) else tok, dtype=dtype)
    if parent:  # a worker whose parent was killed (kill -9) exits instead of waiting on its queue forever
        threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _encode(batch):
    """[(index, [(split, text)] or None)] -> [(index, [(split, tokens, utf-8 bytes)] or None for an empty document)]."""
    tok, dtype = _W["tok"], _W["dtype"]
    return [(index, None if parts is None else [(s, tok.encode_np(t).astype(dtype), len(t.encode("utf-8")))
                                                 for s, t in parts]) for index, parts in batch]


def _scan(batch):
    """The char tokenizer's vocabulary pass: -> (code points seen, non-empty parts per split)."""
    seen, count = set(), {"train": 0, "val": 0}
    for _, parts in batch:
        for s, t in parts or ():
            seen.update(np.unique(np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32)).tolist())
            count[s] += 1
    return seen, count


class _Workers:
    """`map(fn, items)` in corpus order over `num_proc` threads (a tokenizer that releases the GIL), a process pool
    (any other) or this thread (one), never more than IN_FLIGHT x num_proc batches in flight, so memory does not grow
    with the corpus. tok: the tokenizer, or None for the char vocabulary scan (processes)."""

    def __init__(self, num_proc: int, tok: Tokenizer | None, dtype: str):
        self.num_proc, self.pool, self.threads = num_proc, None, None
        if num_proc > 1 and tok is not None and tok.releases_gil:
            _init_worker(tok, dtype)
            self.threads = ThreadPoolExecutor(num_proc, thread_name_prefix="prepare")
        elif num_proc > 1:
            # fork where there is one (as torch's DataLoader and datasets' map do): spawn would re-import the
            # caller's __main__ in every worker. The workers use only numpy and the tokenizer, no threads.
            methods = multiprocessing.get_all_start_methods()
            fork = "fork" in methods
            ctx = multiprocessing.get_context("fork" if fork else "spawn")
            shipped = tok if fork or tok is None else tok.identity()  # a fork inherits it: nothing is pickled
            self.pool = ctx.Pool(num_proc, initializer=_init_worker, initargs=(shipped, dtype, os.getpid()))
        else:
            _init_worker(tok, dtype)

    def map(self, fn, items):
        if self.pool is None and self.threads is None:
            yield from map(fn, items)
            return
        pending = deque()
        for item in items:
            pending.append(self.threads.submit(fn, item) if self.threads else self.pool.apply_async(fn, (item,)))
            if len(pending) >= IN_FLIGHT * self.num_proc:
                yield self._result(pending.popleft())
        while pending:
            yield self._result(pending.popleft())

    def _result(self, pending):
        return pending.result() if self.threads else pending.get()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.threads is not None:
            self.threads.shutdown(cancel_futures=True)
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def check_columns(ds, src: Source) -> None:
    cols = ds.column_names
    if cols is None:  # some streamed builders know their columns only after the first row
        first = next(iter(ds), None)
        cols = list(first) if first else []
    for what, col in (("text_column", src.text_column), ("id_column", src.key_column)):
        if col and col not in cols:
            raise DataError(f"data.{what}={col} is not a column of {src.label}: its columns are "
                            f"{', '.join(cols) or '(none)'}; pass data.{what}=<one of them>")


def doc_batches(ds, src: Source, start: int = 0):
    """[(index, key, text)] batches of about 1 MB of text, in corpus order, from document `start` on."""
    if start:
        ds = ds.skip(start)
    index, batch, size = start, [], 0
    for rows in ds.iter(batch_size=256):
        keys = rows[src.key_column] if src.key_column else None
        for i, text in enumerate(rows[src.text_column]):
            if text is not None and not isinstance(text, str):
                raise DataError(f"data.text_column={src.text_column} of {src.label} holds {type(text).__name__} "
                                f"values, not text: pass the column that holds the documents' text")
            batch.append((index, str(keys[i]) if keys else str(index), text or ""))
            index, size = index + 1, size + len(text or "")
            if size >= BATCH_BYTES or len(batch) >= BATCH_DOCS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def split_batches(batches, rule: str, vf: float, todo: dict[str, int]):
    """Each document cut into its splits' parts before tokenizing: [(index, key, text)] batches -> [(index,
    [(split, text)] or None for an empty document)] batches, without the parts whose split has them in shards on disk
    already (`todo`: split -> its first document not written), so a resumed prepare does not tokenize them again."""
    for batch in batches:
        yield [(index, [(s, t) for s, t in split_parts(key, text, rule, vf) if index >= todo[s]] if text else None)
               for index, key, text in batch]


# -------------------------------------------------------------------------------------- writing shards
class SplitWriter:
    """One split's token stream, cut into shards of `size` tokens, each written as its tokens arrive (memory: one
    document's tokens, whatever the shard size); resumes from the cursor of its last shard on disk.

    A shard's cursor says where the next shard starts: (document index, offset into that document's tokens, the
    separator included) and the split's (documents, UTF-8 bytes, empty documents) counted up to there."""

    def __init__(self, folder: Path, split: str, size: int, dtype: str, sep: int | None, resume: dict | None,
                 records: list[dict]):
        c = resume or {"shards": 0, "tokens": 0, "docs": 0, "bytes": 0, "next_doc": 0, "next_offset": 0, "empty": 0}
        self.folder, self.split, self.size, self.dtype, self.sep = folder, split, int(size), dtype, sep
        self.records = records
        self.k, self.tokens, self.docs, self.bytes = c["shards"], c["tokens"], c["docs"], c["bytes"]
        self.next_doc, self.next_off, self.resume_empty = c["next_doc"], c["next_offset"], c["empty"]
        self.out: ShardWriter | None = None  # the shard being written
        self.last = (self.next_doc - 1, self.resume_empty)  # (last document added, empty documents before it)

    def add(self, index: int, toks: np.ndarray, nbytes: int, empty_before: int) -> None:
        """Append document `index` (from `next_doc` on: what `split_batches` leaves for this split)."""
        resumed = index == self.next_doc and self.next_off > 0  # this document began in the previous shard
        sep = self.sep is not None and self.docs - resumed > 0
        part = np.concatenate((np.array([self.sep], dtype=self.dtype), toks)) if sep else toks
        if resumed:
            part, off, self.next_off = part[self.next_off:], self.next_off, 0
        else:
            off = 0
            self.docs, self.bytes = self.docs + 1, self.bytes + nbytes + sep
        self.last = (index, empty_before)
        while len(part):
            if self.out is None:
                self.out = ShardWriter(self.folder / shard_name(self.split, self.k), self.dtype)
            take = min(len(part), self.size - self.out.n)
            self.out.write(part[:take])
            part, off = part[take:], off + take
            if self.out.n == self.size:  # the shard is full; the rest of this document (if any) starts the next
                self._close((index, off) if len(part) else (index + 1, 0), empty_before)

    def _close(self, nxt: tuple[int, int], empty: int) -> None:
        count = self.out.n
        self.tokens += count
        cursor = {"shards": self.k + 1, "tokens": self.tokens, "docs": self.docs, "bytes": self.bytes,
                  "next_doc": nxt[0], "next_offset": nxt[1], "empty": empty}
        name = shard_name(self.split, self.k)
        sha, self.out = self.out.close(cursor), None
        self.records.append({"file": name, "tokens": count, "sha256": sha})
        self.k += 1

    def finish(self) -> None:
        if self.out is not None and self.out.n:
            self._close((self.last[0] + 1, 0), self.last[1])

    def abort(self) -> None:
        """Drop the shard being written (its temporary file); finished shards stay for a re-run."""
        if self.out is not None:
            self.out.abort()
            self.out = None


def existing_shards(folder: Path, split: str) -> tuple[list[dict], dict | None]:
    """The complete, verified shards 0..k-1 of `split` on disk (a bad one and those after it are deleted), and the
    cursor to resume from."""
    records, cursor, k = [], None, 0
    while (folder / shard_name(split, k)).is_file():
        path = folder / shard_name(split, k)
        try:
            head = verify_shard(path)
        except DataError:
            for later in folder.glob(f"{split}-*.bin"):
                if int(later.stem.split("-")[1]) >= k:
                    later.unlink()
            break
        records.append({"file": path.name, "tokens": head.n_tokens, "sha256": head.sha256})
        cursor = head.cursor
        k += 1
    return records, cursor


# ----------------------------------------------------------------------------------------------- progress
def say(text: str) -> None:
    print(f"[ablations] {text}", flush=True)


class Progress:
    """A tqdm bar on a terminal; otherwise a line about every 5% (or 30 s when the total is unknown)."""

    def __init__(self, total_docs: int | None, done_docs: int):
        self.total, self.done, self.t0, self.mb = total_docs, done_docs, time.perf_counter(), 0.0
        self.bar, self.next_line = None, time.perf_counter() + 30
        if sys.stdout.isatty():  # ablations.progress.wants_lines' rule, without importing Lightning for it
            from tqdm import tqdm

            self.bar = tqdm(total=total_docs, initial=done_docs, unit="doc", dynamic_ncols=True, file=sys.stdout)

    def update(self, docs: int, text_bytes: int) -> None:
        self.done, self.mb = self.done + docs, self.mb + text_bytes / 1e6
        rate = self.mb / max(1e-9, time.perf_counter() - self.t0)
        if self.bar is not None:
            self.bar.update(docs)
            self.bar.set_postfix_str(f"{rate:.2f} MB/s")
            return
        step = max(1, (self.total or 0) // 20)
        due = self.total and self.done // step != (self.done - docs) // step
        if due or (not self.total and time.perf_counter() >= self.next_line):
            self.next_line = time.perf_counter() + 30
            of = f"/{self.total:,}" if self.total else ""
            say(f"prepare: {self.done:,}{of} documents | {self.mb:,.1f} MB | {rate:.2f} MB/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ------------------------------------------------------------------------------------------------ prepare
def check_shard_tokens(data_cfg) -> int:
    size = data_cfg.get("shard_tokens") or 10**8
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"data.shard_tokens={size} must be a positive integer, e.g. 100000000")
    return size


def shards_folder(data_cfg, src: Source, tokenizer_name: str) -> Path:
    if data_cfg.get("shards_dir"):
        return Path(str(data_cfg.shards_dir)).expanduser()
    key = json.dumps([src.fingerprint, tokenizer_name, float(data_cfg.get("val_fraction", 0.1)),
                      check_shard_tokens(data_cfg), FORMAT_VERSION])
    name = f"{data_cfg.get('name')}-{tokenizer_name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"
    return default_cache_dir(data_cfg.get("cache_dir")) / "tokens" / name


@contextlib.contextmanager
def folder_lock(folder: Path):
    """The shards folder to this process alone for the with-block; another prepare of it waits (one line says so)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        f = open(folder / LOCK, "a")
    except OSError as e:  # a read-only folder (shared, prepared elsewhere): nobody writes it, so nothing to wait for
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        yield
        return
    with f:  # the lock goes with the file's last descriptor: with the process, however it ends
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"prepare: waiting for another prepare writing {folder}")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


# Where the manifest records each setting that changes the shards' bytes, besides the corpus and the tokenizer.
SETTINGS = {"data.shard_tokens": ("shard_tokens",), "data.val_fraction": ("corpus", "val_fraction"),
            "data.text_column": ("corpus", "text_column"), "data.id_column": ("corpus", "id_column"),
            "split rules version": ("corpus", "split_rules")}


def check_manifest(m: dict, folder: Path, src: Source, settings: dict, tokenizer_name: str,
                   tok: Tokenizer | None) -> Tokenizer:
    """The manifest is this corpus's, made with these `settings` (SETTINGS' names -> values) and this tokenizer ->
    the tokenizer it was prepared with. A setting the manifest does not record (made before it was) is not checked."""
    if m["corpus"]["fingerprint"] != src.fingerprint:
        raise DataError(f"data.shards_dir={folder} holds another corpus (fingerprint {m['corpus']['fingerprint'][:12]}"
                        f", {src.label} is {src.fingerprint[:12]}): point data.shards_dir at another folder")
    fix = f"point data.shards_dir at a new folder, or delete {folder} and re-run prepare"
    for name, path in SETTINGS.items():
        node = m
        for key in path[:-1]:
            node = node[key]
        if path[-1] in node and node[path[-1]] != settings[name]:
            raise DataError(f"{folder} was prepared with {name}={node[path[-1]]}, not {name}={settings[name]}: {fix}")
    ident = m["tokenizer"]
    if ident.get("name") != tokenizer_name:
        raise TokenizerError(f"{folder} was prepared with tokenizer={ident.get('name')}, not tokenizer="
                             f"{tokenizer_name}: pass tokenizer={ident.get('name')} or another data.shards_dir")
    if tok is None:  # char: the vocabulary is the corpus's, recorded in the manifest
        tok = tokenizer_from_identity(ident)
    elif tok.identity() != ident:
        raise TokenizerError(f"{folder} was prepared with a {tokenizer_name} tokenizer of hash "
                             f"{m.get('tokenizer_hash', '?')[:12]}, this one has hash {tok.hash[:12]}: use the "
                             f"tokenizer files it was prepared with, or delete {folder} and re-run prepare")
    if m["dtype"] != dtype_for(tok.vocab_size):
        raise DataError(f"{folder} holds {m['dtype']} tokens, but the {tok.vocab_size:,} ids of tokenizer={tok.name} "
                        f"need {dtype_for(tok.vocab_size)}: {fix}")
    return tok


def verify_all(folder: Path, m: dict) -> bool:
    """Every shard of the manifest against its sha256; a bad one is deleted with the manifest -> False."""
    for split in SPLITS:
        for rec in m["splits"][split]["shards"]:
            try:
                verify_shard(folder / rec["file"], rec["sha256"])
            except DataError as e:
                say(f"prepare: {str(e).split(':')[0]} is bad; rewriting it")
                (folder / MANIFEST).unlink(missing_ok=True)
                return False
    return True


def resolve_num_proc(data_cfg, src: Source) -> int:
    n = data_cfg.get("num_proc")
    if n is None:
        if src.total_bytes is not None and src.total_bytes < SMALL_CORPUS_BYTES:
            return 1
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"data.num_proc={n} must be a positive integer (or null: one per core)")
    return n


def _char_tokenizer(ds, src, rule, vf, num_proc) -> CharTokenizer:
    seen, parts = set(), {"train": 0, "val": 0}
    with _Workers(num_proc, None, "uint32") as w:
        for s, p in w.map(_scan, split_batches(doc_batches(ds, src), rule, vf, {"train": 0, "val": 0})):
            seen |= s
            parts = {k: parts[k] + p[k] for k in parts}
    if parts["train"] > 1 or parts["val"] > 1:
        seen.add(ord(CharTokenizer.SEP))
    if not seen:
        raise DataError(f"{src.label} has no non-empty document: check the corpus (and data.text_column)")
    return CharTokenizer([chr(c) for c in sorted(seen)])


def _start_plan(folder: Path, plan: dict) -> None:
    """Record what decides the shard bytes; shards made under another plan are removed first, and the temporary
    files of writers killed before."""
    p = folder / PLAN
    try:
        old = json.loads(p.read_text()) if p.is_file() else None
    except (OSError, ValueError):
        old = {}
    if old != plan:
        for f in [*folder.glob("train-*.bin"), *folder.glob("val-*.bin"), folder / MANIFEST]:
            f.unlink(missing_ok=True)
        atomic_write_bytes(p, json.dumps(plan, sort_keys=True).encode())
    remove_dead_writers_temps(folder)


def _tokenize(ds, src: Source, writers: dict, tok: Tokenizer, plan: dict, num_proc: int, n_docs) -> tuple[int, int]:
    """The main pass, from the first document a split still needs -> (documents in the corpus, empty documents)."""
    w0 = min(writers.values(), key=lambda w: w.next_doc)
    start, empty, total = w0.next_doc, w0.resume_empty, w0.next_doc
    todo = {s: w.next_doc for s, w in writers.items()}
    progress = Progress(n_docs, start)
    try:
        with _Workers(num_proc, tok, plan["dtype"]) as workers:
            batches = split_batches(doc_batches(ds, src, start), plan["rule"], plan["val_fraction"], todo)
            for results in workers.map(_encode, batches):
                nbytes = 0
                for index, parts in results:
                    if parts is None:
                        empty += 1
                        continue
                    for split, toks, b in parts:
                        writers[split].add(index, toks, b, empty)
                        nbytes += b
                total = results[-1][0] + 1
                progress.update(len(results), nbytes)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        progress.close()
    for w in writers.values():
        w.finish()
    return total, empty


def _check_sides(writers: dict, src: Source, rule: str, vf: float, n_docs: int, empty: int) -> None:
    if not writers["train"].docs and not writers["val"].docs:
        raise DataError(f"{src.label} has no non-empty document ({empty} empty): check the corpus and "
                        f"data.text_column={src.text_column}")
    for split in SPLITS:
        if not writers[split].tokens:
            if rule == "cut":
                raise DataError(f"{src.label} is too small to split with data.val_fraction={vf}: use a longer corpus")
            raise DataError(f"data.val_fraction={vf} put none of the {n_docs} documents of {src.label} in the {split} "
                            f"split: change data.val_fraction")


def prepare(data_cfg, tokenizer_name: str, verify: bool = True) -> tuple[Path, dict, Tokenizer]:
    """Tokenize the corpus into shards unless its manifest exists -> (folder, manifest, tokenizer).
    `verify`: check every shard's sha256 (a bad one is rewritten); without it only headers and sizes are checked,
    when the shards are opened."""
    src = open_source(data_cfg)
    settings = {"data.shard_tokens": check_shard_tokens(data_cfg),
                "data.val_fraction": check_val_fraction(data_cfg.get("val_fraction", 0.1)),
                "data.text_column": src.text_column, "data.id_column": src.key_column,
                "split rules version": RULES_VERSION}
    folder = shards_folder(data_cfg, src, tokenizer_name)
    tok = None if tokenizer_name == "char" else build_tokenizer(tokenizer_name)

    def ready():  # -> (manifest, tokenizer) of complete shards made with these settings, or None
        m = read_manifest(folder)
        if m is None:
            return None
        t = check_manifest(m, folder, src, settings, tokenizer_name, tok)
        return (m, t) if not verify or verify_all(folder, m) else None

    done = None if verify else ready()  # verifying (and rewriting a bad shard) is for the lock's holder
    if done is None:
        with folder_lock(folder):
            done = ready() or _write(data_cfg, src, folder, tok, settings)  # ready: another prepare wrote them
    return folder, *done


def _write(data_cfg, src: Source, folder: Path, tok: Tokenizer | None, settings: dict) -> tuple[dict, Tokenizer]:
    """Tokenize `src` into shards in `folder` (resuming from the shards on disk) -> (manifest, tokenizer)."""
    size, vf = settings["data.shard_tokens"], settings["data.val_fraction"]
    num_proc = resolve_num_proc(data_cfg, src)
    ds = src.build()
    check_columns(ds, src)
    n_docs = src.n_docs if src.n_docs is not None else (len(ds) if hasattr(ds, "__len__") else None)
    keys = src.keys if src.keys is not None else (
        [str(i) for i in range(n_docs)] if n_docs is not None and not src.key_column else None)
    rule = choose_rule(keys, n_docs, vf)
    if tok is None:
        tok = _char_tokenizer(ds, src, rule, vf, num_proc)
    dtype = dtype_for(tok.vocab_size)
    plan = {"format": FORMAT_VERSION, "fingerprint": src.fingerprint, "tokenizer": tok.identity(), "dtype": dtype,
            "shard_tokens": size, "rule": rule, "split_rules": RULES_VERSION, "val_fraction": vf,
            "text_column": src.text_column, "key_column": src.key_column}
    _start_plan(folder, plan)
    writers = {}
    for split in SPLITS:
        records, cursor = existing_shards(folder, split)
        writers[split] = SplitWriter(folder, split, size, dtype, tok.sep_id, cursor, records)
    done = sum(len(w.records) for w in writers.values())
    kind = ("thread", "threads") if num_proc > 1 and tok.releases_gil else ("process", "processes")
    say(f"prepare: {src.label} with tokenizer={tok.name} -> {folder} ({num_proc} {kind[num_proc > 1]}"
        + (f"; resuming after {done} finished shards)" if done else ")"))
    t0 = time.perf_counter()
    PASS_STARTED["at"] = process_seconds()
    total, empty = _tokenize(ds, src, writers, tok, plan, num_proc, n_docs)
    empty += src.empty
    _check_sides(writers, src, rule, vf, total, empty)
    m = {"format": FORMAT_VERSION, "dtype": dtype, "shard_tokens": size, "tokenizer": tok.identity(),
         "tokenizer_hash": tok.hash,
         "corpus": {"label": src.label, "fingerprint": src.fingerprint, "documents": total + src.empty,
                    "empty_documents": empty, "split_rule": rule, "split_rules": RULES_VERSION, "val_fraction": vf,
                    "text_column": src.text_column, "id_column": src.key_column, **src.info},
         "splits": {s: {"documents": w.docs, "bytes": w.bytes, "tokens": w.tokens, "shards": w.records}
                    for s, w in writers.items()}}
    write_manifest(folder, m)
    secs = time.perf_counter() - t0
    mb = (m["splits"]["train"]["bytes"] + m["splits"]["val"]["bytes"]) / 1e6
    rate = " (resumed)" if done else f", {mb / max(secs, 1e-9):.2f} MB/s"  # a resumed pass reads what it skips
    say(f"prepared: {total:,} documents ({empty:,} empty, skipped) -> {m['splits']['train']['tokens']:,} train + "
        f"{m['splits']['val']['tokens']:,} val tokens in {sum(len(w.records) for w in writers.values())} shards | "
        f"{secs:.1f} s{rate}")
    return m, tok


# ---------------------------------------------------------------------------------------------------- CLI
def command() -> Command:
    """The options are config keys: conf/data/_corpus.yaml (with its comments) lists them."""
    from .cli import Command, Option, yaml_options
    from .compose import CONF_DIR

    def choices(group: str) -> str:
        return " | ".join(sorted(p.stem for p in (CONF_DIR / group).glob("[!_]*.yaml")))

    return Command("ablations.prepare", "[data=NAME] [tokenizer=NAME] [data.KEY=VALUE ...]", __doc__.split("\n\n")[0],
                   options=(Option("data", f"the corpus: {choices('data')}", "pystdlib"),
                            Option("tokenizer", choices("tokenizer"), "byte"),
                            *yaml_options(CONF_DIR / "data" / "_corpus.yaml", "data.")),
                   rest="any other override of the training config (each corpus's own keys: conf/data/NAME.yaml)",
                   examples=("data=shakespeare tokenizer=gpt2", "data=hf data.dataset=... data.num_proc=4"))


def main(argv: list[str]) -> int:
    from hydra.errors import HydraException

    from .compose import check_argv, compose

    command().read(argv)  # -h/--help; a flag, which is no override: one line
    try:
        cfg = compose(argv)
    except HydraException as e:  # check_argv's one line where it has one (it composes too: ~0.2 s, on errors only)
        print(check_argv(argv) or f"error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        folder, m, tok = prepare(cfg.data, str(cfg.tokenizer.name), verify=True)
    except AblationsError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return exit_code(e)
    n = sum(len(m["splits"][s]["shards"]) for s in SPLITS)
    say(f"ready: {folder} ({n} shards verified, {m['splits']['train']['tokens']:,} train + "
        f"{m['splits']['val']['tokens']:,} val tokens, tokenizer {tok.name} {tok.hash[:12]}) | {timing()}")
    return 0


def timing() -> str:
    """This process's seconds end to end, and how many of them came before the first document was read."""
    total, start = process_seconds(), PASS_STARTED.get("at")
    if start is None:
        return f"{total:.1f} s end to end, nothing to tokenize"
    return (f"{total:.1f} s end to end, {start:.1f} s ({start / total:.0%}) of it start-up (interpreter, imports, "
            f"config, corpus and tokenizer opened, shards on disk checked)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
