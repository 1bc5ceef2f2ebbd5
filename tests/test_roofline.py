"""The elementwise roofline: bytes per training step of each variant's element-wise passes (modules.elementwise),
checked on shapes small enough to count by hand, and the bench section's paired extra time per step.

Shapes of every hand count: 2 layers, 2 heads, width 16 (head size 8), context 8, N = 10 tokens per step.
"""
import math

import pytest

from modules.config import GPTConfig
from modules.elementwise import KNOWN, bytes_per_step, extra_bytes
from modules.registry import FAMILIES, names

N = 10


def cfg(**families) -> GPTConfig:
    return GPTConfig.from_dict({"vocab_size": 65, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16,
                                **families})


def test_every_registered_variant_has_a_byte_count():
    # a new variant without a formula would silently count as 0 bytes otherwise
    for family in FAMILIES:
        assert set(names(family)) == set(KNOWN[family]), family


@pytest.mark.parametrize("families, family, size, expected", [
    # learned: forward read x + write x, backward read dx (3 N C 4) + the (T, C) table read and its gradient written
    ({}, "position", 4, 3 * 10 * 16 * 4 + 2 * 8 * 16 * 4),                          # 1,920 + 1,024 = 2,944
    # rope, MHA: 4 passes (fwd read/write, bwd read/write) x 2 layers x 10 tokens x (q 2x8 + k 2x8) x 4 bytes
    ({"position": "rope"}, "position", 4, 4 * 2 * 10 * 32 * 4),                      # 10,240
    ({"position": "rope"}, "position", 2, 4 * 2 * 10 * 32 * 2),                      # bf16 activations: 5,120
    # rope, GQA with one kv head: k is 1 x 8 numbers per token
    ({"position": "rope", "attention": {"name": "gqa", "n_kv_head": 1}}, "position", 4, 4 * 2 * 10 * 24 * 4),
    # rope, MLA: rotary width head_size/2 = 4, q 2 heads x 4, one shared rotary key of 4
    ({"position": "rope", "attention": "mla"}, "position", 4, 4 * 2 * 10 * 12 * 4),  # 3,840
    ({"position": "sinusoidal"}, "position", 4, 2 * 10 * 16 * 4 + 8 * 16 * 4),       # no backward: 1,792
    ({"position": "alibi"}, "position", 4, 0),
    # layernorm: 2L + 1 = 5 norms of (10, 16) fp32: 5 passes of 640 B each + mean and rstd written and read
    ({}, "norm", 2, 5 * (5 * 10 * 16 * 4 + 2 * 10 * 2 * 4)),                         # 5 x 3,360 = 16,800
    ({"norm": "rmsnorm"}, "norm", 2, 5 * (5 * 10 * 16 * 4 + 2 * 10 * 1 * 4)),        # one statistic: 16,400
    ({"norm": "dyt"}, "norm", 2, 5 * 5 * 10 * 16 * 4),                               # none: 16,000
    ({"norm": {"name": "layernorm", "placement": "post"}}, "norm", 2, 4 * 3360),      # no final norm: 13,440
    # QK-norm (layernorm, MHA, fp32): per layer q and k each 20 rows of 8: 5 x 20 x 8 x 4 + 2 x 20 x 2 x 4 = 3,520
    ({"norm": {"name": "layernorm", "qk_norm": True}}, "norm", 4, 16800 + 2 * 2 * 3520),  # 30,880
    # GELU: hidden 64, per layer forward read h + write a, backward read da, h + write dh: 5 x 10 x 64 x 2 bytes
    ({}, "mlp", 2, 2 * 5 * 10 * 64 * 2),                                              # 12,800
    # SwiGLU at hidden 24: forward read g, u + write a, backward read da, g, u + write dg, du: 8 passes
    ({"mlp": {"name": "swiglu", "hidden": 24}}, "mlp", 4, 2 * 8 * 10 * 24 * 4),       # 15,360
    ({"mlp": {"name": "relu2", "hidden": 24}}, "mlp", 4, 2 * 5 * 10 * 24 * 4),        # 9,600
    ({"attention": {"name": "mla", "latent_norm": True}}, "attention", 4,             # latent width 8 (C / 2)
     2 * (5 * 10 * 8 * 4 + 2 * 10 * 4)),                                              # 2 x 1,680 = 3,360
    ({"attention": "mqa"}, "attention", 4, 0),
])
def test_bytes_on_hand_worked_shapes(families, family, size, expected):
    assert bytes_per_step(cfg(**families), N, size)[family] == expected


