"""Fingerprints of the standard-parametrization model, to prove `model.parametrization=sp` unchanged.

`tests/fixtures/sp_reference.json` holds, for each contract case (every variant YAML and the riskiest
combinations of tests/test_model_contract.py), what the code at the commit named in the file produced: a sha256
of the seeded initial state_dict (bit for bit: initialisation draws the same numbers on every CPU), and, where the
CPU's kernels decide the last bits (logits, training), numbers compared with a tolerance: the logits on a fixed
batch (16 values, their sum and sum of squares), the losses of 3 AdamW steps built by LitGPT.configure_optimizers
and the loss after them, and each trained tensor's sum of squares. tests/test_mup.py recomputes them with today's
code. The tolerance (TOL, relative) is 100x the largest difference measured between two CPUs: the losses recorded
on a 2-core AVX2-only EPYC (the hashes this file held before) and recomputed on an AVX-512-BF16 EPYC at the same
commit differ by at most 8.6e-8; a change of the numerics (a scale, a multiplier, an epsilon) moves them far more.

Regenerate (only after an intended change of the sp numerics), with the code of the commit to record:
    OMP_NUM_THREADS=1 python -m tests.sp_reference tests/fixtures/sp_reference.json
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from modules.config import GPTConfig
from modules.gpt import GPT

CONF = Path(__file__).resolve().parents[1] / "conf"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "sp_reference.json"

CASES = [
    [], ["position=alibi"], ["position=nope"], ["position=rope"], ["position=sinusoidal"], ["position=t5bias"],
    ["norm=dyt"], ["norm=rmsnorm"], ["mlp=geglu"], ["mlp=relu2"], ["mlp=swiglu"],
    ["attention=gqa"], ["attention=mla"], ["attention=mqa"], ["attention=sliding", "attention.window=6"],
    ["norm.placement=post"],
    ["norm=rmsnorm", "norm.qk_norm=true", "position=rope"],
    ["attention=mla", "position=rope", "norm.qk_norm=true", "attention.latent_norm=true"],
    ["attention=sliding", "attention.window=6", "attention.n_kv_head=2", "position=rope"],
    ["model.bias=true", "model.tie_weights=false", "position=sinusoidal"],
]


def case_id(case) -> str:
    return " ".join(case) or "baseline"


def composed(case):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=["model=tiny", *case])


def _sha(tensors) -> str:
    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def state_sha(model) -> str:
    return _sha(sorted(model.state_dict().items()))


TOL = 1e-5  # relative (absolute below 1e-3): see the module docstring


def _f(t) -> float:
    return float(t.detach().double().sum())


def fingerprint(case, steps: int = 3) -> dict:
    """The seeded tiny model of `case`: init (exact), logits and `steps` AdamW steps of LitGPT's optimizer."""
    from ablations.lit import LitGPT

    cfg = composed(case)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_dict(cfg.model))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2, 17), generator=g)
    out = {"init": state_sha(model)}

    def loss_of():
        logits = model(x[:, :-1])  # (2, 16, V)
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), x[:, 1:].reshape(-1))

    model.eval()
    with torch.no_grad():
        logits, _ = loss_of()
        out["logits"] = [float(v) for v in logits.flatten()[:16]] + [_f(logits), _f(logits.double() ** 2)]
    model.train()
    lit = LitGPT(model, dict(cfg.optim), max_steps=10)
    conf = lit.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    losses = []
    for _ in range(steps):
        _, loss = loss_of()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        losses.append(float(loss_of()[1]))  # after the last step
    out["losses"] = losses
    out["trained"] = {k: _f(v.double() ** 2) for k, v in sorted(model.state_dict().items())}
    return out


def close(got: dict, want: dict, tol: float = TOL) -> list[str]:
    """What differs between two fingerprints: init exactly, the rest beyond `tol` relative (absolute near 0). The 16
    sampled logits are compared relative to the largest of them: a logit near zero is the difference of terms of the
    vector's size, so float32's rounding in it (a kernel's summation order: 2.7e-8 in a logit of -1.3e-3, beside
    logits of 0.33) is relative to that size, not to its own."""
    bad = [] if got["init"] == want["init"] else ["init"]
    scale = max((abs(v) for v in want["logits"][:16]), default=0.0)
    pairs = [(f"logits[{i}]", a, b, scale if i < 16 else 0.0)
             for i, (a, b) in enumerate(zip(got["logits"], want["logits"]))]
    pairs += [(f"losses[{i}]", a, b, 0.0) for i, (a, b) in enumerate(zip(got["losses"], want["losses"]))]
    pairs += [(f"trained {k}", got["trained"].get(k), v, 0.0) for k, v in want["trained"].items()]
    if len(got["logits"]) != len(want["logits"]) or len(got["losses"]) != len(want["losses"]) \
            or set(got["trained"]) != set(want["trained"]):
        bad.append("shape of the fingerprint")
    bad += [name for name, a, b, floor in pairs if a is None or abs(a - b) > tol * max(abs(b), floor, 1e-3)]
    return bad


def main(path: str) -> None:
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=CONF.parent).stdout.strip()
    data = {"commit": commit, "torch": torch.__version__, "cases": {case_id(c): fingerprint(c) for c in CASES}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(FIXTURE))
