"""The train/val split of a corpus, read by the writer (``ablations.prepare``) and the reader (``ablations.data``).

Two rules, both reading only the text (never the tokenizer), so bits per byte compare across tokenizers:

- ``document``: a document goes to val when the sha256 of its name (the relative path for file corpora,
  ``data.id_column`` when set, else its index in the corpus) falls below ``val_fraction``;
- ``cut``: for a corpus of fewer than 20 documents, or one whose documents would all land on one side, each document
  is cut at the line break after ``1 - val_fraction`` of its length (train the first part, val the rest).

A document's split is known from its name and text alone, before it is tokenized: a resumed prepare skips the
documents of a split whose shards are already written without tokenizing them. ``RULES_VERSION`` is recorded in
every manifest; change it with any change to these rules, so that shards split by the old rules are refused.
"""
from __future__ import annotations

import hashlib

from .errors import ConfigError

RULES_VERSION = 1
MIN_DOCS_FOR_DOC_SPLIT = 20
CHECK_SIDES_MAX_DOCS = 100_000  # up to this many named documents, both sides of the split are checked up front


def check_val_fraction(val_fraction) -> float:
    vf = float(val_fraction)
    if not 0.0 < vf < 1.0:
        raise ConfigError(f"data.val_fraction={val_fraction} must be in (0, 1), e.g. 0.1")
    return vf


def is_val(key: str, val_fraction: float) -> bool:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") < int(val_fraction * 2**32)


def split_parts(key: str, text: str, rule: str, val_fraction: float) -> list[tuple[str, str]]:
    """[(split, text)] of one document: itself under the document rule, else its two halves (empty parts dropped)."""
    if rule == "document":
        return [("val" if is_val(key, val_fraction) else "train", text)]
    i = int(len(text) * (1.0 - val_fraction))  # cut at the line break after (1 - val_fraction) of the text
    j = text.find("\n", i)
    i = j + 1 if 0 <= j < len(text) - 1 else i
    return [(s, t) for s, t in (("train", text[:i]), ("val", text[i:])) if t]


def choose_rule(keys: list[str] | None, n_docs: int | None, val_fraction: float) -> str:
    """"cut" for fewer than 20 documents, or when (checked for up to 100k known names) one side would be empty."""
    if n_docs is not None and n_docs < MIN_DOCS_FOR_DOC_SPLIT:
        return "cut"
    if keys is not None and len(keys) <= CHECK_SIDES_MAX_DOCS:
        n_val = sum(is_val(k, val_fraction) for k in keys)
        if n_val in (0, len(keys)):
            return "cut"
    return "document"


def split_docs(docs, val_fraction: float) -> tuple[list[str], list[str]]:
    """The train/val split of a list of (name, text) documents, as prepare splits a corpus (for small lists)."""
    vf = check_val_fraction(val_fraction)
    rule = choose_rule([n for n, _ in docs], len(docs), vf)
    out = {"train": [], "val": []}
    for name, text in docs:
        for split, part in split_parts(name, text, rule, vf):
            out[split].append(part)
    return out["train"], out["val"]
