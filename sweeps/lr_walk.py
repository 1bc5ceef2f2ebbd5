"""The lean lr stage (`verdict.lr.search: walk`, issue 36): instead of every lr of a grid at two seeds, one seed per
probe walking by a constant ratio from a start (an arm: the baseline's chosen lr; the baseline: the middle of its
grid) toward the better neighbour until a local minimum, then the second seed at the best and, only when its better
neighbour's one seed is below the best's two-seed mean (the best's first seed may have been lucky), at that
neighbour; the lowest two-seed mean wins. Replayed on the known-results store (reports/cheaper-verdicts/): 36.5 of
64 runs, every arm's lr within 0.0042 bpb of the exhaustive choice; one seed alone is not enough (issue 36)."""
from __future__ import annotations

from typing import Callable

REACH = 6  # the walk goes at most ratio**6 (64x at ratio 2) from its start


def walk(value: Callable[[float, tuple[int, ...]], float | None], start: float, ratio: float, first: int,
         second: int, reverse_first: bool = False) -> float:
    """The chosen lr. value(lr, seeds) is the mean final val bpb of the runs of lr at those seeds (running them when
    needed; +inf when one failed; None when that lr cannot be run, e.g. a replay's store lacks it). reverse_first:
    probe the start and its two neighbours in the reverse order (a second worker then runs one of them beside the
    first worker's instead of waiting on it); the three are probed either way, so the choice is the same."""
    one: dict[int, float] = {}  # probe j (lr = start * ratio**j) -> its first seed's value

    def probe(j: int) -> None:
        if j not in one and abs(j) <= REACH:
            v = value(start * ratio**j, (first,))
            if v is not None:
                one[j] = v

    for j in ((1, -1, 0) if reverse_first else (0, -1, 1)):
        probe(j)
    j, side = 0, [k for k in (-1, 1) if k in one]
    if side:
        step = min(side, key=one.get)  # toward the better neighbour
        while j + step in one and one[j + step] < one[j]:
            j += step
            probe(j + step)
    two = {j: value(start * ratio**j, (first, second))}
    near = [k for k in (j - 1, j + 1) if k in one]
    if near and one[min(near, key=one.get)] < two[j]:
        nb = min(near, key=one.get)
        two[nb] = value(start * ratio**nb, (first, second))
    return start * ratio ** min(two, key=two.get)
