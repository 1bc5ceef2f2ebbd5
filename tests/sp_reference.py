"""Fingerprints of the standard-parametrization model, to prove `model.parametrization=sp` bit for bit unchanged.

`tests/fixtures/sp_reference.json` holds, for each contract case (every variant YAML and the riskiest
combinations of tests/test_model_contract.py), what the code at the commit named in the file produced: a sha256
of the seeded initial state_dict, of the logits on a fixed batch, of the state_dict after 3 AdamW steps built by
LitGPT.configure_optimizers, and those 3 losses. tests/test_mup.py recomputes them with today's code.

Regenerate (only after an intended change of the sp numerics, e.g. a faster kernel): one thread, on x86-64 with
AVX2 (the CPU kernels decide the last bits of the logits):
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
from hydra.utils import instantiate

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


def fingerprint(case, steps: int = 3) -> dict:
    """The seeded tiny model of `case`: init, logits, and `steps` AdamW steps of LitGPT's optimizer."""
    from ablations.lit import LitGPT

    cfg = composed(case)
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (2, 17), generator=g)
    out = {"init": state_sha(model)}
    model.eval()
    with torch.no_grad():
        out["logits"] = _sha([("logits", model(x[:, :-1]))])
    model.train()
    lit = LitGPT(model, dict(cfg.optim), max_steps=10)
    conf = lit.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    losses = []
    for _ in range(steps):
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    out["losses"] = [repr(v) for v in losses]
    out["trained"] = state_sha(model)
    return out


def main(path: str) -> None:
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=CONF.parent).stdout.strip()
    data = {"commit": commit, "torch": torch.__version__, "cases": {case_id(c): fingerprint(c) for c in CASES}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(FIXTURE))
