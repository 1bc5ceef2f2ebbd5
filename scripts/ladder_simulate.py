"""How often the ladder's trend statistics (analysis/ladder.py) err, by simulation: the held-out size's 95% prediction
interval (its coverage) and the slope test at 0.05 (its rate of false trends, and its power), with φ floored at 1
(the report's rule) and without a floor (textbook weighted least squares). docs/ladder.md, "Error rates", prints
the output.

    python scripts/ladder_simulate.py --studies 4000

Each simulated study: five sizes at log2 N = 15 .. 19, `n` seeds per arm and per baseline at each size, normal seed
noise with an sd that differs by size (0.008 bpb times 1.5, 1, 0.7, 1.2, 1), and optionally a random effect per size
of sd tau shared by its seeds (what the lr chosen at that size, or a curve that is not a line in log N, adds). Δ is
the difference of the two means, var(Δ) Welch's standard error squared from the seeds, as in the report. Coverage:
the trend over the first four sizes predicts the fifth (true slope −0.005 per doubling). Power: the slope's t-test on
the trend over all five sizes of that study. False trends: the same test in another study whose true slope is 0 (one
arm, no Holm).
"""
import argparse

import numpy as np

from analysis.ladder import fit_trend

X = np.arange(15.0, 20.0)
SD = 0.008 * np.array([1.5, 1.0, 0.7, 1.2, 1.0])


def study(rng, n: int, tau: float, slope: float) -> tuple[np.ndarray, np.ndarray]:
    """(Δ, var Δ) at the five sizes of one simulated study."""
    a = rng.normal(0.0, 1.0, (5, n)) * SD[:, None]
    b = rng.normal(0.0, 1.0, (5, n)) * SD[:, None]
    delta = slope * (X - 15) + a.mean(1) - b.mean(1) + rng.normal(0.0, tau, 5)
    return delta, a.var(1, ddof=1) / n + b.var(1, ddof=1) / n


def rates(n: int, tau: float, floor: float, studies: int, seed: int = 0) -> tuple[float, float, float]:
    """(coverage of the held-out prediction interval, power, rate of false trends) over `studies` simulated
    studies (the same draws for every floor)."""
    rng = np.random.default_rng(seed)
    covered = found = false = 0
    for _ in range(studies):
        d, v = study(rng, n, tau, -0.005)
        _, lo, hi = fit_trend(X[:4], d[:4], v[:4], floor=floor).prediction(X[4], v[4])
        covered += lo <= d[4] <= hi
        found += fit_trend(X, d, v, floor=floor).p_value < 0.05
        d, v = study(rng, n, tau, 0.0)
        false += fit_trend(X, d, v, floor=floor).p_value < 0.05
    return covered / studies, found / studies, false / studies


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=4000)
    args = parser.parse_args(argv)
    half = 1.96 * (0.05 * 0.95 / args.studies) ** 0.5
    print(f"{args.studies} studies per row; Monte Carlo 95% half-width at a 5% rate: ±{half:.3f}\n")
    print("| seeds per arm | tau (between sizes) | φ | coverage of the 95% PI | power (slope −0.005) | "
          "false trends at 0.05 |")
    print("|---|---|---|---|---|---|")
    for n in (4, 12):
        for tau in (0.0, 0.004):
            for floor, name in ((1.0, "max(1, Q/(k − 2))"), (0.0, "Q/(k − 2)")):
                cov, power, false = rates(n, tau, floor, args.studies)
                print(f"| {n} | {tau:g} | {name} | {cov:.3f} | {power:.3f} | {false:.3f} |")


if __name__ == "__main__":
    main()
