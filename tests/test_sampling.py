"""Sampling and generation against hand-made answers: top-k and top-p keep exactly the token sets computed by hand
(and the sets transformers' TopK/TopP warpers keep), and eos is sticky per row while other rows continue.

The sampling tests use a GPT whose logits are a chosen vector at every position: ln_f (LayerNorm with bias) gets
gain 0 and bias e_0, so its output is e_0 whatever the input, and column 0 of the untied lm_head holds the logits.
Sampling 4000 rows at once then shows the kept set: the least likely kept token has probability >= 0.05, so it
is missed with probability < 0.95^4000 (~1e-89); a token outside the set can never be drawn.
"""
import math

import pytest
import torch

from modules.config import GPTConfig
from modules.gpt import GPT

pytestmark = pytest.mark.usefixtures("one_thread")

# token:      0     1     2     3     4     5        sorted: 1 (.30) 3 (.25) 4 (.20) 2 (.12) 5 (.08) 0 (.05)
PROBS = [0.05, 0.30, 0.12, 0.25, 0.20, 0.08]  # cumulative: .30 .55 .75 .87 .95 1.00
V = len(PROBS)


def fixed_logits_model(logits):
    model = GPT(GPTConfig(vocab_size=V, block_size=8, n_layer=1, n_head=1, n_embd=8, bias=True,
                          tie_weights=False)).eval()
    with torch.no_grad():
        model.ln_f.weight.zero_()
        model.ln_f.bias.zero_()
        model.ln_f.bias[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = torch.as_tensor(logits)
    return model


def kept(temperature=1.0, top_k=None, top_p=None, n=4000):
    model = fixed_logits_model([math.log(p) for p in PROBS])
    prompt = torch.zeros(n, 1, dtype=torch.long)
    out = model.generate(prompt, 1, temperature=temperature, top_k=top_k, top_p=top_p,
                         generator=torch.Generator().manual_seed(0))
    return set(out[:, -1].tolist())


def test_the_fixed_logits_model_emits_the_chosen_logits():
    model = fixed_logits_model([math.log(p) for p in PROBS])
    with torch.no_grad():
        probs = model(torch.randint(0, V, (2, 5))).softmax(-1)
    assert torch.allclose(probs, torch.tensor(PROBS).expand(2, 5, V), atol=1e-6)


@pytest.mark.parametrize("top_k, expected", [(1, {1}), (2, {1, 3}), (3, {1, 3, 4}), (5, {0, 1, 2, 3, 4, 5} - {0}),
                                             (6, {0, 1, 2, 3, 4, 5}), (100, {0, 1, 2, 3, 4, 5})])
def test_top_k_keeps_the_k_most_likely(top_k, expected):
    assert kept(top_k=top_k) == expected


# The nucleus is the smallest set of most likely tokens whose mass reaches top_p (Holtzman et al. 2020):
# top_p=0.5 needs 1 and 3 (.30 < .5 <= .55); 0.7 needs 1, 3, 4 (.55 < .7 <= .75); 0.9: five tokens (.87 < .9).
@pytest.mark.parametrize("top_p, expected", [(0.2, {1}), (0.5, {1, 3}), (0.7, {1, 3, 4}), (0.8, {1, 2, 3, 4}),
                                             (0.9, {1, 2, 3, 4, 5}), (0.96, {0, 1, 2, 3, 4, 5}),
                                             (1.0, {0, 1, 2, 3, 4, 5})])
def test_top_p_keeps_exactly_the_nucleus(top_p, expected):
    assert kept(top_p=top_p) == expected


def test_temperature_applies_before_the_nucleus():
    """At temperature 2 the probabilities are sqrt(p) renormalised: .233 .213 .191 .148 .121 .095 (sorted), so
    top_p=0.5 needs three tokens (.446 < .5 <= .637), not the two it needs at temperature 1."""
    assert kept(temperature=2.0, top_p=0.5) == {1, 3, 4}
    assert kept(temperature=1.0, top_p=0.5) == {1, 3}


def test_top_k_then_top_p():
    """top_k=3 renormalises to .40 .33 .27, whose nucleus at 0.6 is the first two (.40 < .6 <= .73)."""
    assert kept(top_k=3, top_p=0.6) == {1, 3}


@pytest.mark.parametrize("top_k, top_p", [(2, None), (4, None), (None, 0.5), (None, 0.8), (None, 0.9), (3, 0.6)])
def test_kept_sets_agree_with_transformers_warpers(top_k, top_p):
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    scores = torch.tensor([PROBS]).log()
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(None, scores)
    assert kept(top_k=top_k, top_p=top_p) == set(torch.nonzero(torch.isfinite(scores[0])).flatten().tolist())


# ---------------------------------------------------------------------------------------------------- eos
def random_model(seed=1):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=16, block_size=64, n_layer=2, n_head=2, n_embd=32, position="rope",
                          tie_weights=False)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # O(1) untied weights: greedy decoding wanders over many tokens instead of echoing one
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 1.0 if name.startswith(("wte", "lm_head")) else p.shape[1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


PROMPTS = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
N = 16


def free_run(model):
    return model.generate(PROMPTS, N, temperature=0)[:, PROMPTS.size(1):].tolist()  # (2, N) without eos


@pytest.mark.parametrize("use_cache", [True, False])
def test_eos_is_sticky_in_a_finished_row_while_the_other_row_continues(use_cache):
    model = random_model()
    row0, row1 = free_run(model)
    # an eos that row 0 emits mid-sequence, after which it would have emitted other tokens, and row 1 never emits
    choices = [(row0.index(t), t) for t in set(row0) - set(row1)
               if 0 < row0.index(t) < N - 2 and set(row0[row0.index(t) + 1:]) != {t}]
    assert choices, f"the test model's greedy rows {row0} / {row1} offer no such eos: change the seed"
    k, eos = min(choices)
    out = model.generate(PROMPTS, N, temperature=0, eos_token_id=eos, use_cache=use_cache)
    assert out.shape == (2, PROMPTS.size(1) + N)
    new = out[:, PROMPTS.size(1):].tolist()
    assert new[0] == row0[:k + 1] + [eos] * (N - k - 1)  # finished: eos from then on, not row 0's own tokens
    assert new[1] == row1  # the other row is untouched by row 0 finishing


@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_stops_once_every_row_emitted_eos_and_keeps_the_shape(use_cache):
    model = random_model()
    row0, row1 = free_run(model)
    both = [t for t in set(row0) & set(row1) if max(row0.index(t), row1.index(t)) < N - 2]
    assert both, f"the test model's greedy rows {row0} / {row1} share no early token: change the seed"
    eos = min(both, key=lambda t: max(row0.index(t), row1.index(t)))
    k0, k1 = row0.index(eos), row1.index(eos)
    assert k0 != k1  # the rows finish at different steps, so the first to finish waits for the other
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    out = model.generate(PROMPTS, N, temperature=0, eos_token_id=eos, use_cache=use_cache)
    hook.remove()
    assert out.shape == (2, PROMPTS.size(1) + N)
    new = out[:, PROMPTS.size(1):].tolist()
    assert new[0] == row0[:k0 + 1] + [eos] * (N - k0 - 1)
    assert new[1] == row1[:k1 + 1] + [eos] * (N - k1 - 1)
    assert len(calls) == max(k0, k1) + 1  # one forward per generated step, none after the last row finished
