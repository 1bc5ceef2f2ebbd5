"""Matched tokens (issue 37): `trainer.budget.tokens` -> trainer.max_steps, worked by hand for the tiny model; and the
verdict protocol's `match: tokens` arms, which train the baseline's tokens at every size (its max_steps exactly)
while a `match: flops` arm with fewer FLOPs per token gets more steps from the size's FLOP budget.

The protocol runs through sweeps.verdict with a stand-in for training that takes train()'s own steps up to the budget
(check_config, load_data, build_model, apply_budget) and records the steps and tags each run would have."""
import io
from types import SimpleNamespace

import pandas as pd
import pytest

from ablations.compose import compose
from ablations.train import apply_budget, build_model, check_config
from modules.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

# model=tiny, tokenizer=byte: 221,184 FLOPs per token (tests/test_budget.py works it out); data.batch_size=8 x
# block 32 = 256 tokens per optimizer step, 1,024 with 4 micro-batches.
FLOPS_PER_TOKEN = 221_184


def _budget(*overrides):
    cfg = compose(["model=tiny", "tokenizer=byte", "data.batch_size=8", *overrides])
    shape = check_config(cfg)
    return cfg, apply_budget(cfg, build_model(cfg), shape)


@pytest.mark.parametrize("tokens,accumulate,steps", [
    ("10000", 1, 39),   # 10,000 / 256 = 39.06: 39 steps (9,984 tokens); a 40th would train 10,240
    ("10000", 4, 9),    # 10,000 / 1,024 = 9.77
    ("10240", 1, 40),   # exactly 40 steps' tokens: 40, not 39 (the verdict's matched tokens are such multiples)
    ("1.024e4", 1, 40),  # the same as a float
    ("256", 1, 1),      # one step's tokens: one step
])
def test_tokens_budget_sets_max_steps_from_tokens_per_step(tokens, accumulate, steps):
    cfg, flops = _budget(f"trainer.budget.tokens={tokens}", f"trainer.accumulate_grad_batches={accumulate}")
    assert cfg.trainer.max_steps == steps
    # the budget in FLOPs (logged as budget_flops) is what those tokens cost this model; spending stays below it
    assert flops == float(tokens) * FLOPS_PER_TOKEN
    assert steps * 256 * accumulate <= float(tokens) < (steps + 1) * 256 * accumulate


