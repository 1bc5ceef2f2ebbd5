"""Generation and mask details not covered per-variant in test_model_contract.py: sampling options, eos, the
no-clamping rule for learned positions, the sliding-window receptive field, masks and init."""
import math

import pytest
import torch

from modules.config import GPTConfig
from modules.gpt import GPT

TINY = dict(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=32)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **kw})).eval()


def ids(*shape, seed=0):
    return torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(seed))


def test_learned_positions_refuse_ids_past_block_size():
    """No silent clamping: a position the table has no row for is an error (generate crops instead)."""
    model = tiny()
    with pytest.raises(ValueError, match=r"position_ids max=32.*block_size=32"):
        model(ids(1, 33))
    with pytest.raises(ValueError, match="position_ids"):
        model(ids(1, 2), position_ids=torch.tensor([[30, 32]]))
    # schemes without a table extrapolate in forward; generate still crops to the trained context
    assert model.generate(ids(1, 40), 3, temperature=0).shape == (1, 43)
    rope = tiny(position="rope")
    assert torch.isfinite(rope(ids(1, 40))).all()


def test_position_ids_and_cache_continue_across_calls():
    model = tiny(position="rope")
    idx = ids(2, 10)
    cache = model.new_cache(2)
    with torch.no_grad():
        model(idx[:, :6], cache=cache)
        assert cache.next_pos.tolist() == [6, 6] and cache.seq_len == 6
        explicit = model(idx[:, 6:], position_ids=torch.arange(6, 10).expand(2, 4), cache=model.new_cache(2))
    assert explicit.shape == (2, 4, 64)


def test_sliding_window_receptive_field_is_exact():
    """Each query sees itself and the W-1 previous tokens, so after L layers logits at t depend exactly on
    tokens t - L(W-1) .. t: changing an older token changes nothing, changing the oldest visible one does."""
    W, L, t = 4, 2, 20
    model = tiny(attention={"name": "sliding", "window": W}, position="learned")
    idx = ids(1, 24)
    with torch.no_grad():
        ref = model(idx)[0, t]
        for j in range(t + 1):
            changed = idx.clone()
            changed[0, j] = (idx[0, j] + 1) % 64
            moved = not torch.allclose(model(changed)[0, t], ref, atol=1e-6, rtol=0)
            assert moved == (j >= t - L * (W - 1)), j


def test_every_query_row_has_a_visible_key():
    """Padding query rows would see no key at all; the mask lets them see something so no softmax is 0/0
    (whatever SDPA does with empty rows in a given torch version)."""
    model = tiny(attention={"name": "sliding", "window": 3})
    mask = torch.tensor([[0, 0, 0, 1, 1], [1, 1, 1, 1, 1]])
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    m = model._attn_mask(pos, mask.bool(), None, padded=True)  # (B, 1, T, S)
    assert m.shape == (2, 1, 5, 5) and bool(m.any(-1).all())
    # real queries see exactly: real keys, not in the future, within the window
    assert m[0, 0, 4].tolist() == [False, False, False, True, True]
    assert m[1, 0, 4].tolist() == [False, False, True, True, True]
    alibi = tiny(position="alibi")
    bias = alibi._attn_mask(pos, mask.bool(), None, padded=True)  # float (B, nh, T, S), -inf where masked
    assert bias.shape == (2, 4, 5, 5) and bool(torch.isfinite(bias).any(-1).all())


def test_sampling_options_and_generator_determinism():
    model = tiny()
    prompt = ids(2, 4)
    g = lambda: torch.Generator().manual_seed(123)  # noqa: E731
    a = model.generate(prompt, 10, temperature=0.8, top_k=5, generator=g())
    b = model.generate(prompt, 10, temperature=0.8, top_k=5, generator=g())
    assert torch.equal(a, b) and a.shape == (2, 14)
    assert torch.equal(model.generate(prompt, 6, top_k=1), model.generate(prompt, 6, temperature=0))
    assert torch.equal(model.generate(prompt, 6, top_p=1e-6), model.generate(prompt, 6, temperature=0))
    c = model.generate(prompt, 10, temperature=1.0, top_p=0.9, generator=g(), use_cache=False)
    d = model.generate(prompt, 10, temperature=1.0, top_p=0.9, generator=g())
    assert torch.equal(c, d)  # sampling with the same generator: cached and uncached agree
    # top-k really restricts: every sampled token is among the k most likely at its step
    out = model.generate(prompt, 8, temperature=5.0, top_k=3, generator=g(), use_cache=False)
    with torch.no_grad():
        logits = model(out[:, :-1])[:, 3:]
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == out[:, 4:, None]).any(-1).all()


def test_eos_stops_rows_and_keeps_shape():
    model = tiny()
    prompt = ids(2, 4)
    greedy = model.generate(prompt, 10, temperature=0)
    eos = int(greedy[0, 6])  # the token row 0 emits at its third step
    out = model.generate(prompt, 10, temperature=0, eos_token_id=eos)
    assert out.shape == (2, 14)
    first = (greedy[0, 4:] == eos).nonzero()[0, 0].item() + 4
    assert torch.equal(out[0, : first + 1], greedy[0, : first + 1])
    assert (out[0, first:] == eos).all()
    row1 = (greedy[1, 4:] == eos).nonzero()
    end1 = 14 if len(row1) == 0 else row1[0, 0].item() + 4
    assert torch.equal(out[1, :end1], greedy[1, :end1])


def test_generate_restores_training_mode_and_uses_no_dropout():
    model = tiny(dropout=0.5).train()
    prompt = ids(1, 4)
    a = model.generate(prompt, 6, temperature=0)
    assert model.training
    assert torch.equal(a, model.generate(prompt, 6, temperature=0, use_cache=False))


def test_gpt2_init_scales_residual_projections():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=8, n_head=4, n_embd=128))
    assert model.lm_head.weight is model.wte.weight
    resid = 0.02 / math.sqrt(2 * 8)
    for block in model.blocks:
        assert abs(block.attn.c_proj.weight.std().item() - resid) < 0.1 * resid
        assert abs(block.mlp.c_proj.weight.std().item() - resid) < 0.1 * resid
        assert abs(block.mlp.c_fc.weight.std().item() - 0.02) < 0.002
    untied = GPT(GPTConfig(**{**TINY, "tie_weights": False}))
    assert untied.lm_head.weight is not untied.wte.weight


def test_post_norm_has_no_final_norm_and_pre_norm_does():
    assert isinstance(tiny(norm={"name": "rmsnorm", "placement": "post"}).ln_f, torch.nn.Identity)
    assert not isinstance(tiny().ln_f, torch.nn.Identity)


def test_cache_in_bf16_and_fp32_model_in_bf16():
    model = tiny(attention="mla", position="rope").to(torch.bfloat16)
    idx = ids(2, 8)
    cache = model.new_cache(2)
    assert cache.dtype == torch.bfloat16
    with torch.no_grad():
        out = model(idx, cache=cache)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    assert model.generate(idx, 4, temperature=0).shape == (2, 12)
