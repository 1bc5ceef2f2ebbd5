"""The known-results report kind (analysis/known_results.py) end to end on a synthetic verdict-protocol store written
here with planted values, so that every row's verdict and agreement is known in advance:

- rope, swiglu: far below the baseline (the papers: better) -> agree; geglu: far above (the paper: better) ->
  disagree, and the report names it; mqa: above (the paper: worse) -> agree;
- rmsnorm, qknorm: within ±0.003 of a tight baseline, margin 0.02 -> equivalent (the papers: equivalent) -> agree;
- gqa: a spread of 0.1 -> inconclusive -> undecided;
- the lr stage of baseline and qknorm: 1 and 2 lrs within m of their best -> qknorm less sensitive -> agree;
- the ALiBi and μP rows come from the committed reports/extrapolation and reports/lr-transfer; the ALiBi number is
  recomputed here from context.csv by hand.

The runs declare a paired test (verdict.paired): the paired Δ and the correlation are checked against numpy.
"""
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from commands_testing import run_main
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "known-results"
BPB = {  # seeds 1-4 at size m
    "baseline": [2.300, 2.304, 2.302, 2.306],
    "rope": [2.200, 2.210, 2.220, 2.190],
    "rmsnorm": [2.301, 2.303, 2.305, 2.303],
    "swiglu": [2.250, 2.260, 2.255, 2.245],
    "geglu": [2.400, 2.410, 2.405, 2.395],
    "gqa": [2.300, 2.350, 2.250, 2.320],
    "mqa": [2.330, 2.335, 2.340, 2.325],
    "qknorm": [2.302, 2.304, 2.306, 2.300],
}
FAMILY = {"baseline": "baseline", "rope": "positions", "rmsnorm": "norms", "swiglu": "mlps", "geglu": "mlps",
          "gqa": "attention", "mqa": "attention", "qknorm": "norms"}
KV = {"gqa": 1024, "mqa": 512}  # bytes per token; 2048 for the others
# lr stage, per lr (mean of 2 seeds): within m = 0.02 of its own best, baseline 1 lr, qknorm 2 (3 if it were measured
# from the baseline's best, 2.31)
LR_STAGE = {"baseline": [2.40, 2.31, 2.35, 2.60], "qknorm": [2.32, 2.285, 2.30, 2.45]}
GRID = (0.003, 0.006, 0.012, 0.024)
MARGIN = 0.02
EXPECTED = {"rope": "agree", "rmsnorm": "agree", "swiglu": "agree", "geglu": "disagree", "gqa": "undecided",
            "mqa": "agree", "qknorm": "agree", "qknorm-lr": "agree", "alibi": "agree"}
T0 = 1_700_000_000_000
# the n-gram floor of the same data (sweeps.floor's record): trigram 2.55, so an arm is "trained" (>= 0.2 below it)
# at a mean <= 2.35: every arm but geglu (2.4025); the baseline (2.303) is below the 4-gram's 2.31
FLOOR = {2: 2.9, 3: 2.55, 4: 2.31, 5: 2.2}
N_TRAIN = 1_000_000  # train-split tokens; every run saw tokens_seen 2,048,000: 2.048 epochs


def log_run(client, exp: str, start: int, tags: dict, lr: float, seed: int, bpb: float, arm: str) -> None:
    """One finished run of `arm` at `lr` and `seed` reaching `bpb`, started at `start` (ms)."""
    from mlflow.entities import Metric, Param, RunTag

    r = client.create_run(exp, start_time=start, tags=tags, run_name=tags["variant"])
    ms = [("final_val_bpb", bpb, 0), ("final_val_loss", bpb * 0.7, 0), ("params", 800_000, 0),
          ("flops_per_token", 4.8e6, 0), ("final_tokens_per_sec", 9000.0, 0), ("flops_seen", 9.8e12, 1000),
          ("tokens_seen", 2_048_000, 1000), ("kv_cache_bytes_per_token", KV.get(arm, 2048), 0)]
    client.log_batch(r.info.run_id, metrics=[Metric(k, float(v), start + 1000, s) for k, v, s in ms],
                     params=[Param("optim.lr", str(lr)), Param("seed", str(seed))],
                     tags=[RunTag("git_commit", "c0ffee"), RunTag("data_fingerprint", "fp"),
                           RunTag("tokenizer", "char"), RunTag("git_dirty", "false")])
    client.set_terminated(r.info.run_id, status="FINISHED", end_time=start + 2000)


