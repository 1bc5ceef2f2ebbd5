"""The n-gram floor (ablations/ngram.py, analysis/floor.py): interpolated Kneser-Ney against probabilities counted
by hand, the modified-KN discounts of Chen & Goodman (1998) eq. 26, a plain-dict reference implementation, the
val targets of ablations.data, and the CLI logging a floor that find_floor reads back."""
from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from ablations.ngram import KneserNey, floor_bpb, full_targets, modified_kn_discounts, window_targets
from sweeps.floor import main

# a b a c a b b a c a  (a=0, b=1, c=2): bigrams ab ba ac ca ab bb ba ac ca
CORPUS = np.array([0, 1, 0, 2, 0, 1, 1, 0, 2, 0])

# Counted by hand, interpolated KN with one discount D = 0.75, V = 3.
# Unigram continuation counts N1+(.w): a 2 (after b, c), b 2 (after a, b), c 1 (after a); total 5; 3 types:
#   gamma = 0.75 * 3 / 5 = 0.45; p1(a) = 1.25/5 + 0.45/3 = 0.40, p1(b) = 0.40, p1(c) = 0.25/5 + 0.15 = 0.20.
# Bigram, raw counts: after a: ab 2, ac 2 (c(a.) = 4, gamma = 0.75*2/4 = 0.375);
#   after b: ba 2, bb 1 (3, gamma 0.5); after c: ca 2 (2, gamma 0.375).
HAND_BIGRAM = {  # (context, word) -> p
    (0, 0): 0.375 * 0.40, (0, 1): 1.25 / 4 + 0.375 * 0.40, (0, 2): 1.25 / 4 + 0.375 * 0.20,
    (1, 0): 1.25 / 3 + 0.5 * 0.40, (1, 1): 0.25 / 3 + 0.5 * 0.40, (1, 2): 0.5 * 0.20,
    (2, 0): 1.25 / 2 + 0.375 * 0.40, (2, 1): 0.375 * 0.40, (2, 2): 0.375 * 0.20,
}
# Unigram model (order 1, raw counts a 5, b 3, c 2 of 10): gamma = 0.75*3/10 = 0.225, + 0.075 each.
HAND_UNIGRAM = {0: 4.25 / 10 + 0.075, 1: 2.25 / 10 + 0.075, 2: 1.25 / 10 + 0.075}


def _p(model, context: list[int], word: int, order=None) -> float:
    stream = np.array([*context, word])
    return float(model.prob(stream, [len(context)], [len(context)], order)[0])


def test_bigram_kn_matches_hand_counts():
    m = KneserNey.fit(CORPUS, 2, 3, discount=0.75)
    for (h, w), want in HAND_BIGRAM.items():
        assert _p(m, [h], w) == pytest.approx(want, abs=1e-12), (h, w)
    assert HAND_BIGRAM[(1, 0)] == pytest.approx(0.616667, abs=1e-6)  # the arithmetic above, once by hand
    for w, want in HAND_UNIGRAM.items():
        assert _p(m, [], w) == pytest.approx(want, abs=1e-12)  # no context: the order-1 model (raw counts)
        assert _p(m, [2, 1], w, order=1) == pytest.approx(want, abs=1e-12)


def test_unseen_context_falls_back_to_the_lower_order():
    # vocabulary of 4: token 3 never occurs, so its context is unseen and the bigram model gives p1(w)
    m = KneserNey.fit(CORPUS, 2, 4, discount=0.75)
    gamma0 = 0.75 * 3 / 5
    p1 = {0: 1.25 / 5 + gamma0 / 4, 1: 1.25 / 5 + gamma0 / 4, 2: 0.25 / 5 + gamma0 / 4, 3: gamma0 / 4}
    for w, want in p1.items():
        assert _p(m, [3], w) == pytest.approx(want, abs=1e-12)
    assert sum(p1.values()) == pytest.approx(1.0)


def test_modified_discounts_chen_goodman_eq26():
    # n1 = 4, n2 = 2, n3 = 1, n4 = 1: Y = 4 / (4 + 4) = 0.5; D1 = 1 - 2*0.5*2/4 = 0.5; D2 = 2 - 3*0.5*1/2 = 1.25;
    # D3+ = 3 - 4*0.5*1/1 = 1.0
    assert modified_kn_discounts([1, 1, 1, 1, 2, 2, 3, 4, 7]) == pytest.approx((0.5, 1.25, 1.0))
    assert modified_kn_discounts([1, 1, 2]) == pytest.approx((0.5, 0.5, 0.5))  # no n3, n4: Y = 2/(2+2) for all


