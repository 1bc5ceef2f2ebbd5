"""Does Adam's eps matter under mup at these widths? (issue 25 item 3; docs/optim.md, "Adam's eps")

Under mup a hidden matrix's gradient entries shrink like 1/width, so Adam's denominator sqrt(v) does too, and a
fixed eps would eventually dominate it (the update would stop being Adam's sign-like step). This trains the
lr-transfer setting (2 layers, heads of 8, mup base width 32, AdamW at lr 2^-7, batch 8 x 32 bytes of
tinyshakespeare) for --steps steps at each width and prints, per width, the quantiles of sqrt(v_hat) over every
hidden-matrix entry and the share of entries where eps is at least 1% of the denominator (sqrt(v_hat) < 100 eps).

    python scripts/mup_eps.py --widths 32 256 1024 --steps 200 --data /path/to/tinyshakespeare.txt
"""
import argparse
import math

import torch

from ablations.optim import build_optimizer
from modules.config import GPTConfig
from modules.gpt import GPT


def denominators(width: int, steps: int, data: torch.Tensor, eps: float) -> torch.Tensor:
    """sqrt(v_hat) of every hidden-matrix entry after `steps` AdamW steps (v_hat: v / (1 - beta2^t))."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 32, 2, 4, width, tie_weights=False, parametrization="mup",
                          mup={"base_width": 32, "width_grows": "heads", "head_dim": 8}))
    opt = build_optimizer(model, {"name": "adamw", "lr": 2.0 ** -7, "weight_decay": 0.1, "eps": eps})
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 33, (8,), generator=g)
        b = torch.stack([data[s: s + 33] for s in starts])                     # (8, 33)
        loss = torch.nn.functional.cross_entropy(model(b[:, :-1]).reshape(-1, 256), b[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    hidden = {id(r.param) for r in model.param_roles() if r.role == "hidden_matrix"}
    beta2 = opt.param_groups[0]["betas"][1]
    v = [opt.state[p]["exp_avg_sq"].flatten() for p in model.parameters() if id(p) in hidden]
    return (torch.cat(v) / (1 - beta2 ** steps)).sqrt()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--data", required=True, help="a text file (bytes are the tokens)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    data = torch.tensor(list(open(a.data, "rb").read()[:200_000]), dtype=torch.long)
    print(f"width  sqrt(v_hat) quantiles 0.1% / 1% / 50%   share < 100 eps   (eps {a.eps:g}, {a.steps} steps)")
    for w in a.widths:
        d = denominators(w, a.steps, data, a.eps)
        q = torch.quantile(d[torch.randperm(len(d), generator=torch.Generator().manual_seed(0))[:1_000_000]],
                           torch.tensor([0.001, 0.01, 0.5]))
        share = (d < 100 * a.eps).float().mean().item()
        print(f"{w:5d}  {q[0]:.2e} / {q[1]:.2e} / {q[2]:.2e}   {share:.2e}   "
              f"(median x width: {q[2].item() * w:.2e}; log2 width {math.log2(w):.0f})")


if __name__ == "__main__":
    main()