def protocol_tags(name: str, arm: str, size: str, budget: str) -> dict:
    """The tags every run of protocol `name` carries for `arm` at `size`, before its stage's own."""
    return {"verdict.protocol": name, "verdict.arm": arm, "verdict.family": FAMILY[arm],
            "verdict.baseline": "baseline", "verdict.size": size, "verdict.budget_flops": budget,
            "verdict.margin": f"{MARGIN:g}", "verdict.margin_reason": "a test", "verdict.holm": "study",
            "verdict.primary": "arms=*;sizes=*", "verdict.allow_dirty": "false", "verdict.paired": "true"}


def make_store(uri: str) -> None:
    from ablations.tracking import client as open_store  # a new store: the migrated template

    client = open_store(uri)
    exp = client.create_experiment(EXPERIMENT)
    clock = [T0]

    def run(tags, lr, seed, bpb, arm):
        clock[0] += 60_000
        log_run(client, exp, clock[0], tags, lr, seed, bpb, arm)

    for arm in FAMILY:
        base = protocol_tags(EXPERIMENT, arm, "m", "1e13")
        for lr, mean in zip(GRID, LR_STAGE.get(arm, ())):
            for seed, d in ((100, 0.01), (101, -0.01)):
                run(base | {"verdict.stage": "lr", "seed": str(seed), "variant": f"m {arm} optim.lr={lr:g}"}, lr, seed,
                    mean + d, arm)
        for seed, bpb in zip((1, 2, 3, 4), BPB[arm]):
            run(base | {"verdict.stage": "seeds", "seed": str(seed), "verdict.lr": "0.006",
                        "variant": f"m {arm} optim.lr=0.006"}, 0.006, seed, bpb, arm)
    from sweeps.floor import log_floor

    log_floor(uri, FLOOR, {"kind": "ngram", "smoothing": "modified-kn", "data": "shakespeare", "tokenizer": "char",
                           "scope": "windows", "block_size": 64, "val_windows": 8, "n_train": N_TRAIN,
                           "n_targets": 512, "data_fingerprint": "fp"})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("known")
    uri = f"sqlite:///{tmp}/mlflow.db"
    make_store(uri)
    out = tmp / "report"
    r = run_main("analysis.report", ["known-results", EXPERIMENT, f"tracking_uri={uri}", f"out={out}"])
    assert r.returncode == 0, r.stderr[-3000:]
    rows = pd.read_csv(out / "known_results.csv", keep_default_na=False).set_index("finding")
    return out, rows


def test_one_row_per_published_finding_in_the_table_order(built):
    from analysis.literature import FINDINGS

    _, rows = built
    assert list(rows.index) == [f.key for f in FINDINGS]
    for key, agreement in EXPECTED.items():
        assert rows.loc[key, "agreement"] == agreement, key
    assert rows.loc["gqa", "verdict"] == "inconclusive" and rows.loc["geglu", "verdict"] == "worse"
    assert rows.loc["rmsnorm", "verdict"] == f"equivalent within ±{MARGIN:g}"
    assert "1.942" in rows.loc["geglu", "paper_result"] and "Table 1" in rows.loc["geglu", "paper_result"]