def test_extra_bytes_is_the_difference_of_the_whole_model():
    # rope replaces learned positions: +10,240 - 2,944; everything else is the same model
    assert extra_bytes(cfg(position="rope"), cfg(), N, 4) == 10240 - 2944


def test_unknown_variant_is_refused_with_its_name(monkeypatch):
    monkeypatch.setitem(KNOWN, "mlp", ("gelu",))
    with pytest.raises(KeyError, match="mlp=swiglu"):
        bytes_per_step(cfg(mlp="swiglu"), N, 4)


def test_extra_time_is_paired_per_round():
    from ablations.bench.roofline import extra_time

    # 100 tokens per step; round 1: 1.0 s vs 2.0 s, round 2: 0.5 s vs 1.0 s -> differences 1.0 and 0.5
    r = extra_time([100.0, 200.0], [50.0, 100.0], 100)
    assert r["extra_sec"] == pytest.approx(0.75) and r["extra_sec_median"] == pytest.approx(0.75)
    half = 12.706204736 * math.sqrt(0.125) / math.sqrt(2)  # t(0.975, 1 df) x sd / sqrt(n)
    assert r["extra_sec_ci_low"] == pytest.approx(0.75 - half) and r["extra_sec_ci_high"] == pytest.approx(0.75 + half)


def test_roofline_arms_swap_one_family_each():
    from ablations.bench.roofline import roofline_arms

    base = cfg().to_dict()
    arms = dict(roofline_arms(base))
    assert arms["position=rope"] == ["position=rope"] and arms["norm.qk_norm=true"] == ["norm.qk_norm=true"]
    assert "position=learned" not in arms and "mlp=gelu" not in arms  # the baseline's own
    assert len(arms) == sum(len(names(f)) - 1 for f in ("position", "norm", "mlp")) + 1


@pytest.mark.slow
def test_roofline_section_on_the_tiny_model(tmp_path):
    """`python -m ablations.bench --only roofline` end to end on model=tiny: every variant row, paired, with the byte
    count of modules.elementwise for the composed model and the triad of the ceilings section as its bound."""
    import json

    import torch

    from ablations import bench
    from ablations.bench.core import model_dict
    from ablations.bench.roofline import roofline_arms
    from ablations.compose import compose

    path, threads = tmp_path / "bench.json", torch.get_num_threads()
    try:
        assert bench.main(["model=tiny", "--quick", "--only", "roofline", "--rounds", "2", "--steps", "1",
                           "--window", "0.05", "--threads", "1", "--json", str(path)]) == 0
    finally:
        torch.set_num_threads(threads)
    out = json.loads(path.read_text())
    roof = out["roofline"]
    assert roof["bandwidth_bytes_per_sec"] == out["bandwidth_bytes_per_sec"]["triad"] > 0
    rope = roof["32-true"]["arms"]["position=rope"]
    tiny = compose(["model=tiny"])
    base = GPTConfig.from_dict(model_dict(tiny))
    swapped = GPTConfig.from_dict(model_dict(compose(["model=tiny", "position=rope"])))
    n = int(tiny.data.batch_size) * base.block_size
    assert rope["extra_bytes"] == extra_bytes(swapped, base, n, 4) > 0
    assert rope["roofline_sec"] == pytest.approx(rope["extra_bytes"] / roof["bandwidth_bytes_per_sec"])
    assert set(roof["32-true"]["arms"]) == {label for label, _ in roofline_arms(model_dict(tiny))}
    assert all(math.isfinite(a["extra_sec"]) for a in roof["32-true"]["arms"].values())
