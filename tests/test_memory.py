"""The memory estimate (ablations/memory.py) worked by hand on the tiny model, and the one-line refusal of a run
that will not fit."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from ablations.errors import ConfigError
from ablations.memory import estimate
from modules.config import GPTConfig

REPO = Path(__file__).resolve().parents[1]
# model=tiny with the default families, V=65: wte 65*32 = 2,080, wpe 32*32 = 1,024, per layer ln_1 32 + c_attn
# 32*96 = 3,072 + c_proj 1,024 + ln_2 32 + c_fc 4,096 + c_proj 4,096 = 12,352 (x2 = 24,704), ln_f 32: 27,840.
TINY = GPTConfig(vocab_size=65, n_layer=2, n_head=4, n_embd=32, block_size=32)


def test_estimate_by_hand_one_device():
    """B=8, T=32 (256 tokens), fp32, AdamW. Per layer, numbers per token: the Linears' inputs 32 + 32 + 32 + 128 =
    224, the non-residual outputs (c_attn 96, c_fc 128) 224, the two norm inputs 64: 512. Kept: 512 * 2 layers
    + 2 * 32 (final norm and head inputs) = 1,088 numbers * 4 bytes = 4,352, plus 16 V = 1,040 bytes of logits and
    their gradients: 5,392 bytes per token, 1,380,352 in all."""
    e = estimate(TINY, batch_size=8)
    assert (e.params, e.grads, e.optimizer, e.gathered) == (111_360, 111_360, 222_720, 0)
    assert e.activations == 1_380_352
    assert e.total == 111_360 * 4 + 1_380_352


def test_estimate_by_hand_sharded_and_checkpointed():
    """Over 2 shards: 4 * 27,840 / 2 = 55,680 bytes each for weights and gradients; the largest FSDP unit is a
    block (12,352 parameters; the root holds 27,840 - 24,704 = 3,136), gathered twice in fp32 (8 bytes) plus its
    fp32 gradient (4): 148,224. Checkpointed, a layer keeps its input (32 numbers per token; one layer's 512 live
    again in its recomputation): (32 * 2 + 512 + 64) * 4 + 1,040 = 3,600 bytes per token, 921,600 in all."""
    e = estimate(TINY, batch_size=8, shards=2, checkpointing=True)
    assert (e.params, e.grads, e.optimizer, e.gathered) == (55_680, 55_680, 111_360, 148_224)
    assert e.activations == 921_600


def test_a_run_that_will_not_fit_is_refused_in_one_line(tmp_path):
    from ablations.train import check_config, check_memory, resolve_hardware
    from modules.gpt import GPT

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["model=gpt2-350m", "tokenizer=gpt2", "data.batch_size=4096",
                                           "trainer.precision=32-true", "trainer.accelerator=cpu"])
    cfg.tokenizer.vocab_size = 50257
    shape = check_config(cfg)
    with torch.device("meta"):
        model = GPT(GPTConfig.from_dict(cfg.model))
    with pytest.raises(ConfigError) as e:
        check_memory(cfg, model, resolve_hardware(cfg), shape)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("the run needs ~") and "data.batch_size=4096" in msg
    assert "trainer.accumulate_grad_batches" in msg and "activation_checkpointing=true" in msg and "trainer=fsdp" in msg


def test_activation_checkpointing_keeps_less_and_changes_nothing_else():
    """checkpoint_blocks: the same loss and gradients as the plain model, the same parameter names (checkpoints
    stay loadable), and autograd keeps fewer bytes for the backward (each block keeps only its input)."""
    import torch.nn.functional as F

    from ablations.memory import checkpoint_blocks
    from modules.gpt import GPT

    def run(checkpointed: bool):
        torch.manual_seed(0)
        model = GPT(TINY)
        if checkpointed:
            checkpoint_blocks(model)
        x = torch.randint(0, TINY.vocab_size, (4, 33), generator=torch.Generator().manual_seed(1))
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel() * t.element_size()) or t,
                                                      lambda t: t):
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        loss.backward()
        return loss.item(), {n: p.grad for n, p in model.named_parameters()}, sum(kept)

    loss, grads, kept = run(False)
    loss_c, grads_c, kept_c = run(True)
    assert loss_c == loss and grads_c.keys() == grads.keys()
    for n in grads:
        torch.testing.assert_close(grads_c[n], grads[n], rtol=1e-6, atol=1e-7)
    assert kept_c < 0.6 * kept, (kept_c, kept)
