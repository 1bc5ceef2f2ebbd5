"""Section `scaling`: step time and activation memory against context length and width (batch 4, fp32), and the
measured KV-cache bytes of every registered attention variant against modules.accounting's."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ablations.compose import CONF_DIR
from modules.errors import ConfigError

from .core import Bench, Figures, Section, build_model, fmt, section
from .timing import best_time


def activation_bytes(model, x) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass (parameters excluded): the training
    memory that grows with batch, context and width."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return total


def step_cost(model_cfg: dict, device: str) -> tuple[float, int]:
    """(seconds of the fastest forward + backward at batch 4, activation bytes) of a freshly built model."""
    torch.manual_seed(0)
    model = build_model(model_cfg, device)
    T, V = model_cfg["block_size"], model_cfg["vocab_size"]
    x = torch.randint(0, V, (4, T + 1), device=device)

    def step():
        loss = F.cross_entropy(model(x[:, :-1]).view(-1, V), x[:, 1:].reshape(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)

    sec = best_time(step, 3, device)
    return sec, activation_bytes(model, x[:, :-1])


def attention_variants(block_size: int) -> dict[str, dict]:
    """Every registered attention variant (modules.registry) with its shipped options (conf/attention/<name>.yaml);
    a variant with a `window` option gets a quarter of the context, so that the window shows in the cache size."""
    import dataclasses

    from omegaconf import OmegaConf

    from modules.registry import names, variant

    out = {}
    for name in names("attention"):
        att = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml"), resolve=True)
        if "window" in {f.name for f in dataclasses.fields(variant("attention", name).Options)}:
            att["window"] = max(1, block_size // 4)
        out[name] = att
    return out


def kv_cache_sizes(base: dict, device: str) -> tuple[dict, list[str]]:
    """Per attention variant: the cache bytes after a prefill of block_size tokens (bf16), measured and analytic."""
    from modules import accounting

    T, result, cells = base["block_size"], {}, []
    for name, att in attention_variants(T).items():
        model_cfg = {**base, "attention": att}
        try:
            model = build_model(model_cfg, device).eval()
        except ConfigError as e:  # a variant whose shipped options do not fit this model size: say so, go on
            result[name] = {"skipped": str(e)}
            cells.append(f"{name} skipped ({e})")
            continue
        cache = model.new_cache(batch_size=1, dtype=torch.bfloat16)
        with torch.no_grad():
            model(torch.randint(0, base["vocab_size"], (1, T), device=device), cache=cache)
        measured = int(cache.nbytes)
        analytic = accounting.kv_cache_bytes(model_cfg, T, batch_size=1, dtype=torch.bfloat16)
        result[name] = {"measured_bytes": measured, "analytic_bytes": analytic}
        cells.append(f"{name} {fmt(float(measured), 'B')}" + ("" if measured == analytic else "(!)"))
    return result, cells


@section
class StepScaling(Section):  # step time and memory against context length and width
    name, order = "scaling", 60

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        base, device = bench.model, bench.device
        result, rows = {"context": {}, "width": {}}, []
        for T in (base["block_size"] // 2, base["block_size"], base["block_size"] * 2, base["block_size"] * 4):
            sec, mem = step_cost({**base, "block_size": T}, device)
            result["context"][T] = {"step_sec": sec, "activation_bytes": mem}
        for d in (base["n_embd"] // 2, base["n_embd"], base["n_embd"] * 2):
            sec, mem = step_cost({**base, "n_embd": d}, device)
            result["width"][d] = {"step_sec": sec, "activation_bytes": mem}
        for key, label in (("context", "ctx"), ("width", "d")):
            rows.append((f"scaling by {key} (b=4 fp32 fwd+bwd)", "  ".join(
                f"{label}={k}: {v['step_sec'] * 1e3:.1f} ms {fmt(float(v['activation_bytes']), 'B')}"
                for k, v in result[key].items())))
        result["kv_cache"], cells = kv_cache_sizes(base, device)
        rows.append((f"kv cache bf16 ctx={base['block_size']} (measured)", "  ".join(cells)))
        return Figures({"scaling": result}, rows)
