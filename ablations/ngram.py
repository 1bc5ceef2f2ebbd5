"""An n-gram floor: count-based language models of orders 1..N with interpolated modified Kneser-Ney smoothing,
fitted on the train split and scored in bits per byte on the validation targets the models are scored on.

    python -m sweeps.floor experiment=NAME [orders=[1,2,3,4,5]] [scope=windows|full] [log=true tracking.uri=URI]

(the command composes the training config, prepares the same token file and logs the floor to MLflow; this module
is the model alone: numpy, no training code.)

Smoothing (Chen & Goodman 1998, "An empirical study of smoothing techniques for language modeling", TR-10-98,
section 3, eq. 17-19; interpolated Kneser-Ney with three discounts, "modified KN"):

    p_k(w | h) = max(c_k(hw) - D_k(c_k(hw)), 0) / c_k(h.) + gamma_k(h) p_{k-1}(w | h')
    gamma_k(h) = (D_k1 N1(h.) + D_k2 N2(h.) + D_k3+ N3+(h.)) / c_k(h.)

with h' the context h without its oldest token, c_k(h.) = sum_w c_k(hw) and Nj(h.) the number of words w with
c_k(hw) = j (j >= 3 for N3+). The highest order uses raw counts; every lower order k uses continuation counts
c_k(g) = N1+(. g), the number of distinct tokens seen before the k-gram g. An unseen context (c_k(h.) = 0) falls
through to p_{k-1}. The recursion ends in the uniform distribution over the vocabulary (1 / V). Discounts per order
and count kind, from the count-of-counts n_j (number of k-grams with count exactly j):
Y = n1 / (n1 + 2 n2), D1 = 1 - 2Y n2/n1, D2 = 2 - 3Y n3/n2, D3+ = 3 - 4Y n4/n3 (eq. 26); with a fixed
`discount=D` every count gets the one discount D (interpolated KN, section 2.7).

Counting is exact: k-grams get integer ids order by order (the id of a k-gram is the rank of the pair (id of its
first k-1 tokens, its last token) among the distinct pairs, numpy.unique on int64 keys), so there are no hash
collisions and nothing is a Python loop over tokens (~1 s per order per 10M tokens).

What "the same validation tokens" means: `val/bpb` of a run is the mean loss over the targets of `data.val_windows`
evenly spaced windows of `model.block_size + 1` tokens of the val split (ablations/data.py: val_starts), converted
with the split's tokens per byte (val tokens / val UTF-8 bytes). scope=windows scores exactly those targets, each
with at most the context the model had (the window's tokens before it, so the first targets of a window use a lower
order); scope=full scores every val token after the first, context cut at the start of the split. Both use the same
tokens-per-byte ratio as val/bpb.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

LOG2 = math.log(2.0)


@dataclass
class _Level:
    """The k-grams of the train split for one order k (k >= 1)."""

    keys: np.ndarray  # (G,) int64, sorted: id of the (k-1)-prefix * V + last token (k = 1: the token)
    raw: np.ndarray  # (G,) float64 counts c(g)
    prefix: np.ndarray  # (G,) int64 id of the (k-1)-gram prefix at order k-1 (k = 1: zeros, the empty context)
    cont: np.ndarray | None = None  # (G,) continuation counts N1+(. g) (orders below the highest)


@dataclass
class _Stats:
    """Per context (a (k-1)-gram id; one context for k = 1) for one order and count kind: total and N1/N2/N3+."""

    total: np.ndarray
    n1: np.ndarray
    n2: np.ndarray
    n3: np.ndarray
    d: tuple[float, float, float]  # discounts for counts 1, 2, >= 3


def modified_kn_discounts(counts) -> tuple[float, float, float]:
    """(D1, D2, D3+) of Chen & Goodman (1998) eq. 26 from the positive counts of one order; each clipped to [0, j]
    (a discount never exceeds the count it applies to). Missing count-of-counts (tiny corpora) give the single
    Ney et al. discount Y = n1 / (n1 + 2 n2) for all three, and 0.5 when even that is undefined."""
    c = np.asarray(counts, dtype=np.int64)
    n = [int(np.count_nonzero(c == j)) for j in (1, 2, 3, 4)]
    if n[0] == 0 or n[1] == 0:
        return (0.5, 0.5, 0.5)
    y = n[0] / (n[0] + 2 * n[1])
    if n[2] == 0 or n[3] == 0:
        return (y, y, y)
    d = (1 - 2 * y * n[1] / n[0], 2 - 3 * y * n[2] / n[1], 3 - 4 * y * n[3] / n[2])
    return tuple(float(np.clip(v, 0.0, j)) for v, j in zip(d, (1, 2, 3)))


def _discount_of(counts: np.ndarray, d: tuple[float, float, float]) -> np.ndarray:
    return np.where(counts >= 3, d[2], np.where(counts == 2, d[1], np.where(counts == 1, d[0], 0.0)))


def _stats(level: _Level, counts: np.ndarray, n_contexts: int, discount: float | None) -> _Stats:
    d = (discount,) * 3 if discount is not None else modified_kn_discounts(counts[counts > 0])
    pre = level.prefix

    def by_context(w):
        return np.bincount(pre, weights=w, minlength=n_contexts)

    return _Stats(by_context(counts), by_context((counts == 1).astype(float)),
                  by_context((counts == 2).astype(float)), by_context((counts >= 3).astype(float)), d)


@dataclass
class KneserNey:
    """Interpolated (modified) Kneser-Ney n-gram model of order `order` over a vocabulary of `vocab_size` ids."""

    order: int
    vocab_size: int
    discount: float | None = None  # None: modified KN (three discounts per order); a number: one fixed discount
    levels: list = field(default_factory=list)  # _Level per order 1..N
    raw_stats: list = field(default_factory=list)  # _Stats per order (raw counts: used when the order is the top)
    cont_stats: list = field(default_factory=list)  # _Stats per order < N (continuation counts)

    @classmethod
    def fit(cls, tokens, order: int, vocab_size: int, discount: float | None = None) -> "KneserNey":
        """Count every k-gram (k = 1..order) of `tokens` (a 1-D integer array, one document)."""
        t = np.asarray(tokens, dtype=np.int64)
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if len(t) < order:
            raise ValueError(f"{len(t)} training tokens cannot hold one {order}-gram")
        if t.min() < 0 or t.max() >= vocab_size:
            raise ValueError(f"token ids must lie in [0, {vocab_size}); got [{t.min()}, {t.max()}]")
        if discount is not None and not 0 < discount < 1:
            raise ValueError(f"a fixed discount must lie in (0, 1), got {discount}")
        m = cls(order, int(vocab_size), discount)
        ids = np.zeros(len(t), dtype=np.int64)  # id of the (k-1)-gram starting at each position (k = 1: empty)
        starts = []  # per order: one start position of each distinct k-gram
        for k in range(1, order + 1):
            n = len(t) - k + 1
            key = ids[:n] * m.vocab_size + t[k - 1:k - 1 + n]
            keys, first, inv, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
            m.levels.append(_Level(keys, counts.astype(float), keys // m.vocab_size))
            starts.append(first)
            ids = inv.reshape(-1)
        for k in range(1, order):  # continuation counts of order k from the distinct (k+1)-grams' suffixes
            nxt_first = starts[k]  # start positions of the distinct (k+1)-grams
            suffix_pos = nxt_first + 1  # their last k tokens start one later: a k-gram; find its id
            suffix_ids = m._ids_at(t, suffix_pos, k)
            m.levels[k - 1].cont = np.bincount(suffix_ids, minlength=len(m.levels[k - 1].keys)).astype(float)
        for k in range(1, order + 1):
            lv, n_ctx = m.levels[k - 1], (len(m.levels[k - 2].keys) if k > 1 else 1)
            m.raw_stats.append(_stats(lv, lv.raw, n_ctx, discount))
            if k < order:
                m.cont_stats.append(_stats(lv, lv.cont, n_ctx, discount))
        return m

    def _ids_at(self, t: np.ndarray, pos: np.ndarray, k: int) -> np.ndarray:
        """Ids at order k of the k-grams of `t` starting at `pos` (-1 where the k-gram was never seen in training or
        runs past the end of `t`)."""
        ids = np.zeros(len(pos), dtype=np.int64)
        for j in range(1, k + 1):
            p = pos + j - 1
            ok = (ids >= 0) & (p < len(t))
            key = ids * self.vocab_size + t[np.minimum(p, len(t) - 1)]
            keys = self.levels[j - 1].keys
            at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
            ids = np.where(ok & (keys[at] == key), at, -1)
        return ids

    def prob(self, tokens, targets, context_len, order: int | None = None) -> np.ndarray:
        """p(tokens[i] | the `context_len[i]` tokens before it, capped at order-1) for each i in `targets`, under
        the model of `order` (default: the fitted order; any lower order uses the same counts)."""
        t = np.asarray(tokens, dtype=np.int64)
        targets = np.asarray(targets, dtype=np.int64)
        n = self.order if order is None else int(order)
        if not 1 <= n <= self.order:
            raise ValueError(f"order {n} outside 1..{self.order}")
        top = np.minimum(np.asarray(context_len, dtype=np.int64) + 1, n)  # (M,) the order used per target
        out = np.empty(len(targets))
        for m in np.unique(top):
            sel = np.flatnonzero(top == m)
            out[sel] = self._prob_at_order(t, targets[sel], int(m))
        return out

    def _prob_at_order(self, t: np.ndarray, targets: np.ndarray, m: int) -> np.ndarray:
        """The order-m model (raw counts at order m, continuation counts below) at each target position."""
        p = np.full(len(targets), 1.0 / self.vocab_size)
        for k in range(1, m + 1):
            st = self.raw_stats[k - 1] if k == m else self.cont_stats[k - 1]
            counts = self.levels[k - 1].raw if k == m else self.levels[k - 1].cont
            start = targets - (k - 1)
            g = self._ids_at(t, start, k)  # (M,) the k-gram (context + target), -1 if unseen
            h = self._ids_at(t, start, k - 1) if k > 1 else np.zeros(len(targets), dtype=np.int64)
            seen_h = h >= 0
            hh = np.where(seen_h, h, 0)
            total = np.where(seen_h, st.total[hh], 0.0)
            c = np.where(g >= 0, counts[np.maximum(g, 0)], 0.0)
            gamma = (st.d[0] * st.n1[hh] + st.d[1] * st.n2[hh] + st.d[2] * st.n3[hh])
            with np.errstate(divide="ignore", invalid="ignore"):
                here = (np.maximum(c - _discount_of(c, st.d), 0.0) + gamma * p) / total
            p = np.where(total > 0, here, p)
        return p


# ------------------------------------------------------------------------------------------------- scoring
def window_targets(n_val: int, block_size: int, n_windows: int) -> tuple[np.ndarray, np.ndarray]:
    """(target positions in the val split, context available to each) of the val windows of ablations.data."""
    hi = n_val - block_size - 1
    n = max(1, min(int(n_windows), hi // block_size + 1))
    starts = np.unique(np.linspace(0, hi, n).astype(np.int64))  # == ablations.data.val_starts
    offs = np.arange(1, block_size + 1)  # targets are w[1:] of each window of block_size + 1 tokens
    return (starts[:, None] + offs[None, :]).reshape(-1), np.tile(offs, len(starts))


def full_targets(n_val: int) -> tuple[np.ndarray, np.ndarray]:
    pos = np.arange(1, n_val, dtype=np.int64)
    return pos, pos


def floor_bpb(train, val, vocab_size: int, tokens_per_byte: float, orders=(1, 2, 3, 4, 5), targets=None,
              discount: float | None = None) -> dict[int, float]:
    """bpb of the order-n model for each n in `orders` on `val` (targets = (positions, context lengths); default
    every val token after the first): mean -log2 p over the targets times tokens per byte, as val/bpb."""
    pos, ctx = targets if targets is not None else full_targets(len(val))
    model = KneserNey.fit(train, max(orders), vocab_size, discount)
    val = np.asarray(val, dtype=np.int64)
    return {int(n): float(-np.mean(np.log2(model.prob(val, pos, ctx, n))) * tokens_per_byte) for n in orders}
