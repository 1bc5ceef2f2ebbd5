"""Group-sequential verdicts: seeds added in batches, each comparison stopped once it is decided.

The design (`Design`, the verdict file's `sequential:` block, fixed before any run): the seeds per arm at the first
look, the seeds added per look, the cap, the alpha-spending function and alpha. Look k has n_k seeds per arm (and
the baseline as many, as long as some comparison is open); its information fraction is t_k = n_k / cap (Welch's
information about a difference with n seeds per side is proportional to n).

**Boundaries** (`boundaries`): Lan & DeMets (1983) alpha spending. The error spent up to information t is
alpha(t): O'Brien-Fleming type 2 - 2 Phi(z_{1-alpha/2} / sqrt t), Pocock type alpha ln(1 + (e - 1) t). Look k's
critical value c_k solves P(no crossing before k, crossing at k) = alpha(t_k) - alpha(t_{k-1}) under the canonical
joint distribution of the z statistics (Z_j, Z_k correlated sqrt(t_j / t_k); Jennison & Turnbull 2000, ch. 3 and 7),
found by the recursive numerical integration of their ch. 19: the sub-density of the continuing paths is carried
from look to look on a grid (Simpson's rule) and the crossing probability integrated against it.

**Small seed counts** (`nominal_levels`): each c_k is turned into the nominal level of its look (2 (1 - Phi(c_k))
two-sided, 1 - Phi(c_k) one-sided) and the look's Welch p-value (t at that look's Welch-Satterthwaite df) is compared
with it, i.e. the boundary becomes the t quantile at that look's degrees of freedom. Comparing the t statistic with
the normal c_k instead was measured at a family-wise error of 0.11 with 3 seeds at the first look (issue 36);
`simulate(..., reference="normal")` reproduces that error.

**The family** (`decide`). Comparison i (arm i against the shared baseline) has two hypotheses: D_i, no difference
(two-sided Welch test), and E_i, a difference of at least the margin (TOST, each one-sided test at the level). At most
one of them is true, so one family covers both: every unrejected hypothesis of comparison i is tested at alpha / r,
r the number of comparisons with a hypothesis still unrejected (a comparison leaves the count, and its share of alpha
is recycled to the others, only once both of its hypotheses are rejected). Proof of family-wise error <= alpha: let
t <= m be the number of true hypotheses (at most one per comparison); until the first true one is rejected, every
comparison holding a true hypothesis is counted in r, so r >= t and that rejection needed its statistic to cross the
alpha / t boundary; each true hypothesis does so with probability <= alpha / t, so the union over the t of them has
probability <= alpha. Rejections are group-sequential in the sense of Maurer & Bretz (2013): a level raised by
recycling re-tests a hypothesis at every look it has data for, against the boundaries of the new level (boundaries
only fall as the level rises, so the argument above holds look by look). Today's fixed rule runs two separate Holm
families (differences, equivalences), each at alpha, and can reject some true hypothesis in up to ~2 alpha of
studies when nulls of both kinds are present (`simulate` prints it as `fixed`).

A comparison stops at the first look where either of its hypotheses is rejected, or at the cap (inconclusive at the
cap). Its verdict: equivalent within ±margin if E_i is rejected, else better / worse (the sign of the difference at
the look D_i was rejected) if D_i is, else inconclusive.

Everything here is numpy / scipy and vectorised over simulated studies: `simulate` draws normal seeds for every
arm of `studies` studies at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from modules.errors import ConfigError

SPENDING = ("obrien-fleming", "pocock")
GRID = 801  # Simpson points per look (odd); boundaries agree with 1,601 points to < 1e-6


# --------------------------------------------------------------------------------------------- design
@dataclass(frozen=True)
class Design:
    first: int       # seeds per arm at the first look
    batch: int       # seeds added per look
    cap: int         # most seeds per arm: a comparison still open here is inconclusive at the cap
    spending: str    # SPENDING
    alpha: float     # family-wise error of the one family (differences and equivalences)

    def looks(self) -> tuple[int, ...]:
        """Seeds per arm at each look: first, first + batch, ... and the cap (the last look, even if a short batch)."""
        n = list(range(self.first, self.cap, self.batch))
        return tuple([*n, self.cap])

    def fractions(self) -> tuple[float, ...]:
        return tuple(n / self.cap for n in self.looks())

    def text(self) -> str:
        looks = ", ".join(str(n) for n in self.looks())
        return (f"sequential: seeds per arm at looks {looks} (first {self.first}, batch {self.batch}, cap "
                f"{self.cap}); {self.spending} alpha spending (Lan-DeMets), alpha {self.alpha:g} over one family of "
                "differences and equivalences")

    def tags(self) -> dict[str, str]:
        return {"verdict.sequential.first": str(self.first), "verdict.sequential.batch": str(self.batch),
                "verdict.sequential.cap": str(self.cap), "verdict.sequential.spending": self.spending,
                "verdict.sequential.alpha": f"{self.alpha:g}"}


def design_from(raw, where: str = "verdict.sequential") -> Design:
    """A Design from the verdict file's mapping, every key checked (ConfigError: one line naming it)."""
    if not hasattr(raw, "get"):
        raise ConfigError(f"invalid {where}={raw!r}: expected {{first, batch, cap, spending, alpha}}")
    unknown = sorted(set(raw) - {"first", "batch", "cap", "spending", "alpha"})
    if unknown:
        raise ConfigError(f"invalid {where}.{unknown[0]}: unknown key; a design has first, batch, cap, spending, alpha")
    ints = {}
    for key, low in (("first", 2), ("batch", 1), ("cap", 2)):
        v = raw.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(f"invalid {where}.{key}={v!r}: expected an integer >= {low}")
        ints[key] = v
    if ints["cap"] < ints["first"]:
        raise ConfigError(f"invalid {where}.cap={ints['cap']}: below the first batch ({where}.first={ints['first']}); "
                          "raise the cap or lower the first batch")
    spending = raw.get("spending", "obrien-fleming")
    if spending not in SPENDING:
        raise ConfigError(f"invalid {where}.spending={spending!r}: choose one of {', '.join(SPENDING)}")
    alpha = raw.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ConfigError(f"invalid {where}.alpha={alpha!r}: expected a number in (0, 1), e.g. 0.05")
    return Design(ints["first"], ints["batch"], ints["cap"], spending, float(alpha))


