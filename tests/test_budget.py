"""A compute budget counts every micro-batch of an optimizer step: trainer.budget.flops -> trainer.max_steps
through train()'s own steps (check_config, build_model, apply_budget), worked by hand for the tiny model."""
import pytest

from ablations.compose import compose
from ablations.train import apply_budget, build_model, check_config
from modules.accounting import flops_per_token

pytestmark = pytest.mark.usefixtures("one_thread")

# model=tiny, tokenizer=byte: V = 256, T = 32, 2 layers, 4 heads of 8, d = 32, GELU MLP 4d, no bias, tied head.
# matmul weights per layer: c_attn 32 x 96 + attn c_proj 32 x 32 + c_fc 32 x 128 + mlp c_proj 128 x 32 = 12,288;
# two layers 24,576, plus the head 32 x 256 = 8,192: 32,768. FLOPs per token (PaLM): 6 x 32,768 = 196,608 plus the
# attention term 6 x 2 layers x 4 heads x (8 + 8) x 32 keys = 24,576: 221,184.
FLOPS_PER_TOKEN = 221_184


@pytest.mark.parametrize("accumulate,steps", [
    (1, 44),  # 8 x 32 = 256 tokens per step: 56,623,104 FLOPs; 2.5e9 / that = 44.15
    (4, 11),  # 4 micro-batches: 1,024 tokens, 226,492,416 FLOPs per step; 2.5e9 / that = 11.04
])
def test_budget_steps_count_accumulated_micro_batches(accumulate, steps):
    cfg = compose(["model=tiny", "tokenizer=byte", "data.batch_size=8", f"trainer.accumulate_grad_batches={accumulate}",
                   "trainer.budget.flops=2.5e9"])
    shape = check_config(cfg)
    assert shape.tokens == 8 * 32 * accumulate  # what the metrics count per step (tokens_seen, flops_seen)
    model = build_model(cfg)
    assert flops_per_token(model.config) == FLOPS_PER_TOKEN
    assert apply_budget(cfg, model, shape) == 2.5e9
    assert cfg.trainer.max_steps == steps
    # the budget holds: the steps spend at most it, and one more step would exceed it
    assert steps * shape.tokens * FLOPS_PER_TOKEN <= 2.5e9 < (steps + 1) * shape.tokens * FLOPS_PER_TOKEN
