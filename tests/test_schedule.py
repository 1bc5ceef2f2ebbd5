"""The lr schedules (ablations/schedule.py) against values worked by hand from their definitions."""
import math

import pytest

from ablations.errors import ConfigError
from ablations.schedule import build_lr_lambda, lr_lambda, warmup_steps


def test_warmup_then_cosine_to_min_lr():
    f = lr_lambda(warmup_steps=10, max_steps=110, lr=1e-3, min_lr=1e-4)
    assert f(0) < f(5) < f(9) <= 1.0
    assert f(10) == pytest.approx(1.0) and f(60) == pytest.approx(0.55) and f(110) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def test_wsd_holds_the_peak_then_decays_linearly_to_min_lr():
    # 100 steps, warm-up 4, decay over the last 20%: steps 80..99 go 1 -> min_lr/lr = 0.1 linearly (20 steps)
    f = lr_lambda(warmup_steps=4, max_steps=100, lr=1e-3, min_lr=1e-4, schedule="wsd", decay_frac=0.2)
    assert [f(s) for s in range(4)] == pytest.approx([1 / 5, 2 / 5, 3 / 5, 4 / 5])
    assert all(f(s) == 1.0 for s in range(4, 80))
    assert f(80) == pytest.approx(1.0)
    assert f(90) == pytest.approx(0.1 + 0.9 * (1 - 10 / 20))  # halfway down: 0.55
    assert f(99) == pytest.approx(0.1 + 0.9 * (1 - 19 / 20))
    assert f(100) == pytest.approx(0.1) and f(150) == pytest.approx(0.1)


def test_wsd_to_zero_and_a_decay_longer_than_the_stable_phase():
    f = lr_lambda(warmup_steps=10, max_steps=20, lr=1.0, min_lr=0.0, schedule="wsd", decay_frac=0.8)
    # the decay would start at step 4, inside the warm-up: it starts when the warm-up ends instead
    assert f(9) == pytest.approx(10 / 11) and f(10) == pytest.approx(1.0) and f(15) == pytest.approx(0.5)
    assert f(20) == 0.0


@pytest.mark.parametrize("frac, max_steps, expected", [(0.02, 1500, 30), (0.1, 1500, 150), (0.02, 10, 1), (0.0, 99, 0)])
def test_warmup_frac_is_a_share_of_max_steps(frac, max_steps, expected):
    assert warmup_steps({"warmup_frac": frac, "warmup_steps": 50}, max_steps) == expected
    assert warmup_steps({"warmup_frac": None, "warmup_steps": 50}, max_steps) == 50


def test_build_lr_lambda_reads_the_optim_config():
    o = {"lr": 2e-3, "min_lr": 0.0, "warmup_frac": 0.1, "schedule": "wsd", "decay_frac": 0.5}
    f = build_lr_lambda(o, 200)  # warm-up 20 steps, hold to step 100, then linear to 0 at 200
    assert f(19) == pytest.approx(20 / 21) and f(50) == 1.0 and f(150) == pytest.approx(0.5)
    g = build_lr_lambda({"lr": 2e-3, "min_lr": 2e-4, "warmup_steps": 0}, 100)  # the default: cosine
    assert g(50) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 2)))


@pytest.mark.parametrize("key, value, words", [
    ("schedule", "linear", "optim.schedule='linear': choose one of cosine, wsd"),
    ("warmup_frac", 1.5, "optim.warmup_frac=1.5"),
    ("decay_frac", 0, "optim.decay_frac=0"),
])
def test_bad_schedule_values_are_one_line(key, value, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        build_lr_lambda({"lr": 1e-3, key: value}, 100)
    assert "\n" not in str(e.value)