def test_protocol_rows_give_the_welch_delta_and_holm_p(built):
    _, rows = built
    a, b = np.array(BPB["rope"]), np.array(BPB["baseline"])
    w = stats.ttest_ind(a, b, equal_var=False)
    delta = a.mean() - b.mean()  # -0.0975
    assert rows.loc["rope", "our_delta"].startswith(f"−{abs(delta):.4f} [−")
    # Holm over the seven comparisons, by hand: the i-th smallest p times (7 - i + 1), then a running maximum
    raw = {x: stats.ttest_ind(np.array(v), b, equal_var=False).pvalue for x, v in BPB.items() if x != "baseline"}
    adjusted, running = {}, 0.0
    for i, (x, p) in enumerate(sorted(raw.items(), key=lambda kv: kv[1])):
        running = max(running, min(1.0, (7 - i) * p))
        adjusted[x] = running
    for x in ("rope", "gqa", "geglu"):
        want = "< 0.001" if adjusted[x] < 0.001 else f"{adjusted[x]:.3f}"
        assert rows.loc[x, "p_holm"] == want, x
    assert raw["rope"] == w.pvalue
    assert "4 and 4 seeds" in rows.loc["rope", "our_setting"]


def test_lr_sensitivity_counts_the_lrs_within_the_margin(built):
    out, rows = built
    assert rows.loc["qknorm-lr", "our_delta"] == "2 vs 1 lrs (+1)" and rows.loc["qknorm-lr", "verdict"] == "better"
    md = (out / "index.md").read_text()
    sec = md.split("## lr sensitivity")[1].split("## ")[0]
    # and Wortsman et al.'s own measure, descriptive: the mean excess over each arm's best over the shared lrs
    base = (2.40 - 2.31 + 0 + 2.35 - 2.31 + 2.60 - 2.31) / 4
    qk = (2.32 - 2.285 + 0 + 2.30 - 2.285 + 2.45 - 2.285) / 4
    assert f"| `qknorm` | 2.3200 | 2.2850 | 2.3000 | 2.4500 | 0.006, 0.012 | {qk:.4f} |" in sec
    assert f"| `baseline` | 2.4000 | 2.3100 | 2.3500 | 2.6000 | 0.006 | {base:.4f} |" in sec


def test_alibi_row_recomputed_from_the_committed_extrapolation_csv(built):
    _, rows = built
    d = pd.read_csv(REPO / "reports/extrapolation/report/context.csv")
    d = d[(d["arm"] == "position=alibi") & (d["mode"] == "nonoverlap")].pivot_table(index="run_id", columns="context",
                                                                                   values="bpb")
    diff = (d[512] - d[64]).to_numpy()
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / math.sqrt(len(diff))
    lo, hi = diff.mean() - half, diff.mean() + half
    assert rows.loc["alibi", "our_delta"] == (f"bpb@512 − bpb@64: −{abs(diff.mean()):.4f} "
                                              f"[−{abs(lo):.4f}, −{abs(hi):.4f}]")
    assert rows.loc["alibi", "verdict"] == "better"


def test_mup_row_reads_the_committed_hypothesis_page(built):
    # the row judges the committed μP re-run by its three-part hypothesis; the page committed with that study
    # (hypothesis.md, generated at the study's commit) states each part's verdict, so the row must say the same
    _, rows = built
    page = (REPO / "reports/lr-transfer/480-steps/hypothesis.md").read_text()
    parts = re.findall(r"^- \*\*\((\w)\) (held|failed|not established)\*\* for AdamW", page, re.M)
    assert [p for p, _ in parts] == ["a", "b", "c"]
    assert rows.loc["mup", "verdict"] == ", ".join(f"({p}) {v}" for p, v in parts)
    verdicts = {v for _, v in parts}
    expected = "disagree" if "failed" in verdicts else "agree" if verdicts == {"held"} else "undecided"
    assert rows.loc["mup", "agreement"] == expected
    assert "480-steps" in rows.loc["mup", "our_setting"]


