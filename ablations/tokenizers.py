"""Tokenizers: byte (256 ids), char (vocabulary from the corpus) and gpt2 (tiktoken BPE).

Every tokenizer has ``name``, ``vocab_size``, ``sep_id`` (document separator, or None), ``encode``/``decode``,
``identity()`` (a JSON-able dict that rebuilds it: recorded in checkpoints) and ``hash`` (sha256 of the identity).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .errors import ConfigError, TokenizerError

TOKENIZERS = ("byte", "char", "gpt2")
GPT2_URLS = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)


def _sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


class Tokenizer:
    name: str
    vocab_size: int
    sep_id: int | None
    releases_gil = False  # encode_np runs without the GIL: threads encode in parallel (prepare uses threads then)

    def encode(self, text: str) -> list[int]:
        return self.encode_np(text).tolist()

    def encode_np(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def encode_docs(self, docs: Sequence[str]) -> np.ndarray:
        """Encode documents and pack them into one stream, separated by ``sep_id``."""
        parts = []
        for i, doc in enumerate(self._encode_batch(docs)):
            if i and self.sep_id is not None:
                parts.append(np.array([self.sep_id], dtype=np.int64))
            parts.append(doc)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _encode_batch(self, docs: Sequence[str]) -> Iterable[np.ndarray]:
        return (self.encode_np(d) for d in docs)

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def identity(self) -> dict:
        raise NotImplementedError

    @property
    def hash(self) -> str:
        return _sha256(self.identity())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, hash={self.hash[:12]})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes. Byte 0 (NUL, absent from text files) separates documents."""

    name = "byte"
    vocab_size = 256
    sep_id = 0

    def encode_np(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) & 0xFF for i in ids).decode("utf-8", errors="replace")

    def identity(self) -> dict:
        return {"name": "byte", "vocab_size": 256, "sep_id": 0}


class CharTokenizer(Tokenizer):
    """One id per distinct character (sorted by code point)."""

    name = "char"
    SEP = "\x00"

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        if not chars or len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise TokenizerError("char tokenizer: the vocabulary must be a non-empty list of distinct characters")
        self.chars = chars
        self.vocab_size = len(chars)
        self._cp = np.array([ord(c) for c in chars], dtype=np.uint32)
        self._order = np.argsort(self._cp)
        self._sorted = self._cp[self._order]
        self.sep_id = chars.index(self.SEP) if self.SEP in chars else None

    @classmethod
    def from_texts(cls, texts: Iterable[str], with_separator: bool) -> "CharTokenizer":
        seen: set[int] = set()
        for t in texts:
            seen.update(np.unique(np.frombuffer(t.encode("utf-32-le"), dtype=np.uint32)).tolist())
        if with_separator:
            seen.add(ord(cls.SEP))
        return cls([chr(c) for c in sorted(seen)])

    def encode_np(self, text: str) -> np.ndarray:
        cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        pos = np.searchsorted(self._sorted, cp)
        pos = np.minimum(pos, len(self._sorted) - 1)
        bad = self._sorted[pos] != cp
        if bad.any():
            c = chr(int(cp[np.argmax(bad)]))
            raise TokenizerError(
                f"char tokenizer: character {c!r} is not in the {self.vocab_size}-character vocabulary of this "
                f"corpus: remove it from the text or train with tokenizer=byte")
        return self._order[pos].astype(np.int64)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def identity(self) -> dict:
        return {"name": "char", "vocab_size": self.vocab_size, "chars": "".join(self.chars)}


class GPT2Tokenizer(Tokenizer):
    """GPT-2 BPE via tiktoken; <|endoftext|> (50256) separates documents."""

    name = "gpt2"
    releases_gil = True  # tiktoken's Rust encoder lets go of the GIL while it encodes

    def __init__(self):
        self._enc, self._ranks_sha = gpt2_encoding()  # the ranks' sha256: a different BPE table is detected
        self.vocab_size = self._enc.n_vocab
        self.sep_id = self._enc.eot_token

    def encode_np(self, text: str) -> np.ndarray:
        # encode_ordinary's tokens (special-token text encoded as text), straight into an array: no Python list
        return self._enc.encode_to_numpy(text, disallowed_special=())

    def _encode_batch(self, docs):
        out = self._enc.encode_ordinary_batch(list(docs), num_threads=max(1, os.cpu_count() or 1))
        return (np.asarray(d, dtype=np.int64) for d in out)

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode([int(i) for i in ids])

    def identity(self) -> dict:
        return {"name": "gpt2", "vocab_size": self.vocab_size, "sep_id": self.sep_id, "ranks_sha256": self._ranks_sha}


def _tiktoken_cache_dir() -> Path:
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return Path(os.environ["TIKTOKEN_CACHE_DIR"])
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return Path(os.environ["DATA_GYM_CACHE_DIR"])
    import tempfile

    return Path(tempfile.gettempdir()) / "data-gym-cache"


