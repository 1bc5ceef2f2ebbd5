"""Section `inference`: batch-1 prefill tokens/sec, and batch-1 greedy decode tokens/sec with and without the KV
cache at several context lengths (`--contexts`), the cache bytes measured (and predicted), and the decode ceiling
(read bandwidth / bytes read per token) with the fraction of it reached. The timed calls are the forward calls
`GPT.generate` makes (ablations.inference_timing)."""
from __future__ import annotations

import torch

from ablations.inference_timing import decode_cached, decode_uncached, prefill

from .ceilings import bandwidth_items
from .core import DTYPES, Bench, Figures, Section, build_model, fmt, section
from .timing import best_time, interleaved


def weight_bytes_read_per_token(model) -> int:
    """Bytes of weights one decode step reads: every parameter once, except tables that are only gathered (a
    learned position table, an untied token embedding), of which it reads one row."""
    gathered = set()
    if hasattr(model.position, "wpe"):
        gathered.add(model.position.wpe.weight)
    if model.lm_head.weight is not model.wte.weight:
        gathered.add(model.wte.weight)
    return sum(p.numel() * p.element_size() for p in model.parameters() if p not in gathered) + \
        sum(p[0].numel() * p.element_size() for p in gathered)


def new_tokens(bench: Bench) -> int:
    """Tokens decoded per decode measurement (--new-tokens)."""
    return bench.opts.new_tokens or (8 if bench.opts.quick else 32)


def decode_contexts(bench: Bench) -> list[int]:
    """The decode contexts (--contexts, or fractions of block_size); each + the new tokens must fit block_size."""
    T, new = bench.model["block_size"], new_tokens(bench)
    contexts = bench.opts.contexts
    if contexts is None:
        contexts = sorted({c for c in (T // 8, T // 4, T // 2, T - new) if c >= 8}) or [max(1, T - new)]
    too_long = [c for c in contexts if c + new > T or c < 1]
    if too_long:
        raise SystemExit(f"ablations.bench: decode context {too_long[0]} + {new} new tokens must fit in "
                         f"model.block_size={T}; add model.block_size={too_long[0] + new} (or larger) to the "
                         f"overrides, or lower --new-tokens")
    return contexts


@section
class Inference(Section):
    name, order, needs = "inference", 40, ("ceilings",)

    def check(self, bench: Bench) -> None:
        decode_contexts(bench)  # refuse bad --contexts before measuring anything

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        from modules import accounting

        device, model_cfg, window = bench.device, bench.model, bench.window
        T, dtype, new, contexts = model_cfg["block_size"], DTYPES[bench.opts.inference_dtype], new_tokens(bench), \
            decode_contexts(bench)
        torch.manual_seed(0)
        model = build_model(model_cfg, device).to(dtype).eval()
        weight_bytes = weight_bytes_read_per_token(model)
        result = {"dtype": bench.opts.inference_dtype, "new_tokens": new, "weight_bytes_per_token": weight_bytes,
                  "prefill": {}, "decode": {}}
        reps = 2 if bench.opts.quick else 3
        prompts = {c: torch.randint(0, model_cfg["vocab_size"], (1, c), device=device)
                   for c in sorted({*contexts, T})}
        for c, prompt in prompts.items():
            result["prefill"][c] = c / best_time(lambda: prefill(model, prompt, dtype), reps, device)
        # Cached decode is bandwidth-bound: measure it in rounds interleaved with the read bandwidth, so the
        # fraction of the ceiling compares figures taken under the same load (best round of each).
        read_item = bandwidth_items(device, 256 * 2**20)["read bandwidth"]
        read_bw, per_tok, nbytes = 0.0, {c: float("inf") for c in contexts}, {}
        for c in contexts:
            decode_cached(model, prompts[c], 2, dtype, device)  # warm-up
        for _ in range(reps):
            read_bw = max(read_bw, interleaved({"read": read_item}, window / 2, 1, device)["read"]["best"])
            for c in contexts:
                sec, nbytes[c], _ = decode_cached(model, prompts[c], new, dtype, device)
                per_tok[c] = min(per_tok[c], sec)
        result["read_bandwidth"] = read_bw
        rows = []
        for c in contexts:
            nocache = decode_uncached(model, prompts[c], new, window, device)
            analytic = accounting.kv_cache_bytes(model_cfg, c, batch_size=1, dtype=dtype)
            # one decode step reads every weight once and the whole cache (at context c .. c+new; the middle)
            bytes_per_tok = weight_bytes + accounting.kv_cache_bytes(model_cfg, c + new // 2, 1, dtype)
            ceiling = read_bw / bytes_per_tok
            d = {"cached_tokens_per_sec": 1 / per_tok[c], "nocache_tokens_per_sec": 1 / nocache,
                 "speedup": nocache / per_tok[c], "cache_bytes_measured": nbytes[c], "cache_bytes_analytic": analytic,
                 "bytes_read_per_token": bytes_per_tok, "ceiling_tokens_per_sec": ceiling,
                 "fraction_of_ceiling": (1 / per_tok[c]) / ceiling}
            result["decode"][c] = d
            rows.append((f"decode b=1 ctx={c} ({bench.opts.inference_dtype})",
                         f"cache {fmt(d['cached_tokens_per_sec'], 'tok/s')}  no-cache "
                         f"{fmt(d['nocache_tokens_per_sec'], 'tok/s')}  x{d['speedup']:.1f}  "
                         f"{d['fraction_of_ceiling']:.0%} of ceiling {fmt(ceiling, 'tok/s')}  "
                         f"cache {fmt(float(nbytes[c]), 'B')}" + ("" if nbytes[c] == analytic else
                                                                  f" (analytic {fmt(float(analytic), 'B')}!)")))
        rows.append(("decode ceiling bandwidth (read)", f"{fmt(read_bw, 'B/s')} (interleaved with the decode rounds)"))
        rows.append(("prefill b=1 tok/s by ctx", "  ".join(f"{c}: {fmt(v)}" for c, v in result["prefill"].items())))
        return Figures({"inference": result}, rows)
