"""Context length: generation past block_size (a band of max_context positions with continuing positions, a rolling
KV cache; learned positions crop) and `python -m ablations.evaluate` (non-overlapping and sliding evaluation at
contexts beyond the training window)."""
import math

import pytest
import torch
import torch.nn.functional as F

from modules import accounting
from modules.config import GPTConfig
from modules.gpt import GPT

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=64, block_size=16, n_head=4, n_embd=32)
EXTRAPOLATING = ["rope", "alibi", "nope", "sinusoidal", "t5bias"]


def tiny(position, n_layer=2, seed=0, **kw):
    """A random model with its weights scaled 5x: at GPT-2 init attention is nearly uniform and the logits barely
    depend on which keys are visible, so a wrong band would rarely change a greedy token; scaled, most do."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**TINY, "n_layer": n_layer, "position": position, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)
    return model


def randint(*shape, seed=0):
    return torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("position", EXTRAPOLATING)
@pytest.mark.parametrize("cap", [None, 10])
@pytest.mark.parametrize("use_cache", [True, False])
def test_one_layer_generation_past_block_size_sees_the_last_cap_tokens_at_their_positions(position, cap, use_cache):
    """With one layer, the token after t depends only on the last C tokens and their (continuing) positions:
    a plain causal forward of exactly those tokens with position_ids t-C+1..t is the reference."""
    model = tiny(position, n_layer=1)
    C = cap or model.config.block_size
    prompt = randint(2, 5, seed=1)
    out = model.generate(prompt, 30, temperature=0, max_context=cap, use_cache=use_cache)  # 35 tokens
    assert out.shape == (2, 35)
    with torch.no_grad():
        for t in range(4, 34):  # the token at t + 1 was predicted at t
            lo = max(0, t - C + 1)
            pos = torch.arange(lo, t + 1).expand(2, -1)
            ref = model(out[:, lo:t + 1], position_ids=pos)[:, -1].argmax(-1)
            assert torch.equal(ref, out[:, t + 1]), t


CASES = [dict(position=p) for p in EXTRAPOLATING] + [
    dict(position="rope", attention={"name": "sliding", "window": 6}),
    dict(position="alibi", attention={"name": "sliding", "window": 6, "n_kv_head": 2}),
    dict(position="rope", attention={"name": "mla"}),
    dict(position={"name": "rope", "scaling": {"name": "yarn", "factor": 4, "original_max": 16}}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: str(c).replace(" ", ""))
def test_cached_equals_uncached_past_block_size(case):
    """Tokens: generate's two paths agree far past block_size, also with left padding. Logits: decoding one token
    at a time against a rolling cache of C positions equals one band forward (window C) over the whole sequence."""
    model = tiny(**case)
    prompts, mask = randint(2, 7, seed=2), torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    for cap in (None, 9):
        cached = model.generate(prompts, 40, temperature=0, attention_mask=mask, max_context=cap)
        uncached = model.generate(prompts, 40, temperature=0, attention_mask=mask, max_context=cap, use_cache=False)
        assert torch.equal(cached, uncached), cap
    C = 9 if model.config.window is None else min(9, model.config.window)
    seq = randint(2, 3 * model.config.block_size, seed=3)
    cache = model.new_cache(2, window=C)
    with torch.no_grad():
        band = model(seq, window=C)  # (B, T, V)
        steps = [model(seq[:, :4], cache=cache)] + [model(seq[:, t:t + 1], cache=cache) for t in range(4, seq.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), band, rtol=1e-4, atol=1e-4)
    assert cache.seq_len == C and cache.next_pos.tolist() == [seq.size(1)] * 2  # rolling, positions continued
    assert cache.nbytes == accounting.kv_cache_bytes(model.config, seq_len=C, batch_size=2, dtype=torch.float32)


def test_sliding_window_default_is_its_window_not_block_size():
    model = tiny("rope", attention={"name": "sliding", "window": 5})
    assert model._context_limits(None) == (None, 5)   # the rolling window of W positions
    assert model._context_limits(3) == (None, 3)      # a cap narrows it
    assert model._context_limits(50) == (None, 5)     # but never widens it
    assert tiny("alibi")._context_limits(None) == (None, 16)  # default cap: block_size


def test_learned_positions_keep_the_crop():
    """A position table has no row past block_size: the context is cropped, positions restart at 0."""
    model = tiny("learned")
    bs = model.config.block_size
    out = model.generate(randint(2, bs - 3, seed=4), 12, temperature=0)
    assert torch.equal(out, model.generate(randint(2, bs - 3, seed=4), 12, temperature=0, use_cache=False))
    with torch.no_grad():
        for t in range(bs, out.size(1) - 1):  # predicted from exactly the last block_size tokens, positions 0..bs-1
            assert torch.equal(model(out[:, t - bs + 1:t + 1])[:, -1].argmax(-1), out[:, t + 1])
    short = model.generate(randint(1, 10, seed=5), 6, temperature=0, max_context=4)
    with torch.no_grad():
        assert torch.equal(model(short[:, -5:-1])[:, -1].argmax(-1), short[:, -1])
    with pytest.raises(ValueError, match=r"^invalid max_context=17: position=learned has 16 positions; "
                                         r"use max_context <= 16$"):
        model.generate(randint(1, 4), 2, max_context=17)
    with pytest.raises(ValueError, match=r"invalid max_context=0"):
        tiny("rope").generate(randint(1, 4), 2, max_context=0)


# ------------------------------------------------------------------------------------------ evaluation
from ablations.evaluate import score, windows  # noqa: E402


def nll_at(model, inputs: torch.Tensor, target: int) -> float:
    """NLL of `target` after the 1-D `inputs`, positions 0..len-1."""
    with torch.no_grad():
        logits = model(inputs[None])[0, -1].double()
    return float(-torch.log_softmax(logits, -1)[target])


@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
def test_sliding_stride_one_equals_a_hand_rolled_loop(position):
    """Stride 1: target j is scored once, after exactly the min(c, j + 1) tokens before it."""
    model = tiny(position)
    c = 8 if position == "learned" else 24  # past block_size 16 where the scheme allows it
    tokens = randint(60, seed=7)
    ref = sum(nll_at(model, tokens[max(0, j + 1 - c):j + 1], int(tokens[j + 1])) for j in range(59))
    total, n = score(model, tokens, c, "sliding", stride=1, batch_size=5)
    assert n == 59
    assert math.isclose(total, ref, rel_tol=1e-5)


def test_sliding_with_a_stride_and_nonoverlap_equal_hand_rolled_loops():
    """Stride s: windows end at c, c+s, ... (and at the last target); each scores the targets after the previous
    window's end, with the c tokens before the window's end as input. Nonoverlap: disjoint chunks of c."""
    model = tiny("t5bias")
    tokens, c, s = randint(71, seed=8), 20, 6
    ref, prev = 0.0, 0
    for end in list(range(c, 70, s)) + [70]:
        for j in range(prev, end):
            ref += nll_at(model, tokens[max(0, end - c):j + 1], int(tokens[j + 1]))
        prev = end
    total, n = score(model, tokens, c, "sliding", stride=s)
    assert n == 70 and math.isclose(total, ref, rel_tol=1e-5)
    ref = sum(nll_at(model, tokens[b:j + 1], int(tokens[j + 1])) for b in range(0, 70, c) for j in range(b, min(b + c, 70)))
    total, n = score(model, tokens, c, "nonoverlap")
    assert n == 70 and math.isclose(total, ref, rel_tol=1e-5)


@pytest.mark.parametrize("n,c,mode,stride", [(100, 16, "nonoverlap", None), (100, 16, "sliding", 4),
                                             (100, 16, "sliding", None), (10, 16, "sliding", 3), (37, 8, "sliding", 8),
                                             (37, 8, "sliding", 5), (5, 8, "nonoverlap", None)])
def test_windows_score_every_target_once_with_at_most_c_inputs(n, c, mode, stride):
    scored = []
    for begin, end, k in windows(n, c, mode, stride):
        assert 0 <= begin < end <= n and end - begin <= c and 1 <= k <= end - begin
        scored += range(end - k, end)
    assert scored == list(range(n))


# ------------------------------------------------------------------------------------------ the command, end to end
@pytest.fixture(scope="module")
def trained(multirun):
    """Two tiny runs (learned, rope; context 32) recorded in a fresh store by the real ablations.run: the session's
    `multirun` (tests/conftest.py), also read by tests/test_harness_run.py."""
    return multirun.uri, multirun.client, multirun.runs, multirun.cache_dir


def evaluate_cli(trained, monkeypatch, *args):
    from ablations.evaluate import main

    uri, _, _, cache = trained
    monkeypatch.setenv("ABLATIONS_CACHE_DIR", cache)
    return main([f"tracking.uri={uri}", "threads=1", "eval.max_tokens=200", *args])


def history(cl, run_id, key):
    return {m.step: m.value for m in cl.get_metric_history(run_id, key)}


@pytest.mark.slow
def test_evaluate_logs_every_context_and_mode_into_the_run(trained, monkeypatch, capsys):
    uri, cl, runs, _ = trained
    rid = runs["rope"]
    assert evaluate_cli(trained, monkeypatch, f"run_id={rid}", "eval.contexts=[16,64]", "eval.mode=nonoverlap") == 0
    assert evaluate_cli(trained, monkeypatch, f"run_id={rid}", "eval.contexts=[16,64]", "eval.mode=sliding",
                        "eval.stride=8") == 0
    assert evaluate_cli(trained, monkeypatch, f"run_id={rid}", "eval.contexts=[64]", "eval.mode=sliding",
                        "position.scaling={name: yarn, factor: 2, original_max: 32}") == 0
    out = capsys.readouterr().out
    assert "eval/sliding/bpb@64 = " in out and "eval/sliding/yarn2/bpb@64 = " in out
    for mode in ("nonoverlap", "sliding"):
        bpb, loss = history(cl, rid, f"eval/{mode}/bpb"), history(cl, rid, f"eval/{mode}/loss")
        assert sorted(bpb) == [16, 64] and history(cl, rid, f"eval/{mode}/tokens") == {16: 200, 64: 200}
        for c in (16, 64):  # char tokens of this ASCII corpus are single bytes: bpb = loss / ln 2
            assert math.isclose(bpb[c], loss[c] / math.log(2), rel_tol=1e-6) and 2 < bpb[c] < 8
    kv = history(cl, rid, "eval/sliding/kv_cache_bytes")
    assert kv[64] == 2 * kv[16] * 2  # linear in the context: 64 / 16 = 4
    assert sorted(history(cl, rid, "eval/sliding/yarn2/bpb")) == [64]
    tags = cl.get_run(rid).data.tags
    assert tags["eval.sliding.stride"] == "8" and '"name": "yarn"' in tags["eval.scaling.yarn2"]


@pytest.mark.slow
def test_evaluate_refuses_contexts_past_a_learned_table(trained, monkeypatch, capsys):
    uri, cl, runs, _ = trained
    rid = runs["learned"]
    assert evaluate_cli(trained, monkeypatch, f"run_id={rid}", "eval.contexts=[16,32,64,128]") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err == (f"error: eval.contexts=[64, 128] refused for run {rid}: position=learned has a table of 32 "
                   f"positions (block_size) and cannot go past it; evaluated [16, 32]; use contexts <= 32")
    assert sorted(history(cl, rid, "eval/nonoverlap/bpb")) == [16, 32]  # what it could do, it did
    assert evaluate_cli(trained, monkeypatch, f"run_id={rid}", "eval.contexts=[64]",
                        "position.scaling={name: linear, factor: 2}") == 2
    assert "needs a rope run" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("arg,message", [
    ("eval.mode=strided", "eval.mode='strided': choose one of nonoverlap, sliding"),
    ("eval.contexts=[0,64]", "eval.contexts=[0, 64]: expected a list of integers >= 1"),
    ("eval.stride=4", "eval.stride=4 only applies to eval.mode=sliding"),
    ("eval.window=4", "unknown option 'eval.window'"),
])
def test_evaluate_bad_input_is_one_line(trained, monkeypatch, capsys, arg, message):
    assert evaluate_cli(trained, monkeypatch, f"run_id={trained[2]['rope']}", arg) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------ the report section
def test_degradation_is_paired_within_runs_with_a_t_interval():
    """Three seeds whose bpb rises by 0.10, 0.20, 0.30 from 64 to 128: mean +0.2000, 95% CI
    0.2 ± t(0.975, 2) * 0.1 / sqrt(3) = 0.2 ± 4.302653 * 0.057735 = [-0.0484, +0.4484] (t from a t table)."""
    import pandas as pd

    from analysis.context import degradation_rows

    rows = [{"arm": "rope", "run_id": f"r{i}", "mode": "sliding", "context": c, "bpb": b + (d if c == 128 else 0)}
            for i, (b, d) in enumerate([(3.0, 0.1), (2.0, 0.3), (2.5, 0.2)]) for c in (64, 128)]
    headers, table = degradation_rows(pd.DataFrame(rows), "sliding", ["rope"])
    assert headers == ["arm", "bpb@128 − bpb@64 [95% CI]"]
    assert table == [["`rope`", "+0.2000 [-0.0484, +0.4484]"]]


@pytest.mark.slow
def test_report_has_the_context_section_and_regenerates_byte_for_byte(trained, monkeypatch, tmp_path):
    from analysis.report import build_report

    uri, cl, runs, _ = trained
    assert evaluate_cli(trained, monkeypatch, f"run_id={runs['rope']}", "eval.contexts=[16,64]") == 0
    assert evaluate_cli(trained, monkeypatch, f"run_id={runs['learned']}", "eval.contexts=[16]") == 0
    first = build_report("ablations", tmp_path / "a", tracking_uri=uri)
    build_report("ablations", tmp_path / "b", tracking_uri=uri)
    for name in ("index.md", "context.csv", "figures/bpb_vs_context.png", "figures/bpb_vs_kv_cache_at_context.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert tmp_path / "a" / "context.csv" in first.files
    md = (tmp_path / "a" / "index.md").read_text()
    assert "## Context length" in md and md.index("## Context length") < md.index("## Loss curves")
    bpb = history(cl, runs["rope"], "eval/nonoverlap/bpb")[64]
    section = md[md.index("## Context length"):md.index("## Loss curves")]
    assert f"{bpb:.4f}" in section and "bpb@64" in section  # the store's value, as logged
