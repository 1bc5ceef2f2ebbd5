"""Prepare interrupted or run twice at once: a resumed prepare tokenizes only what each split still lacks, two
prepares of one cold cache both succeed (one waits for the other's lock), a starting writer removes only dead
writers' temporary files.

Known answers: the documents a split still needs are those from the cursor in its last shard on disk, each split's
by the documented rule (sha256 of the document's index); with the byte tokenizer a document's tokens are its UTF-8
bytes, so what a resumed prepare must tokenize is counted by hand."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from test_data_shards import OFFLINE, REPO, data_cfg, make_docs, shard_bytes, write_parquet

from ablations.prepare import prepare
from ablations.shards import read_header, shard_name
from ablations.sources import remove_dead_writers_temps
from ablations.splits import is_val
from ablations.tokenizers import ByteTokenizer


def test_a_resumed_prepare_tokenizes_only_what_each_split_lacks(tmp_path, monkeypatch):
    """As a kill leaves it: no manifest, train's first 60% of shards, val's first shard only. The re-run must
    tokenize each split's documents from its own cursor on (not from the earliest of the two, val's, as before:
    that redid nearly the whole corpus), and write the same bytes as the uninterrupted prepare."""
    docs = make_docs(400, seed=5, words=30)
    corpus = write_parquet(tmp_path / "c.parquet", docs)
    ref = prepare(data_cfg(tmp_path, corpus, shard_tokens=300, cache_dir=tmp_path / "ref"), "byte")[0]
    folder = tmp_path / "killed"
    shutil.copytree(ref, folder)
    (folder / "manifest.json").unlink()
    keep = {"train": int(0.6 * len(list(ref.glob("train-*.bin")))), "val": 1}
    for split, k in keep.items():
        for f in folder.glob(f"{split}-*.bin"):
            if int(f.stem.split("-")[1]) >= k:
                f.unlink()
    cursor = {s: read_header(folder / shard_name(s, k - 1)).cursor for s, k in keep.items()}
    assert cursor["val"]["next_doc"] < cursor["train"]["next_doc"] / 4  # val's cursor is far behind train's
    encoded = []
    encode = ByteTokenizer.encode_np
    monkeypatch.setattr(ByteTokenizer, "encode_np", lambda self, text: encoded.append(text) or encode(self, text))
    prepare(data_cfg(tmp_path, corpus, shard_tokens=300, shards_dir=folder), "byte")
    # by hand: each split's documents from its cursor (the one it was cut in included: its tokens are redone whole)
    need = [d for i, d in enumerate(docs)
            if d and i >= cursor["val" if is_val(str(i), 0.1) else "train"]["next_doc"]]
    assert sorted(encoded) == sorted(need)
    assert shard_bytes(folder) == shard_bytes(ref)
    assert json.loads((folder / "manifest.json").read_text()) == json.loads((ref / "manifest.json").read_text())


def test_a_read_only_folder_is_verified_without_its_lock(tmp_path, monkeypatch):
    """Shards prepared elsewhere and shared read-only: `python -m ablations.prepare` (which verifies) cannot create
    the lock file there, and needs no lock to read."""
    import builtins
    import errno

    import ablations.prepare as prep

    cfg = data_cfg(tmp_path, write_parquet(tmp_path / "c.parquet", make_docs(40)), shard_tokens=300)
    folder, m, _ = prepare(cfg, "byte")
    (folder / prep.LOCK).unlink()

    def no_lock(path, *args, **kw):
        if str(path).endswith(prep.LOCK):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return builtins.open(path, *args, **kw)

    monkeypatch.setattr(prep, "open", no_lock, raising=False)
    assert prepare(cfg, "byte", verify=True)[1] == m
    assert not (folder / prep.LOCK).exists()


def test_only_dead_writers_temporary_files_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = tmp_path / f".train-000002.bin.{os.getpid()}.abc_12.tmp"  # a live writer's shard in progress
    gone = tmp_path / f".train-000001.bin.{dead.pid}.xyz_34.tmp"      # left by a writer killed mid-shard
    manifest = tmp_path / f".manifest.json.{dead.pid}.q1w2e3.tmp"
    for f in (mine, gone, manifest):
        f.write_bytes(b"x")
    assert remove_dead_writers_temps(tmp_path) == 2
    assert mine.exists() and not gone.exists() and not manifest.exists()


def _prepare_cmd(corpus, cache):
    return [sys.executable, "-m", "ablations.prepare", "data=hf", f"data.path={corpus}", "tokenizer=byte",
            "data.shard_tokens=1024", "data.num_proc=1", f"data.cache_dir={cache}"]


def _env():
    return {**os.environ, **OFFLINE, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}


def _lines(proc, out: list):
    for line in proc.stdout:
        out.append(line)


@pytest.mark.slow
def test_two_prepares_on_one_cold_cache(tmp_path):
    """The first prepare is stopped (SIGSTOP) in the middle of a shard, the second started on the same cold cache:
    it must wait for the first (saying so) instead of deleting its temporary file and writing beside it (the first
    then crashed in os.replace), and both end with the shards of an uninterrupted prepare."""
    docs = make_docs(600, seed=3, words=120)  # ~450 shards of 1024 bytes
    corpus = write_parquet(tmp_path / "c.parquet", docs, row_group_size=64)
    ref = prepare(data_cfg(tmp_path, corpus, shard_tokens=1024, cache_dir=tmp_path / "ref"), "byte")[0]
    cache = tmp_path / "cold"
    a = subprocess.Popen(_prepare_cmd(corpus, cache), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    b = None
    try:
        _stop_mid_shard(a, cache)
        b = subprocess.Popen(_prepare_cmd(corpus, cache), env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        out_b: list[str] = []
        threading.Thread(target=_lines, args=(b, out_b), daemon=True).start()
        deadline = time.time() + 120
        while time.time() < deadline and b.poll() is None and not any("waiting" in ln for ln in out_b):
            time.sleep(0.05)
        os.kill(a.pid, signal.SIGCONT)
        out_a, err_a = a.communicate(timeout=300)
        b.wait(timeout=300)
        err_b = b.stderr.read()
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
    assert a.returncode == 0, err_a[-2000:]
    assert b.returncode == 0, err_b[-2000:]
    folder = next(cache.glob("tokens/*"))
    assert any(f"waiting for another prepare writing {folder}" in ln for ln in out_b), out_b
    assert "[ablations] ready:" in out_a and any("[ablations] ready:" in ln for ln in out_b)
    assert shard_bytes(folder) == shard_bytes(ref)
    assert not list(folder.glob(".*.tmp"))


def _stop_mid_shard(proc, cache):
    """SIGSTOP `proc` after its third train shard, at a moment when a shard of it is half written (a temp file)."""
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if len(list(cache.glob("tokens/*/train-*.bin"))) >= 3:
            os.kill(proc.pid, signal.SIGSTOP)
            if list(cache.glob("tokens/*/.train-*.tmp")):
                return
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.002)
    raise AssertionError(f"prepare ended before it could be stopped mid-shard: {proc.stderr.read()[-2000:]}")