# --------------------------------------------------------------------------------------------- boundaries
def spent(spending: str, t, alpha: float) -> np.ndarray:
    """Cumulative error spent by information fraction t (Lan & DeMets 1983)."""
    from scipy import stats

    t = np.asarray(t, dtype=float)
    if spending == "obrien-fleming":
        with np.errstate(divide="ignore"):
            return 2 * stats.norm.sf(stats.norm.isf(alpha / 2) / np.sqrt(t))
    if spending == "pocock":
        return alpha * np.log1p((math.e - 1) * t)
    raise ConfigError(f"invalid spending function {spending!r}: choose one of {', '.join(SPENDING)}")


def _simpson(a: float, b: float, n: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    """Points and weights of the composite Simpson rule on [a, b] with n (odd) points."""
    z = np.linspace(a, b, n)
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return z, w * (b - a) / (n - 1) / 3


def crossing(bounds, fractions, sides: int) -> np.ndarray:
    """P(the first crossing is at look k), k = 1..K, under the null, for z boundaries `bounds` (two-sided: |Z_k| >=
    c_k; one-sided: Z_k >= c_k): the recursive integration, one look at a time."""
    out, grid = [], None
    for k, c in enumerate(bounds):
        out.append(_cross(grid, fractions, k, float(c), sides))
        grid = _carry(grid, fractions, k, float(c), sides)
    return np.asarray(out)


def _cross(grid, fractions, k: int, c: float, sides: int) -> float:
    """P(continue to look k, then cross c_k). `grid` is (points, Simpson weights, sub-density) of the paths that
    continued past look k - 1 (None at the first look)."""
    from scipy.special import ndtr

    if grid is None:
        return float(ndtr(-c) * sides)
    u, wu, g = grid
    ik, ij = fractions[k], fractions[k - 1]
    sd = math.sqrt(ik - ij)
    # Z_k sqrt(I_k) = Z_{k-1} sqrt(I_{k-1}) + N(0, I_k - I_{k-1})
    p = ndtr(-(c * math.sqrt(ik) - u * math.sqrt(ij)) / sd)  # the normal tail
    if sides == 2:
        p = p + ndtr((-c * math.sqrt(ik) - u * math.sqrt(ij)) / sd)
    return float((wu * g) @ p)


def _normal_pdf(x: np.ndarray) -> np.ndarray:
    """The standard normal density, the formula scipy.stats.norm.pdf evaluates (the same floats), without its
    per-call argument handling: the boundaries' grids call it hundreds of times (about a third of a replay's time)."""
    return np.exp(-x ** 2 / 2.0) / np.sqrt(2 * np.pi)


def _carry(grid, fractions, k: int, c: float, sides: int):
    """The sub-density of the paths continuing past look k (inside (-c_k, c_k), or below c_k one-sided), on its grid."""
    low = -c if sides == 2 else -12.0  # one-sided: no lower boundary (the mass below -12 is < 1e-32)
    z, w = _simpson(low, c)
    if grid is None:
        return z, w, _normal_pdf(z)
    u, wu, g = grid
    ik, ij = fractions[k], fractions[k - 1]
    sd = math.sqrt(ik - ij)
    kernel = _normal_pdf((z[:, None] * math.sqrt(ik) - u[None, :] * math.sqrt(ij)) / sd) * math.sqrt(ik) / sd
    return z, w, kernel @ (wu * g)  # (N,)


@lru_cache(maxsize=256)
def boundaries(fractions: tuple[float, ...], alpha: float, spending: str, sides: int) -> tuple[float, ...]:
    """z boundaries c_1..c_K of the spending design at information fractions (increasing, the last 1). Look k spends
    sides x (alpha(t_k) - alpha(t_{k-1})) with the spending function at alpha / sides per side (the convention of
    Reboussin et al. 2000 and gsDesign: a two-sided test at 0.05 is two one-sided ones at 0.025), solved for c_k by
    brentq given the looks before it."""
    from scipy import optimize, stats

    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, got {sides}")
    cum = sides * spent(spending, fractions, alpha / sides)
    out, grid = [], None
    for k in range(len(fractions)):
        target = float(cum[k] - (cum[k - 1] if k else 0.0))
        if target <= 1e-300:  # nothing to spend at this look: no crossing possible
            c = 40.0
        elif grid is None:
            c = float(stats.norm.isf(target / sides))
        else:
            c = optimize.brentq(lambda x: _cross(grid, fractions, k, x, sides) - target, 0.01, 40.0, xtol=1e-12)
        out.append(c)
        grid = _carry(grid, fractions, k, c, sides)
    return tuple(out)


def nominal_levels(design: Design, alpha: float, sides: int) -> np.ndarray:
    """The nominal p-value each look rejects at (K,): the z boundary's tail, the same p then read from the look's
    own t distribution (so the boundary is the t quantile at that look's degrees of freedom)."""
    from scipy import stats

    c = np.asarray(boundaries(design.fractions(), float(alpha), design.spending, sides))
    return sides * stats.norm.sf(c)


def level_table(design: Design, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(two-sided, one-sided) nominal levels, each (m + 1, K): row r is the design at alpha / r (row 0 unused)."""
    two = np.zeros((m + 1, len(design.looks())))
    one = np.zeros_like(two)
    for r in range(1, m + 1):
        two[r] = nominal_levels(design, design.alpha / r, 2)
        one[r] = nominal_levels(design, design.alpha / r, 1)
    return two, one


# --------------------------------------------------------------------------------------------- decisions
@dataclass
class Decisions:
    stop: np.ndarray         # (S, m) the look (0-based) each comparison stopped at
    reject_diff: np.ndarray  # (S, m) D_i rejected (a difference shown)
    reject_equiv: np.ndarray  # (S, m) E_i rejected (equivalence within the margin shown)
    diff_look: np.ndarray    # (S, m) the look whose data rejected D_i (-1: not rejected)
    equiv_look: np.ndarray   # (S, m) the look whose data rejected E_i (-1: not rejected)
    diff_row: np.ndarray     # (S, m) r when D_i was rejected: it crossed the design's boundary at alpha / r (0: not)
    equiv_row: np.ndarray    # (S, m) the same for E_i


def _earliest(p: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """(m + 1, S, m): the first look whose p is at or below the level of row r (K: none). p (S, m, K), NaN: no data."""
    K = p.shape[-1]
    hit = p[None] <= levels[:, None, None, :]  # (m + 1, S, m, K); NaN compares False
    return np.where(hit.any(-1), hit.argmax(-1), K)


def decide(p_diff, p_equiv, two: np.ndarray, one: np.ndarray) -> Decisions:
    """The sequential rule of the module docstring over S studies at once.

    p_diff (S, m, K): the two-sided Welch p of each comparison at each look; p_equiv (S, m, K): its TOST p (the
    larger one-sided p; NaN: no margin); NaN at looks not yet reached. two, one: `level_table`'s nominal levels."""
    p_diff, p_equiv = np.asarray(p_diff, dtype=float), np.asarray(p_equiv, dtype=float)
    S, m, K = p_diff.shape
    first_d, first_e = _earliest(p_diff, two), _earliest(p_equiv, one)  # (m + 1, S, m)
    rd, re = np.zeros((S, m), bool), np.zeros((S, m), bool)
    open_ = np.ones((S, m), bool)
    stop = np.full((S, m), K - 1)
    diff_look, equiv_look = np.full((S, m), -1), np.full((S, m), -1)
    diff_row, equiv_row = np.zeros((S, m), int), np.zeros((S, m), int)
    si, ci = np.arange(S)[:, None], np.arange(m)[None, :]
    for k in range(K):
        limit = np.where(open_, k, stop)  # the last look each comparison has data for
        while True:  # Holm's step-down within the look: a recycled level may reject more
            r = np.maximum((~(rd & re)).sum(1), 1)[:, None]  # (S, 1) comparisons still holding alpha
            at_d, at_e = first_d[r, si, ci], first_e[r, si, ci]
            new_d, new_e = ~rd & (at_d <= limit), ~re & (at_e <= limit)
            if not (new_d.any() or new_e.any()):
                break
            diff_look, equiv_look = np.where(new_d, at_d, diff_look), np.where(new_e, at_e, equiv_look)
            diff_row, equiv_row = np.where(new_d, r, diff_row), np.where(new_e, r, equiv_row)
            rd, re = rd | new_d, re | new_e
        now = open_ & (rd | re)
        stop = np.where(now, k, stop)
        open_ &= ~now
        if not open_.any():
            break
    return Decisions(stop, rd, re, diff_look, equiv_look, diff_row, equiv_row)


# --------------------------------------------------------------------------------------------- a study's store
def study_looks(values, family, baseline: str, orders, looks, margin: float) -> tuple[np.ndarray, ...]:
    """(delta, p_diff, p_equiv, df), each (1, m, K): Welch's test and TOST (analysis.stats, the report's own tests)
    of each comparison (arm, size) of `family` against the baseline at its size, on the first n_k seeds of the
    size's order at every look; NaN at a look not reached (a seed of the arm or the baseline without a value).

    values: (arm, size, seed) -> final val bpb (NaN: the run failed; Welch and TOST drop it). orders: size -> the
    seeds in the order the seeds stage adds them."""
    from analysis.stats import tost, welch

    out = np.full((4, 1, len(family), len(looks)), np.nan)
    for j, (arm, size) in enumerate(family):
        for k, n in enumerate(looks):
            got = [values.get((arm, size, s)) for s in orders[size][:n]]
            ref = [values.get((baseline, size, s)) for s in orders[size][:n]]
            if len(got) < n or any(v is None for v in got + ref):
                continue  # this look has not been reached
            w = welch(got, ref)
            out[:, 0, j, k] = w["delta"], w["p_value"], tost(got, ref, margin)["p_value"], w["df"]
    return tuple(out)


def decide_study(values, family, baseline: str, orders, design: Design, margin: float):
    """The sequential rule (`decide`) on one declared family of a study's comparisons, from its values so far:
    (Decisions of one study, (delta, p_diff, p_equiv, df) from `study_looks`)."""
    looks = study_looks(values, family, baseline, orders, design.looks(), margin)
    return decide(looks[1], looks[2], *level_table(design, len(family))), looks


def decided_at(values, families, size: str, baseline: str, orders, design: Design, margin: float) -> set[str]:
    """The arms whose comparison at `size` the rule has decided (a hypothesis rejected) on the values so far, each
    family (a list of (arm, size)) decided as a whole: the protocol asks this after every look, and the report
    replays the same questions."""
    closed = set()
    for fam in families:
        d, _ = decide_study(values, fam, baseline, orders, design, margin)
        closed |= {arm for j, (arm, at) in enumerate(fam)
                   if at == size and (d.reject_diff[0, j] or d.reject_equiv[0, j])}
    return closed


EQUIVALENT, BETTER, WORSE, INCONCLUSIVE = 0, 1, 2, 3  # verdict codes


def verdict_codes(d: Decisions, delta: np.ndarray) -> np.ndarray:
    """(S, m) verdict codes; delta (S, m, K) arm minus baseline at each look (lower loss is better)."""
    S, m = d.stop.shape
    look = np.clip(d.diff_look, 0, None)
    sign = np.take_along_axis(delta, look[..., None], -1)[..., 0]
    out = np.full((S, m), INCONCLUSIVE)
    out = np.where(d.reject_diff, np.where(sign < 0, BETTER, WORSE), out)
    return np.where(d.reject_equiv, EQUIVALENT, out)


# --------------------------------------------------------------------------------------------- simulation
def welch_looks(arms: np.ndarray, base: np.ndarray, looks, margin: float, reference: str = "t"):
    """(delta, p_diff, p_equiv), each (S, m, K): Welch's test and TOST of arms (S, m, n) against base (S, n) on their
    first n_k seeds at every look. reference="normal" reads the statistics against the normal distribution instead
    of t (wrong at small n: kept to show its error)."""
    from scipy import stats

    out = []
    for n in looks:
        a, b = arms[..., :n], base[:, None, :n]
        va, vb = a.var(-1, ddof=1) / n, b.var(-1, ddof=1) / n
        se = np.sqrt(va + vb)
        df = (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (n - 1))
        d = a.mean(-1) - b.mean(-1)
        dist = stats.t(df) if reference == "t" else stats.norm
        p_diff = 2 * dist.sf(np.abs(d) / se)
        p_equiv = np.maximum(dist.sf((d + margin) / se), dist.cdf((d - margin) / se))
        out.append((d, p_diff, p_equiv))
    return tuple(np.stack(x, -1) for x in zip(*out))


def holm_reject(p: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's step-down over the last axis (the family), vectorised: True where rejected."""
    order = np.argsort(p, -1)
    m = p.shape[-1]
    sp = np.take_along_axis(p, order, -1)
    ok = np.cumprod(sp <= alpha / (m - np.arange(m)), -1).astype(bool)  # reject the first i while each passes
    out = np.zeros_like(ok)
    np.put_along_axis(out, order, ok, -1)
    return out


def simulate(design: Design, deltas, sd, margin: float, sd_base: float | None = None, studies: int = 10_000,
             seed: int = 0, reference: str = "t") -> dict:
    """`studies` simulated studies of the design: arm i's seeds ~ N(deltas[i], sd[i]) (sd: one for all, or one per
    arm), the baseline's ~ N(0, sd_base) (default: the first arm's sd).

    Returns per study the sequential verdict codes (S, m), seeds per arm (S, m) and of the baseline (S,), whether
    some true hypothesis was rejected (S,) and the wrong verdicts (S,); the same for today's fixed rule (two Holm
    families at the cap)."""
    deltas = np.asarray(deltas, dtype=float)
    m, looks = len(deltas), design.looks()
    rng = np.random.default_rng(seed)
    sd = np.broadcast_to(np.asarray(sd, dtype=float), (m,))  # one sd, or one per arm
    arms = deltas[None, :, None] + sd[None, :, None] * rng.standard_normal((studies, m, design.cap))  # (S, m, cap)
    base = (sd[0] if sd_base is None else sd_base) * rng.standard_normal((studies, design.cap))  # (S, cap)
    delta, p_diff, p_equiv = welch_looks(arms, base, looks, margin, reference)
    d = decide(p_diff, p_equiv, *level_table(design, m))
    codes = verdict_codes(d, delta)
    n = np.asarray(looks)
    true_d, true_e = deltas == 0, np.abs(deltas) >= margin  # (m,) the true hypotheses
    fixed_d = holm_reject(p_diff[..., -1], design.alpha)
    fixed_e = holm_reject(p_equiv[..., -1], design.alpha)
    fixed = np.where(fixed_e, EQUIVALENT, np.where(fixed_d, np.where(delta[..., -1] < 0, BETTER, WORSE),
                                                     INCONCLUSIVE))
    return {"codes": codes, "seeds": n[d.stop], "baseline_seeds": n[d.stop.max(1)],
            "false": ((d.reject_diff & true_d) | (d.reject_equiv & true_e)).any(1),
            "wrong": wrong(codes, deltas, margin).any(1),
            "fixed_codes": fixed, "fixed_false": ((fixed_d & true_d) | (fixed_e & true_e)).any(1),
            "fixed_wrong": wrong(fixed, deltas, margin).any(1)}


def mixed_null(m: int, margin: float) -> np.ndarray:
    """The mixed partial null of m comparisons: the even ones at Δ = 0, the odd ones at the margin's edge, +margin
    and -margin in turn (both kinds of true hypothesis at once)."""
    i = np.arange(m)
    return np.where(i % 2 == 1, np.where(i % 4 == 1, margin, -margin), 0.0)


def wrong(codes: np.ndarray, deltas: np.ndarray, margin: float) -> np.ndarray:
    """(S, m) verdicts the truth contradicts: equivalent when |delta| >= margin; better when delta >= 0; worse when
    delta <= 0."""
    return ((codes == EQUIVALENT) & (np.abs(deltas) >= margin)) | ((codes == BETTER) & (deltas >= 0)) | \
        ((codes == WORSE) & (deltas <= 0))


def rate(x) -> tuple[float, float, float]:
    """(proportion, its 95% Wilson interval) of a boolean array."""
    x = np.asarray(x, bool)
    n, p, z = x.size, float(x.mean()), 1.959964
    mid, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, mid - half, mid + half
