"""Section `variants`: every registered variant of every family (modules.registry; its shipped options from
conf/<family>/) swapped into the composed model one at a time, at its best implementation, against its own
analytic bound: training tokens/s at the model's block size, batch-1 prefill and decode tokens/s at one context
(default 1024), the KV-cache bytes, and each as a fraction of its bound (FLOPs against the measured GEMM peak for
training and prefill, bytes read per token against the measured read bandwidth for decode), so an implementation
that falls behind its own bound shows, whatever its speed.

Bounds. Training: GEMM peak / flops_per_token(cfg) at block_size (modules.accounting, 6N + attention). Prefill of c
tokens: GEMM peak / (flops_per_token(cfg, seq_len=(c+1)//2) / 3): the forward third, each query attending on
average to (c+1)/2 keys (causal), capped by a window. Decode: read bandwidth / (weights read per step + the KV
cache at context c + new/2). Peaks are the best call of the rounds (the practical ceiling of this machine, as in
the ceilings section); the variants' figures are medians over rounds, so a fraction is conservative. Training runs
in the bare loop (BareTrainer: fused AdamW, fp32 cross-entropy) at 32-true on CPU, bf16-mixed on CUDA; inference in
--inference-dtype. The inference models have block_size max(block_size, c + new) so that a learned position table
reaches c; their other weights are the training model's shapes."""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

import torch

from ablations.compose import CONF_DIR
from ablations.inference_timing import decode_cached, prefill
from modules.errors import ConfigError

from .ceilings import bandwidth_bytes, bandwidth_items, gemm_item, gemm_size
from .core import DTYPES, Bench, Figures, Row, Section, build_model, fmt, section
from .inference import weight_bytes_read_per_token
from .timing import best_rate, timed_rate
from .train import BareTrainer, training_batches

KINDS = ("train", "prefill", "decode")


def variant_configs(base: dict) -> dict[str, dict]:
    """label -> model config: the composed model ("baseline"), then every other registered variant of each family
    (modules.registry) swapped in alone, with its shipped options (conf/<family>/<name>.yaml)."""
    from omegaconf import OmegaConf

    from modules.registry import FAMILIES, names

    out = {"baseline": base}
    for family in FAMILIES:
        for name in names(family):
            if name == base[family]["name"]:
                continue
            opts = OmegaConf.to_container(OmegaConf.load(CONF_DIR / family / f"{name}.yaml"), resolve=True)
            out[f"{family}={name}"] = {**base, family: opts}
    return out


def variant_context(bench: Bench) -> tuple[int, int]:
    """(decode/prefill context, new tokens per decode measurement) of the variants section."""
    c = max(bench.opts.contexts) if bench.opts.contexts else 1024
    new = bench.opts.new_tokens or (8 if bench.opts.quick else 32)
    if c < 1 or new < 1:
        raise SystemExit(f"ablations.bench: variants need a context >= 1 and --new-tokens >= 1 (got {c}, {new})")
    return c, new


@dataclass(frozen=True)
class Plan:
    """What every variant is measured at: the context and new tokens of prefill/decode, the training precision,
    the inference dtype (and the precision its matmuls run in) and the prompt."""
    context: int
    new: int
    precision: str
    dtype: torch.dtype
    infer_prec: str
    prompt: torch.Tensor


def plan(bench: Bench) -> Plan:
    c, new = variant_context(bench)
    dtype = DTYPES[bench.opts.inference_dtype]
    prompt = torch.randint(0, bench.model["vocab_size"], (1, c), generator=torch.Generator().manual_seed(0))
    return Plan(c, new, "bf16-mixed" if bench.cuda else "32-true", dtype,
                "bf16-mixed" if dtype == torch.bfloat16 else "32-true", prompt.to(bench.device))


@dataclass
class Arm:
    """One variant: its training step, its inference model, and the rate of each round per kind."""
    cfg: dict
    infer_cfg: dict
    trainer: BareTrainer
    model: torch.nn.Module
    rounds: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    cache_bytes: int = 0


@dataclass
class Peaks:
    """The ceilings measured in the variants' rounds: GEMM FLOP/s per precision (training's replaced by
    peak_flops= where given), the inference precision's as measured, and the read bandwidth in B/s."""
    gemm: dict[str, float]
    infer: float = 0.0
    read: float = 0.0


def build_arms(bench: Bench, p: Plan) -> tuple[dict[str, Arm], dict[str, str]]:
    """Every variant built (training step and inference model) and warmed up; those whose shipped options do not
    fit this model are skipped, with the reason."""
    T, V = bench.model["block_size"], bench.model["vocab_size"]
    batches, _ = training_batches(V, bench.batch_size, T, n=8)
    arms, skipped = {}, {}
    for label, model_cfg in variant_configs(bench.model).items():
        infer_cfg = {**model_cfg, "block_size": max(T, p.context + p.new)}
        try:
            trainer = BareTrainer(model_cfg, batches, p.precision, False, bench.cfg.optim, bench.device)
            torch.manual_seed(0)
            model = build_model(infer_cfg, bench.device).to(p.dtype).eval()
        except ConfigError as e:  # shipped options that do not fit this model: say so, measure the others
            skipped[label] = str(e)
            continue
        arms[label] = Arm(model_cfg, infer_cfg, trainer, model)
        trainer.step()  # warm-up: allocations, the first kernels
        prefill(model, p.prompt, p.dtype)
        decode_cached(model, p.prompt, 2, p.dtype, bench.device)
    return arms, skipped


