"""Context length: generation past block_size (a band of max_context positions with continuing positions, a rolling
KV cache; learned positions crop) and `python -m ablations.evaluate` (non-overlapping and sliding evaluation at
contexts beyond the training window)."""
import math

import pytest
import torch
import torch.nn.functional as F

from modules import accounting
from modules.gpt import GPT

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=64, block_size=16, n_head=4, n_embd=32)
EXTRAPOLATING = ["rope", "alibi", "nope", "sinusoidal", "t5bias"]


def tiny(position, n_layer=2, seed=0, **kw):
    """A random model with its weights scaled 5x: at GPT-2 init attention is nearly uniform and the logits barely
    depend on which keys are visible, so a wrong band would rarely change a greedy token; scaled, most do."""
    torch.manual_seed(seed)
    model = GPT(**{**TINY, "n_layer": n_layer, "position": position, **kw}).eval()
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