@pytest.mark.parametrize("overrides,needle", [
    (["trainer.budget.tokens=255"], "invalid trainer.budget.tokens=255: less than one optimizer step (256 tokens)"),
    (["trainer.budget.tokens=0"], "invalid trainer.budget.tokens=0: expected a number > 0"),
    (["trainer.budget.tokens=-5"], "invalid trainer.budget.tokens=-5: expected a number > 0"),
    (["trainer.budget.tokens=true"], "invalid trainer.budget.tokens=True"),
    (["trainer.budget.flops=2.5e9", "trainer.budget.tokens=10000"],
     "invalid trainer.budget.flops=2500000000.0, trainer.budget.tokens=10000: set exactly one of trainer.budget.flops "
     "/ tokens_per_param / tokens (the others null, e.g. trainer.budget.flops=null)"),
    (["trainer.budget.tokens_per_param=20", "trainer.budget.tokens=10000"], "set exactly one of"),
])
def test_bad_tokens_budget_is_one_line(overrides, needle):
    with pytest.raises(ConfigError) as e:
        _budget(*overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ the protocol
ARMS = ("verdict.arms={mha:{family:attention,overrides:['attention=mha']},"
        "mqa:{family:attention,overrides:['attention=mqa']},"
        "mqa_t:{family:attention,overrides:['attention=mqa'],match:tokens}}")
SIZES = ("verdict.sizes=[{name:a,budget_flops:1.5e8,overrides:['model.n_embd=16']},"
         "{name:b,budget_flops:8.0e8,overrides:['model.n_embd=32']}]")


def _argv(tmp_path, shakespeare_path, *extra):
    return ["verdict.name=matched", ARMS, SIZES, "verdict.baseline=mha", "verdict.lr.grid=[0.002]",
            "verdict.seeds=1", "verdict.seeds_largest=1", "verdict.lr.seeds=null", "verdict.lr.extend=0",
            "verdict.lr.search=grid", f"verdict.storage=sqlite:///{tmp_path}/optuna.db", "verdict.margin=0.05",
            "verdict.margin_reason=a test", "verdict.allow_dirty=true",
            "model=tiny", "data=shakespeare", f"data.path={shakespeare_path}", "tokenizer=char",  # vocab from the data
            "data.batch_size=8", "data.val_windows=16", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "threads=1",
            *extra]


def test_tokens_arm_runs_the_baselines_steps_at_every_size(tmp_path, shakespeare_path, monkeypatch):
    from ablations.train import load_data
    from modules.accounting import flops_per_token
    from sweeps.verdict import Verdict, load_protocol

    monkeypatch.setenv("ABLATIONS_CACHE_DIR", str(tmp_path / "token-cache"))
    runs = []

    def fake_train(cfg, callbacks=(), tags=None):  # train()'s steps up to the budget, then a made-up result
        shape = check_config(cfg)
        load_data(cfg, shape)  # fills in the char vocabulary, as train() does
        model = build_model(cfg)
        apply_budget(cfg, model, shape)
        runs.append(SimpleNamespace(arm=tags["verdict.arm"], size=tags["verdict.size"], stage=tags["verdict.stage"],
                                    match=tags["verdict.match"], steps=int(cfg.trainer.max_steps),
                                    fpt=flops_per_token(model.config), tokens=shape.tokens,
                                    budget=dict(cfg.trainer.budget)))
        return {"val_bpb": 1.0, "val_loss": 1.0, "run_id": None}

    p = load_protocol(_argv(tmp_path, shakespeare_path))
    assert [a.match for a in p.arms] == ["flops", "flops", "tokens"]
    assert Verdict(p, train_fn=fake_train, out=io.StringIO()).run() == 0
    assert len(runs) == 3 * 2 * 2  # 3 arms x 2 sizes x (one lr run + one seed)
    by = {}
    for r in runs:
        by.setdefault((r.arm, r.size), set()).add((r.steps, r.fpt, r.tokens, r.match,
                                                   r.budget["flops"], r.budget["tokens"]))
    for size in ("a", "b"):
        [(base, base_fpt, tps, base_match, base_flops, _)] = by[("mha", size)]  # both stages alike
        [(flops_steps, mqa_fpt, _, mqa_match, _, _)] = by[("mqa", size)]
        [(steps, fpt, _, match, flops, tokens)] = by[("mqa_t", size)]
        budget = {"a": 1.5e8, "b": 8.0e8}[size]
        assert base == budget // (tps * base_fpt) and base_flops == budget  # the baseline: the size's FLOP budget
        assert fpt == mqa_fpt < base_fpt  # MQA costs fewer FLOPs per token ...
        assert flops_steps > base  # ... so at matched FLOPs it trains more steps,
        assert steps == base and tokens == base * tps and flops is None  # at matched tokens the baseline's steps
        assert p.match_tokens[size] == base * tps
        assert (base_match, mqa_match, match) == ("flops", "flops", "tokens")  # the tag each run records
    assert len({r.steps for r in runs if r.arm == "mha"}) == 2  # the sizes really differ


def test_bad_match_is_one_line(tmp_path, shakespeare_path):
    from sweeps.protocol import VerdictError, load_spec

    bad = ARMS.replace("match:tokens", "match:steps")
    with pytest.raises(VerdictError) as e:
        load_spec([*_argv(tmp_path, shakespeare_path), bad])
    assert str(e.value) == ("invalid verdict.arms.mqa_t.match='steps': choose flops (the size's FLOP budget) or tokens "
                            "(the baseline's tokens at each size)")


def test_report_names_the_arms_matched_at_tokens():
    """analysis/protocol.py reads the tag from the seeds-stage runs; a run without it (older protocols) is flops."""
    from analysis.protocol import tokens_matched, _tokens_text

    seeds = pd.DataFrame({"verdict.arm": ["mha", "mqa", "mqa_t", "mqa_t"],
                          "verdict.match": [None, "flops", "tokens", "tokens"]})
    assert tokens_matched(SimpleNamespace(seeds=seeds)) == ["mqa_t"]
    assert tokens_matched(SimpleNamespace(seeds=seeds.drop(columns="verdict.match"))) == []
    table = pd.DataFrame({"size": ["a", "a"], "arm": ["mha", "mqa_t"], "verdict": ["baseline", "better"],
                          "tokens": [2048.0, 2048.0]})
    assert _tokens_text(table.iloc[1], table, ["mqa_t"]) == "the baseline's 2,048 tokens (match: tokens)"
    assert _tokens_text(table.iloc[1], table) == "the same FLOPs per token and the same 2,048 tokens as the baseline"
