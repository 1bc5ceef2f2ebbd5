"""Data pipeline: tokenizers, deterministic split, token cache, windows shifted by one, resumable position."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from ablations.data import (TokenDataModule, TrainBatches, check_windows, prepare_data, train_starts,
                            val_starts, window_batch)
from ablations.errors import DataError, TokenizerError
from ablations.splits import split_docs
from ablations.tokenizers import CharTokenizer, build_tokenizer, tokenizer_from_identity

TEXT = "Hello, wörld! ✓ tabs\tand\nnew lines\n" * 3


def shakespeare_cfg(path, cache, **kw):
    return OmegaConf.create({"name": "shakespeare", "path": str(path), "cache_dir": str(cache), "val_fraction": 0.1,
                             "sha256": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", **kw})


@pytest.mark.parametrize("name", ["byte", "char", "gpt2"])
def test_tokenizers_round_trip(name):
    tok = build_tokenizer(name, texts=[TEXT])
    ids = tok.encode(TEXT)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == TEXT
    again = tokenizer_from_identity(tok.identity())
    assert again.hash == tok.hash and again.encode(TEXT) == ids
    assert {"byte": 256, "gpt2": 50257}.get(name, tok.vocab_size) == tok.vocab_size


def test_char_tokenizer_unknown_character_is_one_clear_line():
    tok = CharTokenizer.from_texts(["abc"], with_separator=False)
    assert tok.vocab_size == 3 and tok.sep_id is None
    with pytest.raises(TokenizerError, match=r"'z' is not in the 3-character vocabulary.*tokenizer=byte"):
        tok.encode("abz")


def test_gpt2_missing_offline_names_tiktoken_cache_dir(tmp_path):
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path), "HTTPS_PROXY": "http://127.0.0.1:9",
           "https_proxy": "http://127.0.0.1:9"}
    r = subprocess.run([sys.executable, "-c", "from ablations.tokenizers import build_tokenizer as b; b('gpt2')"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "TokenizerError" in last and "TIKTOKEN_CACHE_DIR" in last and "2 of 2 missing" in last


def test_windows_are_shifted_by_exactly_one():
    tokens = np.arange(1000, dtype=np.uint16)
    starts = np.array([0, 17, 1000 - 33])
    x, y = window_batch(tokens, starts, block_size=32)
    assert x.shape == y.shape == (3, 32) and x.dtype == torch.int64
    assert torch.equal(y, x + 1)
    assert torch.equal(x[:, 0], torch.from_numpy(starts))
    assert int(y.max()) == 999  # the last start still fits a whole window of block_size + 1


def test_train_batches_are_deterministic_and_resumable(tmp_path, shakespeare_path):
    td = prepare_data(shakespeare_cfg(shakespeare_path, tmp_path), "byte")
    s1 = train_starts(0, 5, 8, td.n_train, 64)
    assert np.array_equal(s1, train_starts(0, 5, 8, td.n_train, 64))
    assert not np.array_equal(s1, train_starts(1, 5, 8, td.n_train, 64))
    assert s1.min() >= 0 and s1.max() <= td.n_train - 65
    dm = TokenDataModule(td, block_size=64, batch_size=4, seed=3)
    it = iter(TrainBatches(dm, start=0))
    first = [next(it) for _ in range(6)]
    dm.load_state_dict({"position": 4})  # what a checkpoint at step 4 restores
    resumed = next(iter(dm.train_dataloader()))
    assert torch.equal(resumed[0], first[4][0]) and torch.equal(resumed[1], first[4][1])
    vs = val_starts(td.n_val, 64, 16)
    assert len(vs) == 16 and vs.max() <= td.n_val - 65


def test_split_is_deterministic_and_tokenizer_independent(tmp_path, shakespeare_path):
    docs = [(f"d{i}.txt", f"document {i}\n" * (i + 1)) for i in range(50)]
    a, b = split_docs(docs, 0.2), split_docs(list(docs), 0.2)
    assert a == b and a[1] and a[0] and len(a[0]) + len(a[1]) == 50
    (single_train, single_val) = split_docs([("x", "line\n" * 100)], 0.1)
    assert single_train[0].endswith("\n") and single_train[0] + single_val[0] == "line\n" * 100
    cfg = shakespeare_cfg(shakespeare_path, tmp_path)
    byte, char = prepare_data(cfg, "byte"), prepare_data(cfg, "char")
    assert byte.val_bytes == char.val_bytes  # same val text whatever the tokenizer: bpb compares
    assert byte.val_tokens_per_byte == 1.0 and char.tokenizer.vocab_size == 65
    again = prepare_data(cfg, "char")  # cache hit: same file, same vocabulary
    assert again.path == char.path and again.tokenizer.hash == char.tokenizer.hash
    assert np.array_equal(np.asarray(again.memmap()[:100]), np.asarray(char.memmap()[:100]))
    assert byte.path != char.path


def test_corpus_shorter_than_one_window(tmp_path):
    f = tmp_path / "tiny.txt"
    f.write_text("to be or not to be\n" * 3)
    td = prepare_data(OmegaConf.create({"name": "text", "path": str(f), "cache_dir": str(tmp_path / "c"),
                                        "val_fraction": 0.1}), "byte")
    with pytest.raises(DataError, match=r"(train|val) split has \d+ tokens, fewer than one window of model.block_size\+1=65"):
        check_windows(td, 64)


def test_missing_local_corpus_is_one_clear_line(tmp_path):
    with pytest.raises(DataError, match="data.path=.*does not exist"):
        prepare_data(OmegaConf.create({"name": "text", "path": str(tmp_path / "nope"), "cache_dir": str(tmp_path)}),
                     "byte")


def test_pystdlib_order_is_deterministic(tmp_path):
    from ablations.sources import pystdlib_source

    src = pystdlib_source(OmegaConf.create({"cache_dir": str(tmp_path)}))
    names = src.keys
    assert names == sorted(names) and len(names) > 200 and src.n_docs == len(names)
    assert src.total_bytes > 2_000_000
    assert not any(n.startswith(("test/", "site-packages/")) for n in names)
    assert pystdlib_source(OmegaConf.create({"cache_dir": str(tmp_path)})).fingerprint == src.fingerprint


def test_shakespeare_local_copy_from_env_and_text_directory(tmp_path, shakespeare_path, monkeypatch):
    monkeypatch.setenv("ABLATIONS_SHAKESPEARE_PATH", str(shakespeare_path))
    cfg = shakespeare_cfg(shakespeare_path, tmp_path)
    cfg.path = None  # found through the environment variable, no download
    td = prepare_data(cfg, "byte")
    assert td.n_train + td.n_val == 1115394 and not (tmp_path / "tinyshakespeare.txt").exists()
    bad = tmp_path / "not-shakespeare.txt"
    bad.write_text("hello\n" * 1000)
    with pytest.raises(DataError, match="sha256 mismatch.*data=text"):
        prepare_data(shakespeare_cfg(bad, tmp_path), "byte")
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    for name in ("b.txt", "a.txt", "sub/c.txt", "skip.md"):
        (d / name).write_text(f"{name}\n" * 200)
    td = prepare_data(OmegaConf.create({"name": "text", "path": str(d), "glob": "**/*.txt", "cache_dir": str(tmp_path),
                                        "val_fraction": 0.1}), "char")
    text = td.tokenizer.decode(np.asarray(td.memmap()[:td.n_train]).tolist())
    assert "skip.md" not in text and text.index("a.txt") < text.index("b.txt") < text.index("sub/c.txt")
    assert td.tokenizer.sep_id is not None and text.count("\x00") == 2  # three documents, packed with separators
