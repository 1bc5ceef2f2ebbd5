"""How the bench times work. The machine is shared and noisy: items are timed side by side in interleaved rounds
(A B C A B C ...), so ratios between them compare figures taken under the same load; a paired ratio is summarised
per round (`ratio_summary`)."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from statistics import median

from ablations.inference_timing import sync


def interleaved(items: dict[str, Callable[[], float]], seconds: float, rounds: int, device: str = "cpu",
                warmup: int = 1) -> dict[str, dict]:
    """Measure the rate of each item side by side: `rounds` rounds, each giving every item about `seconds`.

    items: name -> fn() that does one unit of work and returns its amount (tokens, FLOPs, bytes). Returns name ->
    {"best": amount/sec of the fastest call, "best_round": of the best round, "median": median of the rounds}.
    Interleaving puts every item through the same phases of other people's load. On a shared machine with several
    threads, one descheduled thread stalls every parallel region (a 7 ms step can take 400 ms), so the fastest call
    is the best estimate of an idle machine; it is what the table shows, for peaks and workloads alike.
    """
    for fn in items.values():
        for _ in range(warmup):
            fn()
    sync(device)
    rounds_rate: dict[str, list[float]] = {name: [] for name in items}
    best: dict[str, float] = {name: 0.0 for name in items}
    for _ in range(rounds):
        for name, fn in items.items():
            amount, t0 = 0.0, time.perf_counter()
            while True:
                t_call = time.perf_counter()
                a = fn()
                sync(device)
                now = time.perf_counter()
                amount += a
                best[name] = max(best[name], a / (now - t_call))
                if now - t0 >= seconds:
                    break
            rounds_rate[name].append(amount / (now - t0))
    return {name: {"best": best[name], "best_round": max(r), "median": sorted(r)[len(r) // 2]}
            for name, r in rounds_rate.items()}


def fixed_steps(items: dict[str, Callable[[], float]], steps: int, device: str = "cpu") -> dict[str, dict]:
    """A dry run: one warm-up call, then `steps` calls of each item, no rounds; the same result shape as
    `interleaved`."""
    res = {}
    for name, fn in items.items():
        fn()  # warm-up (and compile)
        sync(device)
        t0 = time.perf_counter()
        amount = sum(fn() for _ in range(steps))
        sync(device)
        rate = amount / (time.perf_counter() - t0)
        res[name] = {"best": rate, "best_round": rate, "median": rate}
    return res


def best_time(fn: Callable[[], object], reps: int, device: str = "cpu") -> float:
    """Fastest of `reps` timed calls of fn() (after one untimed call), in seconds."""
    fn()
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def best_rate(fn: Callable[[], float], device: str, calls: int = 3) -> float:
    """The fastest of `calls` calls of fn() (a ceiling: the machine at its least disturbed), amount/sec."""
    best = 0.0
    for _ in range(calls):
        sync(device)
        t0 = time.perf_counter()
        a = fn()
        sync(device)
        best = max(best, a / (time.perf_counter() - t0))
    return best


def timed_rate(fn: Callable[[], float], seconds: float, device: str) -> float:
    """Amount per second of repeated fn() calls (each returns its amount) over at least `seconds`, >= 1 call."""
    sync(device)
    amount, t0 = 0.0, time.perf_counter()
    while True:
        amount += fn()
        sync(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return amount / elapsed


def mean_interval(values: list[float]) -> tuple[float, float | None]:
    """(mean, half-width of its 95% t interval) over rounds; the half-width is None with one round."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def ratio_summary(reference, arm) -> dict:
    """Paired per-round ratios arm/reference: their geometric mean and a 95% t interval on the log ratios.

    reference, arm: tokens/s of the same rounds. With one round there is no interval (None)."""
    per_round = [a / r for r, a in zip(reference, arm, strict=True)]
    mean, half = mean_interval([math.log(v) for v in per_round])
    out = {"ratio": math.exp(mean), "ratio_ci_low": None, "ratio_ci_high": None, "ratio_median": median(per_round),
           "ratio_per_round": per_round}
    if half is not None:
        out.update(ratio_ci_low=math.exp(mean - half), ratio_ci_high=math.exp(mean + half))
    return out