def test_trained_models_against_the_floor_and_epochs(built):
    out, _ = built
    md = (out / "index.md").read_text()
    section = md.split("## Trained models")[1].split("\n## ")[0]
    means = {arm: float(np.mean(v)) for arm, v in BPB.items()}
    assert (f"the baseline (`baseline`, {means['baseline']:.4f}) is below the 4-gram floor "
            f"(−{FLOOR[4] - means['baseline']:.4f})") in section
    assert "7 of 8 arms are at least 0.2 bpb below the trigram floor (not: `geglu`)" in section
    epochs = f"{2_048_000 / N_TRAIN:.2f}"
    assert f"every run saw {epochs}-{epochs} epochs of the train split (1,000,000 tokens), within 4" in section
    row = next(ln for ln in section.splitlines() if ln.startswith("| `rope` |"))
    assert f"| −{FLOOR[3] - means['rope']:.4f} | −{FLOOR[4] - means['rope']:.4f} |" in row


def test_undecided_rows_print_what_the_planner_says_they_would_take(built):
    # gqa is the one inconclusive comparison: its seeds to detect the observed Δ and to show equivalence, from the
    # planted values through the planner's power functions (analysis/power.py; their known answers: tests/test_plan.py)
    from analysis.power import power_difference, power_tost, seeds_needed

    out, _ = built
    section = (out / "index.md").read_text().split("## What the undecided comparisons would take")[1].split("\n## ")[0]
    (row,) = [ln for ln in section.splitlines() if ln.startswith("| `")]
    a, b = np.array(BPB["gqa"]), np.array(BPB["baseline"])
    delta, sa, sb, alpha = abs(a.mean() - b.mean()), a.std(ddof=1), b.std(ddof=1), 0.05 / 7  # seven comparisons
    equiv = seeds_needed(lambda n: power_tost(delta, MARGIN, sa, sb, n, n, alpha), 0.8, 500)
    assert equiv is not None and power_tost(delta, MARGIN, sa, sb, equiv - 1, equiv - 1, alpha) < 0.8
    detect = seeds_needed(lambda n: power_difference(delta, sa, sb, n, n, alpha), 0.8, 500)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "`gqa` at `m`" and cells[3] == "7"
    assert cells[4] == ("more than 500" if detect is None else str(detect)) and cells[6] == str(equiv)


def test_busy_time_is_the_union_of_the_runs_intervals():
    from analysis.compute import busy_seconds

    # two overlapping runs (0-10, 5-15: 15 s busy), a pause, one more (20-30), one inside another (22-24)
    assert busy_seconds([(20, 30), (0, 10), (5, 15), (22, 24)]) == 25
    assert busy_seconds([]) == 0


def test_compute_section_counts_every_run(built):
    out, _ = built
    section = (out / "index.md").read_text().split("## Compute")[1].split("\n## ")[0]
    n = sum(len(v) for v in BPB.values()) + 2 * sum(len(v) for v in LR_STAGE.values())
    # each planted run lasts 2 s, one after another: no overlap
    assert f"{n} runs counted (seeds and lr stages)" in section and "on average 1.00 runs at once" in section


def test_paired_delta_and_correlation_beside_welch(built):
    out, _ = built
    v = pd.read_csv(out / "verdicts.csv").set_index("arm")
    a, b = np.array(BPB["gqa"]), np.array(BPB["baseline"])
    d = a - b
    half = stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert v.loc["gqa", "paired_n"] == 4
    assert v.loc["gqa", "paired_delta"] == pytest.approx(d.mean(), abs=1e-12)
    assert v.loc["gqa", "paired_ci_high"] == pytest.approx(d.mean() + half, abs=1e-12)
    assert v.loc["gqa", "correlation"] == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    md = (out / "index.md").read_text()
    assert "**Paired** (declared before the runs" in md and "| `m` | `gqa` |" in md


