"""Section `roofline`: each variant's measured extra time per training step over the composed model (the
baseline), beside the time its element-wise work must take at the machine's memory bandwidth.

Bound. modules.elementwise counts the bytes a variant's element-wise passes move per step in their fused form (one
read of each input, one write of each output, forward and backward) from the shapes; the difference to the
baseline's, over the ceilings section's triad bandwidth (two arrays read, one written, as an element-wise pass), is
the least extra time the variant can cost beside the matmuls: its roofline. A measured extra time far above it is
the implementation's (kernel launches, unfused passes, copies), not the architecture's; one below it means the
baseline pays more than its own bound (or the variant's passes stayed in cache).

Measurement. Every position, norm and MLP variant swapped alone into the composed model (its shipped options, as
`family=name`), and QK-norm, timed against the baseline by ablations.paired (every arm in one process, interleaved
rounds in alternating order) in 32-true and, where bf16 is native, bf16-mixed; per round, the arm's step time minus
the baseline's in the same round, summarised as the mean with a 95% t interval over the rounds. A `compile=true`
override compiles every arm (the fastest path on some machines). Attention variants are not listed: their own
element-wise work is nil (MLA's latent norm aside) and their differences lie in the matmuls and attention kernels.
"""
from __future__ import annotations

from statistics import median

from modules.config import GPTConfig

from .core import Bench, Figures, Section, fmt, model_dict, section
from .paired import measure
from .timing import mean_interval

FAMILIES = ("position", "norm", "mlp")
ACT_SIZE = {"32-true": 4, "bf16-mixed": 2}  # bytes of an activation leaving a matmul


def roofline_arms(base: dict) -> list[tuple[str, list[str]]]:
    """(label, overrides) of every registered position, norm and MLP variant other than the baseline's, and
    QK-norm: each swapped alone into the composed model."""
    from modules.registry import names

    arms = [(f"{f}={n}", [f"{f}={n}"]) for f in FAMILIES for n in names(f) if n != base[f]["name"]]
    if not base["norm"].get("qk_norm"):
        arms.append(("norm.qk_norm=true", ["norm.qk_norm=true"]))
    return arms


def extra_time(base: list[float], arm: list[float], tokens: int) -> dict:
    """Per round, the arm's seconds per step minus the baseline's (rates in tokens/s of the same rounds): the mean
    with a 95% t interval (None with one round) and the median."""
    d = [tokens / a - tokens / b for b, a in zip(base, arm, strict=True)]
    mean, half = mean_interval(d)
    return {"extra_sec": mean, "extra_sec_ci_low": None if half is None else mean - half,
            "extra_sec_ci_high": None if half is None else mean + half, "extra_sec_median": median(d)}


@section
class Roofline(Section):
    name, order, needs, uses_precisions = "roofline", 76, ("ceilings",), True

    def check(self, bench: Bench) -> None:
        from modules.elementwise import bytes_per_step

        try:
            bytes_per_step(GPTConfig.from_dict(bench.model), 1, 4)
        except KeyError as exc:
            raise SystemExit(f"ablations.bench: roofline: {exc.args[0]}") from None

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        from modules.elementwise import extra_bytes

        bandwidth = earlier["bandwidth_bytes_per_sec"]["triad"]
        model = next((o.split("=", 1)[1] for o in bench.overrides if o.startswith("model=")), None)
        common = [o for o in bench.overrides if not o.startswith("model=")]
        labelled = roofline_arms(bench.model)
        rounds, steps = bench.opts.rounds or (2 if bench.opts.quick else 8), bench.opts.steps or 2
        values, rows = {"roofline": {"bandwidth_bytes_per_sec": bandwidth, "rounds": rounds,
                                     "steps_per_round": steps}}, []
        for precision in bench.precisions.run:  # the configured one(s), none emulated (ceilings.plan_precisions)
            arms = [("baseline", [*common, f"trainer.precision={precision}"])] + \
                   [(label, [*common, *o, f"trainer.precision={precision}"]) for label, o in labelled]
            bench.log(f"roofline: {len(arms)} arms at {precision}, {rounds} paired rounds x {steps} steps")
            res = measure(model, arms, steps, rounds, warmup=2, device=bench.device, log=bench.log)
            base, tokens = res["arms"][0], res["arms"][0]["tokens_per_step"]
            base_cfg = GPTConfig.from_dict(_model_of(model, arms[0][1]))
            out = {}
            for label, a in zip([n for n, _ in arms][1:], res["arms"][1:]):
                nbytes = extra_bytes(GPTConfig.from_dict(_model_of(model, dict(arms)[label])), base_cfg, tokens,
                                     ACT_SIZE[precision])
                r = {**extra_time(base["tokens_per_sec"], a["tokens_per_sec"], tokens), "extra_bytes": nbytes,
                     "roofline_sec": nbytes / bandwidth, "compiled": a["compiled"], "ratio": a["ratio"]}
                out[label] = r
                ci = "" if r["extra_sec_ci_low"] is None else \
                    f" [{r['extra_sec_ci_low'] * 1e3:+.2f}, {r['extra_sec_ci_high'] * 1e3:+.2f}]"
                over = f", {r['extra_sec'] / r['roofline_sec']:.1f}x it" if r["roofline_sec"] > 0 else ""
                rows.append((f"roofline {precision} {label}",
                             f"{r['extra_sec'] * 1e3:+.2f} ms/step{ci} measured vs {r['roofline_sec'] * 1e3:+.2f} "
                             f"ms roofline ({fmt(float(nbytes), 'B')}{over}; x{a['ratio']:.3f} tok/s)"))
            values["roofline"][precision] = {"baseline_step_sec": tokens / base["median_tokens_per_sec"],
                                             "compiled": base["compiled"], "load_average_start":
                                             res["load_average_start"], "arms": out}
            rows.append((f"roofline {precision} baseline step", f"{tokens / base['median_tokens_per_sec'] * 1e3:.1f} "
                                                                f"ms ({tokens} tokens; triad {fmt(bandwidth, 'B/s')})"))
        return Figures(values, rows)


def _model_of(model: str | None, overrides: list[str]) -> dict:
    """The model dict an arm of ablations.paired composes (the same compose)."""
    from ablations.compose import compose

    return model_dict(compose(([f"model={model}"] if model else []) + overrides))