def _reference_kn(tokens, order, vocab, context, word):
    """Modified interpolated KN written from the formulas with dicts of tuples (slow, independent of the numpy
    id machinery)."""
    tokens = list(map(int, tokens))
    raw = [Counter(tuple(tokens[i:i + k]) for i in range(len(tokens) - k + 1)) for k in range(1, order + 1)]
    cont = []
    for k in range(1, order):
        left = defaultdict(set)
        for g in raw[k]:  # (k+1)-grams
            left[g[1:]].add(g[0])
        cont.append({g: len(s) for g, s in left.items()})

    def p(k, ctx, top):
        lower = 1.0 / vocab if k == 1 else p(k - 1, ctx[1:], False)
        counts = raw[k - 1] if top else cont[k - 1]
        d = modified_kn_discounts([c for c in counts.values() if c > 0])
        ext = {g: c for g, c in counts.items() if g[:-1] == tuple(ctx) and c > 0}
        total = sum(ext.values())
        if total == 0:
            return lower
        disc = lambda c: d[min(c, 3) - 1]  # noqa: E731
        gamma = sum(disc(c) for c in ext.values()) / total
        c = ext.get((*ctx, word), 0)
        return max(c - disc(c), 0) / total + gamma * lower if c else gamma * lower

    n = min(order, len(context) + 1)
    return p(n, list(context[len(context) - n + 1:]) if n > 1 else [], True)


def test_modified_kn_matches_a_dict_reference_and_sums_to_one():
    rng = np.random.default_rng(0)
    train = rng.choice(5, size=400, p=[0.4, 0.25, 0.2, 0.1, 0.05])
    m = KneserNey.fit(train, 3, 6)  # token 5 never seen
    for ctx in ([], [0], [4], [5], [1, 2], [3, 3], [5, 0], [0, 5], [2, 2, 1]):
        probs = [_p(m, list(ctx), w) for w in range(6)]
        assert sum(probs) == pytest.approx(1.0, abs=1e-12), ctx
        for w in range(6):
            assert probs[w] == pytest.approx(_reference_kn(train, 3, 6, ctx, w), abs=1e-12), (ctx, w)


def test_window_targets_are_the_runs_val_targets():
    from ablations.data import val_starts

    pos, ctx = window_targets(1000, 64, 8)
    starts = val_starts(1000, 64, 8)
    assert pos.reshape(len(starts), 64)[:, 0].tolist() == (starts + 1).tolist()  # targets w[1:] of each window
    assert ctx.reshape(len(starts), 64)[0].tolist() == list(range(1, 65))  # context: the window's tokens before it
    assert full_targets(5)[0].tolist() == [1, 2, 3, 4]


def test_floor_bpb_orders_improve_on_structured_text():
    text = np.array(list(b"the cat sat on the mat. " * 40))
    bpb = floor_bpb(text[:800], text[800:], 256, 1.0, orders=(1, 2, 3))
    assert bpb[1] > bpb[2] > bpb[3]
    assert bpb[3] < 0.5  # a repeated sentence is near-deterministic after two characters


def test_cli_logs_a_floor_that_reports_find(tmp_path, capsys):
    from analysis.floor import find_floor

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("to be or not to be, that is the question.\n" * 60)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    args = [f"data=text", f"data.path={corpus}", "tokenizer=char", "model.block_size=16", "data.val_windows=4",
            f"data.cache_dir={tmp_path}/cache", "orders=[1,2,3]", "log=true", f"tracking.uri={uri}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "order 3:" in out and "logged: run" in out
    from ablations.tracking import client as open_store  # a new store: the migrated template

    cl = open_store(uri)
    (run,) = cl.search_runs([cl.get_experiment_by_name("ngram-floor").experiment_id])
    fp = run.data.tags["floor.data_fingerprint"]
    assert fp == run.data.tags["data_fingerprint"] and len(fp) >= 16
    floor = find_floor(uri, fp, "char", 16, 4)
    assert floor is not None and sorted(floor.bpb) == [1, 2, 3] and floor.scope == "windows"
    assert floor.n_targets == str(4 * 16)
    assert find_floor(uri, "another-fingerprint", "char", 16, 4) is None


def test_cli_bad_option_is_one_line(capsys):
    assert main(["orders=[0,9]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "orders" in err[0]