def test_report_opens_with_the_forest_plot_marking_the_papers_direction(built):
    out, rows = built
    forest = pd.read_csv(out / "forest.csv", keep_default_na=False).set_index("arm")
    assert forest.loc["rope", "expected"] == "better" and forest.loc["mqa", "expected"] == "worse"
    assert forest.loc["rmsnorm", "expected"] == "equivalent"
    # the figure marks each row's paper direction on the side of 0 it found: ◁ (left, Δ < 0: the arm's loss was
    # lower) for rope, ▷ for mqa, ◇ for rmsnorm
    from analysis.forest import forest_figure

    ax = forest_figure(forest.reset_index()).axes[0]
    y_of = dict(zip(forest.index, range(len(forest) - 1, -1, -1)))  # the first row at the top
    marked = {ln.get_ydata()[0]: ln.get_marker() for ln in ax.lines
              if ln.get_marker() in ("<", ">", "D") and len(ln.get_xdata()) == 1}
    assert (marked[y_of["rope"]], marked[y_of["mqa"]], marked[y_of["rmsnorm"]]) == ("<", ">", "D"), marked
    assert all(ln.get_xdata()[0] > 0 for ln in ax.lines if ln.get_marker() in ("<", ">", "D")
               and len(ln.get_xdata()) == 1)  # at the panel's right edge, clear of the data
    md = (out / "index.md").read_text()
    assert md.startswith("# Known results: `known-results`")
    assert md.index("](figures/forest.png)") < md.index("## Findings") < md.index("## Verdicts per size")
    counts = pd.concat([pd.Series(EXPECTED), rows.loc[["mup"], "agreement"]]).value_counts()  # planted + μP's
    assert (f"**10 published findings**: {counts.get('agree', 0)} agree, {counts.get('disagree', 0)} disagree, "
            f"{counts.get('undecided', 0)} undecided") in md
    assert "**Disagreements**" in md and "`geglu`" in md.split("**Disagreements**")[1].split("\n")[0]
    assert (out / "figures" / "quality_vs_kv_cache.png").stat().st_size > 5000
    assert f"python -m analysis.report known-results {EXPERIMENT} tracking_uri=" in md.split("## Regenerate")[1]


def test_agreement_rule():
    from analysis.known_results import agreement

    assert agreement("better", "better") == "agree"
    assert agreement("better", "equivalent within ±0.02") == "disagree"
    assert agreement("equivalent", "equivalent within ±0.02") == "agree"
    assert agreement("worse", "inconclusive") == "undecided"
    assert agreement("better", "not run") == "undecided"


def test_paired_t_by_hand():
    """Seeds 1-3 shared (seed 4 only in b): d = -0.10, -0.05, -0.10; mean -0.083333, sd 0.0288675; 95% t interval
    -0.083333 ± 4.302653 * 0.0288675 / sqrt(3) = [-0.155044, -0.011622] (t(0.975, 2) from a table); Pearson r of
    (2.0, 2.2, 2.1) and (2.1, 2.25, 2.2): 0.015 / sqrt(0.02 * 0.0116667) = 0.981981."""
    from analysis.stats import paired_t

    a = pd.Series([2.0, 2.2, 2.1], index=[1, 2, 3])
    b = pd.Series([2.1, 2.25, 2.2, 9.9], index=[1, 2, 3, 4])
    r = paired_t(a, b)
    assert r["n"] == 3
    assert r["delta"] == pytest.approx(-0.083333, abs=1e-6)
    assert (r["ci_low"], r["ci_high"]) == (pytest.approx(-0.155044, abs=1e-6), pytest.approx(-0.011622, abs=1e-6))
    assert r["correlation"] == pytest.approx(0.981981, abs=1e-6)


def test_paired_t_pairs_by_seed_not_by_row():
    """The arms list their seeds in different orders (b: 2, 1, 3): pairing by seed gives d = -0.10, -0.05, -0.10,
    the interval of test_paired_t_by_hand, [-0.155044, -0.011622] (scipy.stats.ttest_rel on the aligned values gives
    the same); pairing by row would give d = -0.25, +0.10, -0.10: -0.083333 ± 4.302653 * 0.175594 / sqrt(3) =
    [-0.5195, +0.3529]."""
    from analysis.stats import paired_t

    a = pd.Series([2.0, 2.2, 2.1], index=[1, 2, 3])
    b = pd.Series([2.25, 2.1, 2.2], index=[2, 1, 3])
    r = paired_t(a, b)
    assert r["n"] == 3 and r["delta"] == pytest.approx(-0.083333, abs=1e-6)
    assert (r["ci_low"], r["ci_high"]) == (pytest.approx(-0.155044, abs=1e-6), pytest.approx(-0.011622, abs=1e-6))
    assert r["correlation"] == pytest.approx(0.981981, abs=1e-6)


