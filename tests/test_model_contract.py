"""Contract tests for every variant YAML and for seeded random combinations of them.

Each case composes the root Hydra config with `model=tiny` (2 layers, 4 heads, d=32, context 32, byte vocab 256)
plus the case's overrides, builds `GPT(GPTConfig.from_dict(cfg.model))`, and proves the failure modes of issue 2
absent: forward/backward, causal mask, KV-cache equivalence (logits and greedy tokens, sliding windows past W, MLA),
left-padded batches, generation past block_size, bf16 autocast, analytic params and KV bytes.
"""
import functools
import random
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from modules import accounting
from modules.config import GPTConfig
from modules.gpt import GPT
from modules.registry import names

CONF = Path(__file__).resolve().parents[1] / "conf"
WINDOW = 6   # sliding cases use a window well inside the test sequences, so the band really cuts
SEQ = 16     # test sequence length (< block_size 32)


pytestmark = pytest.mark.usefixtures("one_thread")


@functools.lru_cache(maxsize=None)
def composed(overrides: tuple):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=["model=tiny", *overrides])


def build(overrides, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_dict(composed(tuple(overrides)).model))
    return model.eval()


def _with_window(overrides):
    if any(o == "attention=sliding" for o in overrides):
        return [*overrides, f"attention.window={WINDOW}"]
    return list(overrides)


# Every variant YAML once (the defaults learned/layernorm/gelu/mha together form the baseline case) ...
YAML_CASES = [[]] + [[f"{group}={name}"] for group, default in (
    ("position", "learned"), ("norm", "layernorm"), ("mlp", "gelu"), ("attention", "mha"))
    for name in names(group) if name != default]
# ... the norm options, and the combinations most likely to break something ...
EXTRA_CASES = [
    ["norm.placement=post"],
    ["norm=rmsnorm", "norm.qk_norm=true", "position=rope"],
    ["attention=mla", "position=rope", "norm.qk_norm=true"],
    ["attention=mla", "position=alibi", "norm=rmsnorm", "norm.placement=post"],
    ["attention=sliding", "attention.n_kv_head=2", "position=rope"],
    ["attention=sliding", "position=alibi", "mlp=swiglu"],
    ["model.bias=true", "model.tie_weights=false", "position=sinusoidal"],
]


def _random_case(seed):
    """A seeded random point of position x norm/placement/qk_norm x mlp x attention."""
    r = random.Random(seed)
    case = [f"position={r.choice(names('position'))}", f"norm={r.choice(names('norm'))}",
            f"norm.placement={r.choice(['pre', 'post'])}", f"norm.qk_norm={r.choice(['true', 'false'])}",
            f"mlp={r.choice(names('mlp'))}", f"attention={r.choice(names('attention'))}"]
    if case[-1] == "attention=sliding" and r.random() < 0.5:
        case.append("attention.n_kv_head=2")
    return case


RANDOM_CASES = [_random_case(s) for s in range(6)]
CASES = [_with_window(c) for c in YAML_CASES + EXTRA_CASES + RANDOM_CASES]
IDS = [" ".join(c) or "baseline" for c in CASES]


def randint(*shape, seed=0, high=256):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=CASES, ids=IDS)
def case(request):
    return request.param


def test_forward_backward_finite(case):
    model = build(case).train()
    idx = randint(2, SEQ)
    logits = model(idx)
    assert logits.shape == (2, SEQ, model.config.vocab_size)
    assert torch.isfinite(logits).all()
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), idx.roll(-1, 1).view(-1))
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    # every parameter takes part (no dead module)
    assert all(g.abs().sum() > 0 for g in grads)


def test_causal_invariance(case):
    """Changing token t+1 or any later token never changes the logits at positions <= t."""
    model = build(case)
    idx = randint(1, SEQ)
    with torch.no_grad():
        ref = model(idx)
        for t in range(SEQ - 1):
            changed = idx.clone()
            changed[:, t + 1:] = randint(1, SEQ - t - 1, seed=t + 1)
            out = model(changed)
            torch.testing.assert_close(out[:, : t + 1], ref[:, : t + 1], atol=1e-5, rtol=0)


def test_kv_cache_matches_full_forward(case):
    """Prefill + chunked + token-by-token decoding with the cache gives the full forward's logits, also for
    sliding windows once the sequence is longer than W (the cache then holds only W positions) and for MLA."""
    model = build(case)
    cfg = model.config
    idx = randint(2, SEQ)
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2)
        chunks = [model(idx[:, :5], cache=cache), model(idx[:, 5:8], cache=cache)]
        chunks += [model(idx[:, t: t + 1], cache=cache) for t in range(8, SEQ)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-4)
    assert cache.nbytes == accounting.kv_cache_bytes(cfg, SEQ, batch_size=2, dtype=torch.float32)
    if cfg.window is not None:
        assert cache.seq_len == cfg.window < SEQ