def measure(bench: Bench, p: Plan, arms: dict[str, Arm]) -> Peaks:
    """`rounds` rounds of: the peaks, then every arm's training, every arm's prefill, every arm's decode (appended
    to each arm's rounds)."""
    device, dtype, prompt, c, new = bench.device, p.dtype, p.prompt, p.context, p.new
    gemm = {prec: gemm_item(torch.bfloat16 if prec == "bf16-mixed" else torch.float32, device, gemm_size(bench))
            for prec in dict.fromkeys((p.precision, p.infer_prec))}  # only the peaks a bound uses
    read = bandwidth_items(device, bandwidth_bytes(bench))["read bandwidth"]
    peaks = Peaks({prec: 0.0 for prec in gemm})
    bench.log(f"variants: {len(arms)} variants x {bench.rounds} interleaved rounds (train, prefill {c}, decode "
              f"{c}+{new}), ~{bench.window:g} s each")
    for r in range(bench.rounds):
        for prec, fn in gemm.items():
            peaks.gemm[prec] = max(peaks.gemm[prec], best_rate(fn, device))
        peaks.read = max(peaks.read, best_rate(read, device))
        # measurement-major (every arm's training, then every arm's prefill, ...): the arms of one comparison are
        # timed seconds apart, not a whole round apart, so they meet the same load
        for a in arms.values():
            a.rounds["train"].append(timed_rate(a.trainer.step, bench.window, device))
        for a in arms.values():
            a.rounds["prefill"].append(timed_rate(lambda m=a.model: (prefill(m, prompt, dtype), c)[1],
                                                  bench.window, device))
        for a in arms.values():
            # one prefill (untimed: at long contexts it costs more than the decode) and `new` timed steps
            sec_per_tok, a.cache_bytes, _ = decode_cached(a.model, prompt, new, dtype, device)
            a.rounds["decode"].append(1 / sec_per_tok)
        bench.log(f"variants: round {r + 1}/{bench.rounds} done")
    peaks.infer = peaks.gemm[p.infer_prec]
    if bench.opts.peak_flops and p.precision == "bf16-mixed":  # a configured (datasheet) bf16 peak for training
        peaks.gemm["bf16-mixed"] = float(bench.opts.peak_flops)
    return peaks


def figures(label: str, a: Arm, p: Plan, peaks: Peaks) -> dict:
    """One variant's medians, bounds and the fractions of them."""
    from modules import accounting

    c, new = p.context, p.new
    bound = {"train": peaks.gemm[p.precision] / accounting.flops_per_token(a.cfg),
             "prefill": peaks.infer / (accounting.flops_per_token(a.infer_cfg, seq_len=(c + 1) // 2) / 3)}
    bytes_per_tok = (weight_bytes_read_per_token(a.model)
                     + accounting.kv_cache_bytes(a.infer_cfg, c + new // 2, 1, p.dtype))
    bound["decode"] = peaks.read / bytes_per_tok
    v = {"family": label.split("=")[0] if "=" in label else None}
    for k in KINDS:
        med = median(a.rounds[k])
        v.update({f"{k}_tokens_per_sec": med, f"{k}_bound": bound[k], f"{k}_fraction": med / bound[k]})
    v.update({"decode_bytes_per_token": bytes_per_tok, "cache_bytes": a.cache_bytes,
              "cache_bytes_analytic": accounting.kv_cache_bytes(a.infer_cfg, c, 1, p.dtype),
              "rounds": dict(a.rounds)})
    return v


def table_rows(bench: Bench, result: dict) -> list[Row]:
    prec = result["train_precision"]
    rows = [(f"variants: bounds ({bench.rounds} rounds)",
             f"GEMM {prec} {fmt(result['gemm_peak_flops'][prec], 'FLOP/s')}, read "
             f"{fmt(result['read_bandwidth'], 'B/s')}; train b={bench.batch_size} T={result['block_size']} {prec}, "
             f"prefill/decode ctx {result['context']} {result['inference_dtype']}; medians, (fraction of bound), "
             f"x baseline")]
    for label, v in result["variants"].items():
        rows.append((f"variant {label}",
                     f"train {fmt(v['train_tokens_per_sec'], 'tok/s')} ({v['train_fraction']:.0%}) "
                     f"x{v['train_vs_baseline']:.2f}  prefill {fmt(v['prefill_tokens_per_sec'], 'tok/s')} "
                     f"({v['prefill_fraction']:.0%}) x{v['prefill_vs_baseline']:.2f}  decode "
                     f"{fmt(v['decode_tokens_per_sec'], 'tok/s')} ({v['decode_fraction']:.0%}) "
                     f"x{v['decode_vs_baseline']:.2f}  cache {fmt(float(v['cache_bytes']), 'B')}"
                     + ("" if v["cache_bytes"] == v["cache_bytes_analytic"] else "(!)")))
    for label, why in result["skipped"].items():
        rows.append((f"variant {label}", f"skipped: {why}"))
    return rows


@section
class Variants(Section):
    name, order = "variants", 70

    def check(self, bench: Bench) -> None:
        variant_context(bench)

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        p = plan(bench)
        arms, skipped = build_arms(bench, p)
        peaks = measure(bench, p, arms)
        result = {"context": p.context, "new_tokens": p.new, "block_size": bench.model["block_size"],
                  "batch_size": bench.batch_size, "rounds": bench.rounds, "train_precision": p.precision,
                  "inference_dtype": bench.opts.inference_dtype, "gemm_peak_flops": peaks.gemm,
                  "read_bandwidth": peaks.read, "skipped": skipped,
                  "variants": {label: figures(label, a, p, peaks) for label, a in arms.items()}}
        # paired ratios to the baseline: per round, then the median (the rounds share the machine's load)
        ref = arms.get("baseline")
        for label, a in arms.items():
            for k in KINDS:
                result["variants"][label][f"{k}_vs_baseline"] = \
                    median([x / y for x, y in zip(a.rounds[k], ref.rounds[k])]) if ref else None
        return Figures({"variants": result}, table_rows(bench, result))