def test_a_protocol_row_reads_the_verdict_size_not_the_smallest(tmp_path):
    """Two sizes (written largest first; the table sorts them by budget): at the smaller `s` rope's seeds spread
    over 0.2 bpb (inconclusive), at the verdict size `m` they are BPB's (better, as at one size). The row must read
    `m`."""
    from ablations.tracking import client as open_store  # a new store: the migrated template

    from analysis.engine import Context, Options
    from analysis.known_results import protocol_row
    from analysis.protocol import load_protocol, verdict_table
    from analysis.literature import FINDINGS
    from analysis.store import load_runs

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = open_store(uri)
    exp = client.create_experiment("two-sizes")
    seeds = {"m": BPB, "s": {"baseline": [2.40, 2.41, 2.42, 2.43], "rope": [2.20, 2.60, 2.30, 2.50]}}
    for size, budget in (("m", "1e13"), ("s", "3e12")):
        for arm in ("baseline", "rope"):
            for seed, bpb in zip((1, 2, 3, 4), seeds[size][arm]):
                tags = protocol_tags("two-sizes", arm, size, budget) | {
                    "verdict.stage": "seeds", "seed": str(seed), "verdict.lr": "0.006",
                    "variant": f"{size} {arm} optim.lr=0.006"}
                log_run(client, exp, T0, tags, 0.006, seed, bpb, arm)
    runset = load_runs("two-sizes", uri)
    ctx = Context(out=None, runset=runset, options=Options(query=runset.query, tracking_uri=uri))
    load_protocol(ctx)
    table = ctx.once(verdict_table)
    rope = table[table["arm"] == "rope"].set_index("size")["verdict"]
    assert list(rope.index) == ["s", "m"] and rope["s"] == "inconclusive" and rope["m"] == "better"
    row = protocol_row(ctx, next(f for f in FINDINGS if f.key == "rope"))
    assert row["verdict"] == "better" and row["agreement"] == "agree"
    assert row["our_setting"].startswith("`rope` vs `baseline` at `m`: 4 and 4 seeds")
    assert row["our_delta"].startswith(f"−{abs(np.mean(BPB['rope']) - np.mean(BPB['baseline'])):.4f} [−")


@pytest.mark.parametrize("parts, verdict, agreement", [
    (("held", "not established", "held"), "(a) held, (b) not established, (c) held", "undecided"),
    (("held", "held", "held"), "(a) held, (b) held, (c) held", "agree"),
    (("held", "failed", "not established"), "(a) held, (b) failed, (c) not established", "disagree"),
])
def test_mup_row_agrees_only_when_every_part_held(monkeypatch, parts, verdict, agreement):
    """The paper found all three parts: one part not established (none failed) leaves the row undecided, not agreed.
    The judge is replaced (the committed store's own verdicts are test_mup_row_reads_the_committed_hypothesis_page's);
    the row still reads that store for its setting."""
    from analysis import lr_hypothesis
    from analysis.engine import Context
    from analysis.known_results import lr_transfer_row
    from analysis.literature import FINDINGS

    f = next(f for f in FINDINGS if f.source == "lr-transfer")
    monkeypatch.setattr(lr_hypothesis, "judge", lambda cur, opt, tr: [
        (f.arm, part, v, f"part {part}") for part, v in zip("abc", parts)])
    row = lr_transfer_row(Context(out=None), f)
    assert row["verdict"] == verdict and row["agreement"] == agreement