def test_cached_greedy_generation_matches_uncached(case):
    model = build(case)
    prompt = randint(2, 5, seed=3)
    cached = model.generate(prompt, 12, temperature=0)
    uncached = model.generate(prompt, 12, temperature=0, use_cache=False)
    assert cached.shape == (2, 17)
    assert torch.equal(cached, uncached)
    # and greedy really is the argmax of the full forward at every step
    with torch.no_grad():
        logits = model(cached[:, :-1])
    assert torch.equal(logits[:, 4:].argmax(-1), cached[:, 5:])


def test_left_padded_batch_matches_each_prompt_alone(case):
    model = build(case)
    prompts = [randint(1, n, seed=n) for n in (3, 7, 5)]
    width = max(p.size(1) for p in prompts)
    batch = torch.zeros(len(prompts), width, dtype=torch.long)  # pad id 0, on the left
    mask = torch.zeros_like(batch)
    for i, p in enumerate(prompts):
        batch[i, width - p.size(1):] = p[0]
        mask[i, width - p.size(1):] = 1
    for use_cache in (True, False):
        out = model.generate(batch, 8, temperature=0, attention_mask=mask, use_cache=use_cache)
        for i, p in enumerate(prompts):
            alone = model.generate(p, 8, temperature=0, use_cache=use_cache)
            assert torch.equal(out[i, width:], alone[0, p.size(1):]), (use_cache, i)


def test_generation_past_block_size_keeps_going(case):
    """Past block_size both paths stay identical. A scheme with a position table (learned) crops the context to the
    last block_size tokens (positions restart at 0); every other scheme keeps its positions and attends to the last
    block_size positions: exactly one forward over the whole sequence with a band of that width."""
    model = build(case)
    bs = model.config.block_size
    prompt = randint(2, bs - 4, seed=5)
    cached = model.generate(prompt, 10, temperature=0)
    uncached = model.generate(prompt, 10, temperature=0, use_cache=False)
    assert cached.shape == (2, bs + 6)
    assert torch.equal(cached, uncached)
    with torch.no_grad():
        if type(model.position).max_positions(model.config) is not None:  # predicted from the cropped context
            last = model(cached[:, -bs - 1: -1])[:, -1].argmax(-1)
        else:  # predicted from the band forward, positions continuing (a sliding window keeps its own W < bs)
            band = min(bs, model.config.window or bs)
            last = model(cached[:, :-1], window=band)[:, -1].argmax(-1)
    assert torch.equal(last, cached[:, -1])


def test_bf16_autocast_large_activations_finite(case):
    model = build(case)
    with torch.no_grad():  # blow up the activations: huge embeddings and q/k projections
        model.wte.weight.mul_(1e3)
        for name, p in model.named_parameters():
            if name.endswith(("c_attn.weight", "c_q.weight", "c_kv_down.weight", "c_kv_up.weight")):
                p.mul_(30)
    idx = randint(2, SEQ)
    mask = torch.ones_like(idx)
    mask[0, :4] = 0  # left padding: padding query rows see no valid key
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(model(idx).float()).all()
        assert torch.isfinite(model(idx, attention_mask=mask).float()).all()
        cache = model.new_cache(2)
        assert torch.isfinite(model(idx, attention_mask=mask, cache=cache).float()).all()
        assert torch.isfinite(model(idx[:, :1], cache=cache).float()).all()


def test_analytic_params_equal_real(case):
    model = build(case)
    counts = accounting.param_counts(model.config)
    assert counts["params"] == sum(p.numel() for p in model.parameters())
    assert counts["params"] == model.num_params()
    assert counts["params_non_embedding"] == model.num_params(non_embedding=True)
    # the dict form (what Hydra passes) gives the same answer
    assert accounting.param_counts(composed(tuple(case)).model) == counts


def test_analytic_kv_bytes_equal_measured(case):
    model = build(case)
    cfg = model.config
    for dtype in (torch.float32, torch.bfloat16):
        cache = model.new_cache(3, dtype)
        with torch.no_grad():
            model(randint(3, 9), cache=cache)
            assert cache.nbytes == accounting.kv_cache_bytes(cfg, 9, batch_size=3, dtype=dtype)
            for _ in range(4):
                model(randint(3, 1), cache=cache)
        assert cache.nbytes == accounting.kv_cache_bytes(cfg, 13, batch_size=3, dtype=dtype)
        per_token = accounting.kv_cache_bytes_per_token(cfg, dtype)
        assert cache.nbytes == 3 * min(13, cfg.window or 13) * per_token
