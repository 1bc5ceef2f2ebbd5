"""What a shards folder must match before it is used: every setting that changes the bytes (one line otherwise, and
nothing deleted), ids wider than 16 bits stored as uint32, and every shard checked, a split's last partial one too."""
import json

import numpy as np
import pytest
from test_data_shards import data_cfg, make_docs, shard_bytes, write_parquet

from ablations.compose import compose
from ablations.data import prepare_data
from ablations.errors import DataError
from ablations.prepare import main, prepare
from ablations.shards import HEADER_BYTES, read_header


def _one_line_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    return err[0]


def test_shards_dir_prepared_with_other_settings_is_one_line(tmp_path, capsys):
    """The issue's case: a data.shards_dir made with val_fraction 0.1 and 1000-token shards was reused ("ready")
    with 0.3 and 3M-token shards. Each setting recorded in the manifest is checked against the command's."""
    corpus = write_parquet(tmp_path / "c.parquet", make_docs(60))
    shards = tmp_path / "shards"
    base = ["data=hf", f"data.path={corpus}", "tokenizer=byte", "data.num_proc=1", f"data.shards_dir={shards}",
            f"data.cache_dir={tmp_path / 'cache'}", "data.shard_tokens=1000"]
    assert main(base) == 0
    good = shard_bytes(shards)
    fix = f"point data.shards_dir at a new folder, or delete {shards} and re-run prepare"
    for override, said in [("data.val_fraction=0.3", "data.val_fraction=0.1, not data.val_fraction=0.3"),
                           ("data.shard_tokens=3000000", "data.shard_tokens=1000, not data.shard_tokens=3000000")]:
        line = _one_line_error(capsys, [*base, override])
        assert line == f"error: {shards} was prepared with {said}: {fix}"
    # settings no override here can change without changing the corpus fingerprint: as another prepare recorded them
    cfg = data_cfg(tmp_path, corpus, shards_dir=shards, shard_tokens=1000)
    manifest = json.loads((shards / "manifest.json").read_text())
    for key, value, said in [("text_column", "content", "data.text_column=content, not data.text_column=text"),
                             ("id_column", "id", "data.id_column=id, not data.id_column=None"),
                             ("split_rules", 0, "split rules version=0, not split rules version=1")]:
        (shards / "manifest.json").write_text(json.dumps({**manifest, "corpus": {**manifest["corpus"], key: value}}))
        with pytest.raises(DataError) as e:
            prepare_data(cfg, "byte")
        assert str(e.value) == f"{shards} was prepared with {said}: {fix}"
    (shards / "manifest.json").write_text(json.dumps({**manifest, "dtype": "uint32"}))
    with pytest.raises(DataError) as e:
        prepare_data(cfg, "byte")
    assert str(e.value) == f"{shards} holds uint32 tokens, but the 256 ids of tokenizer=byte need uint16: {fix}"
    assert shard_bytes(shards) == good  # nothing deleted


def test_a_char_corpus_of_more_than_65536_characters_gives_uint32_shards(tmp_path):
    """70,000 distinct characters: ids up to 69,999 need 32 bits (as uint16 they wrapped silently) and must decode
    back to the text exactly."""
    chars = [chr(c) for c in range(0x100, 0x100 + 72_048) if not 0xD800 <= c < 0xE000]  # no surrogates
    assert len(chars) == 70_000
    text = "".join(np.random.default_rng(0).permutation(chars))
    path = tmp_path / "wide.txt"
    path.write_text(text, encoding="utf-8")
    td = prepare_data(compose(["data=text", f"data.path={path}", f"data.cache_dir={tmp_path / 'cache'}",
                               "data.shard_tokens=30000"]).data, "char")
    assert td.tokenizer.vocab_size == 70_000 and td.dtype == "uint32" and td.manifest["dtype"] == "uint32"
    assert {read_header(s.path).dtype for s in td.shards} == {"uint32"}
    ids = np.asarray(td.memmap()[0:td.n_train + td.n_val])
    assert ids.max() >= 1 << 16
    assert td.tokenizer.decode(ids.tolist()) == text  # one document: cut into train then val


def test_a_splits_last_partial_shard_is_checked_too(tmp_path, capsys):
    """Only the last, partial shard of a split is damaged: opening the shards must name it, and prepare must find
    and rewrite it (a check that stopped one shard short passed both)."""
    corpus = write_parquet(tmp_path / "c.parquet", make_docs(200))
    cfg = data_cfg(tmp_path, corpus, shard_tokens=500)
    folder, m, _ = prepare(cfg, "byte")
    good = shard_bytes(folder)
    last = {s: m["splits"][s]["shards"][-1] for s in ("train", "val")}
    assert all(0 < rec["tokens"] < 500 for rec in last.values())  # partial
    victim = folder / last["val"]["file"]
    raw = victim.read_bytes()
    victim.write_bytes(raw[:-1])
    with pytest.raises(DataError, match=rf"^shard {victim} is truncated or padded .*: re-run `python -m ablations"):
        prepare_data(cfg, "byte")
    victim.write_bytes(raw)
    flip_and_verify(cfg, folder / last["train"]["file"], 3, capsys)
    assert shard_bytes(folder) == good


def flip_and_verify(cfg, shard, at: int, capsys) -> None:
    """Payload byte `at` of `shard` flipped: prepare's verification must name the shard (and rewrite it)."""
    raw = bytearray(shard.read_bytes())
    raw[HEADER_BYTES + at] ^= 0xFF
    shard.write_bytes(bytes(raw))
    capsys.readouterr()
    prepare(cfg, "byte", verify=True)
    assert f"shard {shard} fails its checksum" in capsys.readouterr().out


def test_a_damaged_val_shard_alone_is_found_and_rewritten(tmp_path, capsys):
    """One payload byte of one val shard flipped, every train shard intact: prepare's verification must name it and
    rewrite it byte for byte (a verification of the train split only passed the other test, which breaks both)."""
    corpus = write_parquet(tmp_path / "c.parquet", make_docs(200))
    cfg = data_cfg(tmp_path, corpus, shard_tokens=500)
    folder, m, _ = prepare(cfg, "byte")
    good = shard_bytes(folder)
    assert len(m["splits"]["val"]["shards"]) >= 2
    flip_and_verify(cfg, folder / m["splits"]["val"]["shards"][0]["file"], 10, capsys)
    assert shard_bytes(folder) == good


def test_every_document_in_val_falls_back_to_the_cut_rule(tmp_path):
    """25 documents named 0-24 at val_fraction 0.97: the sha256 rule puts all 25 in val, so each document is cut at
    the line break after 3% of it instead. Document i is "doc i: " + 20 lines of "line of text\\n" (267 characters for
    i < 10, 268 after): 3% is 8 characters, the first line break is at 19 (20 for i >= 10), so train holds the first
    line of each, 10 x 20 + 15 x 21 = 515 bytes, val the other 6,690 - 515 = 6,175; each split one separator
    between consecutive documents (24)."""
    from ablations.splits import choose_rule, is_val

    docs = [f"doc {i}: " + "line of text\n" * 20 for i in range(25)]
    assert all(is_val(str(i), 0.97) for i in range(25))
    assert choose_rule([str(i) for i in range(25)], 25, 0.97) == "cut"
    corpus = write_parquet(tmp_path / "c.parquet", docs)
    _, m, _ = prepare(data_cfg(tmp_path, corpus, val_fraction=0.97), "byte")
    assert m["corpus"]["split_rule"] == "cut"
    assert (m["splits"]["train"]["tokens"], m["splits"]["val"]["tokens"]) == (515 + 24, 6175 + 24)