def ranks_sha256(ranks: dict[bytes, int]) -> str:
    h = hashlib.sha256()
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        h.update(tok)
        h.update(rank.to_bytes(4, "little"))
    return h.hexdigest()


def _gpt2_spec_path() -> Path | None:
    """Where the parsed gpt2 ranks are kept: named by tiktoken's version and the sizes and mtimes of GPT-2's BPE
    files in the tiktoken cache (None when they are not there: tiktoken downloads them, or says why it cannot)."""
    import tiktoken

    from .sources import default_cache_dir

    try:
        files = [(_tiktoken_cache_dir() / hashlib.sha1(u.encode()).hexdigest()).stat() for u in GPT2_URLS]
    except OSError:
        return None
    key = json.dumps([tiktoken.__version__, [(f.st_size, f.st_mtime_ns) for f in files]])
    return default_cache_dir() / "tiktoken" / f"gpt2-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def gpt2_encoding():
    """-> (tiktoken's gpt2 Encoding, the sha256 of its BPE ranks). tiktoken parses GPT-2's BPE files (data-gym
    format) in every process, ~0.15 s of CPU (a sixth of prepare's start-up); the parsed ranks are kept as JSON
    (base64 token -> rank, with the rest of tiktoken's gpt2 spec) in the ablations cache, ~0.03 s to read, and used
    only when the ranks read back hash to the sha256 recorded with them (else parsed again and rewritten)."""
    import base64

    import tiktoken

    from .sources import atomic_write_bytes

    path = _gpt2_spec_path()
    try:
        spec = json.loads(path.read_text()) if path else None
        ranks = {base64.b64decode(t): r for t, r in spec.pop("ranks").items()} if spec else None
        sha = spec.pop("ranks_sha256") if spec else None
        if ranks and ranks_sha256(ranks) == sha:
            return tiktoken.Encoding(**spec, mergeable_ranks=ranks), sha
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # absent or damaged: parse again
        pass
    enc = load_tiktoken_gpt2()
    ranks = enc._mergeable_ranks  # noqa: SLF001 - tiktoken keeps no public accessor for them
    sha = ranks_sha256(ranks)
    if path:
        spec = {"name": enc.name, "pat_str": enc._pat_str, "special_tokens": enc._special_tokens,  # noqa: SLF001
                "explicit_n_vocab": enc.n_vocab, "ranks_sha256": sha,
                "ranks": {base64.b64encode(t).decode(): r for t, r in ranks.items()}}
        try:
            atomic_write_bytes(path, json.dumps(spec).encode())
        except OSError:  # a read-only cache: parsed again next time, nothing else lost
            pass
    return enc, sha


def load_tiktoken_gpt2():
    import tiktoken

    cache = _tiktoken_cache_dir()
    missing = [u for u in GPT2_URLS if not (cache / hashlib.sha1(u.encode()).hexdigest()).is_file()]
    try:
        return tiktoken.get_encoding("gpt2")
    except (OSError, ValueError) as e:  # offline: requests' ConnectionError (an OSError), or a corrupt cache file
        detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        raise TokenizerError(
            f"tokenizer=gpt2: tiktoken could not load the GPT-2 BPE files ({len(missing)} of 2 missing from "
            f"TIKTOKEN_CACHE_DIR={cache}; {detail}): set TIKTOKEN_CACHE_DIR to a folder holding them "
            f"(files named by the sha1 of their URL), or run once with network access, or use tokenizer=byte"
        ) from None


def build_tokenizer(name: str, texts: Iterable[str] | None = None, with_separator: bool = True) -> Tokenizer:
    """Build the tokenizer ``name``; ``char`` needs the corpus ``texts``."""
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == "char":
        if texts is None:
            raise TokenizerError("char tokenizer: needs the corpus to build its vocabulary")
        return CharTokenizer.from_texts(texts, with_separator)
    raise ConfigError(f"tokenizer.name={name!r} is unknown: use one of {', '.join(TOKENIZERS)}")


def tokenizer_from_identity(identity: dict) -> Tokenizer:
    """Rebuild a tokenizer recorded by :meth:`Tokenizer.identity` (checks that it is the same one)."""
    if not isinstance(identity, dict) or identity.get("name") not in TOKENIZERS:
        raise TokenizerError(f"unrecognised tokenizer record {str(identity)[:80]!r}: the checkpoint is not from this harness")
    name = identity["name"]
    tok = CharTokenizer(list(identity["chars"])) if name == "char" else build_tokenizer(name)
    if tok.identity() != identity:
        raise TokenizerError(
            f"tokenizer {name!r} here (hash {tok.hash[:12]}) differs from the recorded one "
            f"(hash {_sha256(identity)[:12]}): use the BPE files the run was trained with")
    return tok
