"""The replay of cheaper verdicts on a committed store (sweeps/replay.py): the lean lr walk on hand-made loss curves
(known answers: where it stops, how many runs it makes, when the second seed goes to a neighbour), the sequential
seeds stage on a hand-made study (a 20-sd effect is decided at the first look, each run costs its own wall time), and
the committed report regenerating byte for byte."""
from __future__ import annotations

import filecmp
import sys

import numpy as np
import pytest

from sweeps import replay
from analysis import sequential as q


def _points(curve: dict) -> dict:
    """{lr: {seed: (bpb, wall)}} from {lr: (seed-100 bpb, seed-101 bpb)}, each run 60 s."""
    return {lr: {100: (a, 60.0), 101: (b, 60.0)} for lr, (a, b) in curve.items()}


def test_the_walk_goes_toward_the_better_neighbour_and_stops_at_a_local_minimum():
    # both neighbours of the start beat it; the right one more: the walk goes right, to 8e-3, and stops when 1.6e-2
    # is worse; 2e-3 and 3.2e-2 are never run
    curve = {1e-3: (2.60, 2.60), 2e-3: (2.50, 2.50), 4e-3: (2.55, 2.55), 8e-3: (2.40, 2.40), 1.6e-2: (2.45, 2.45),
             3.2e-2: (2.90, 2.90)}
    lr, ran = replay.walk(_points(curve), 4e-3, 100, 101)
    assert lr == 8e-3
    assert sorted(ran) == [(2e-3, 100), (4e-3, 100), (8e-3, 100), (8e-3, 101), (1.6e-2, 100)]


def test_the_second_seed_goes_to_the_neighbour_only_when_the_best_was_lucky():
    lucky = {1e-3: (2.50, 2.50), 2e-3: (2.38, 2.46), 4e-3: (2.41, 2.41), 8e-3: (2.60, 2.60)}
    lr, ran = replay.walk(_points(lucky), 2e-3, 100, 101)  # 2e-3's two-seed mean 2.42 > 4e-3's one seed 2.41
    assert lr == 4e-3 and (4e-3, 101) in ran and len(ran) == 5
    honest = {**lucky, 2e-3: (2.38, 2.39)}
    lr, ran = replay.walk(_points(honest), 2e-3, 100, 101)
    assert lr == 2e-3 and len(ran) == 4


def test_a_clear_effect_stops_at_the_first_look_and_costs_its_own_runs():
    rng = np.random.default_rng(0)
    n = 9
    st = replay.Study("t", "base", ["far", "null"], 0.02, values=np.stack([rng.normal(-0.2, 0.01, n),
                                                                             rng.normal(0.0, 0.01, n)]),
                      base=rng.normal(0.0, 0.01, n), wall=np.array([[10.0] * n, [20.0] * n, [30.0] * n]),
                      seeds=list(range(n)), lr={}, lr_seeds=[100, 101])
    design = q.Design(3, 3, n, "pocock", 0.05)
    orders = np.stack([rng.permutation(n) for _ in range(50)])
    r = replay.replay_seeds(st, design, orders)
    assert (r["codes"][:, 0] == q.BETTER).all() and (r["seeds"][:, 0] == 3).all()
    assert (r["baseline_seeds"] == r["seeds"].max(1)).all()
    assert r["core_s"] == pytest.approx(10.0 * r["seeds"][:, 0] + 20.0 * r["seeds"][:, 1] + 30.0 * r["baseline_seeds"])


@pytest.mark.slow
def test_the_committed_report_regenerates_byte_for_byte(tmp_path):
    assert replay.main(["--out", str(tmp_path)]) == 0
    assert filecmp.cmp(tmp_path / "index.md", replay.REPO / "reports/cheaper-verdicts/index.md", shallow=False)


@pytest.mark.parametrize("curve", [
    {1e-3: (2.60, 2.60), 2e-3: (2.50, 2.50), 4e-3: (2.55, 2.55), 8e-3: (2.40, 2.40), 1.6e-2: (2.45, 2.45)},
    {1e-3: (2.50, 2.50), 2e-3: (2.38, 2.46), 4e-3: (2.41, 2.41), 8e-3: (2.60, 2.60)}])
def test_a_second_workers_order_runs_the_same_probes_and_chooses_the_same_lr(curve):
    """sweeps.verdict's second worker walks with reverse_first (its first probe beside the first worker's) and
    starts the arms at its own share (worker_order): the same lr and the same set of runs, in another order."""
    from sweeps.lr_walk import walk
    from sweeps.verdict import worker_order

    def runner(log):
        def value(lr, seeds):
            log.extend((lr, s) for s in seeds)
            return sum(curve[lr][s - 100] for s in seeds) / len(seeds)
        return value

    start = 4e-3 if 1.6e-2 in curve else 2e-3
    first, second = [], []
    assert walk(runner(first), start, 2.0, 100, 101) == walk(runner(second), start, 2.0, 100, 101, reverse_first=True)
    assert first[:3] != second[:3] and set(first) == set(second)
    arms = list("abcdefg")
    assert worker_order(arms, 0, 2) == arms and worker_order(arms, 1, 2) == list("defgabc")
    assert worker_order(arms, 0, 1) == arms and sorted(worker_order(arms, 2, 3)) == arms
