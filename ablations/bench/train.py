"""Section `train`: training tokens/sec and MFU of a bare PyTorch loop (no Lightning, no logging) at 32-true,
bf16-mixed and bf16-mixed + torch.compile, and the loss each reached after the same steps on the same batches.
The precisions are the bench's (ceilings.plan_precisions: the configured one, none emulated unless forced); the
compiled variant runs at the last of them.

The variants are timed in the shared interleaved rounds with the ceilings, so the MFU compares a step and a peak
measured under the same load. `BareTrainer` is also the step `ablations.paired` and the variants section time."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ablations.compiling import compile_model
from modules.errors import ConfigError

from .core import Bench, Figures, Section, build_model, fmt, section


def training_batches(vocab_size: int, batch_size: int, T: int, n: int, seed: int = 0) -> tuple[torch.Tensor, str]:
    """n batches (n, B, T+1) of token windows. With a 256-token (byte) vocabulary: real text, this interpreter's
    standard library as UTF-8 bytes, so the loss reached means something; otherwise uniform random tokens."""
    g = torch.Generator().manual_seed(seed)
    if vocab_size == 256:
        import sysconfig

        chunks, size = [], 0
        for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            chunks.append(path.read_bytes())
            size += len(chunks[-1])
            if size > 4 * 2**20:
                break
        text = torch.frombuffer(bytearray(b"\0".join(chunks)), dtype=torch.uint8).long()
        if text.numel() > 4 * (T + 1):
            starts = torch.randint(0, text.numel() - T - 1, (n * batch_size,), generator=g)
            windows = torch.stack([text[s:s + T + 1] for s in starts.tolist()])
            return windows.view(n, batch_size, T + 1), "stdlib bytes"
    return torch.randint(0, vocab_size, (n, batch_size, T + 1), generator=g), "random tokens"


class BareTrainer:
    """One model + AdamW stepping through fixed batches: the fastest honest training step we know.

    As the harness: AdamW (decay on matrices only), gradient-norm clipping (at `clip`; 0 or None: none),
    cross-entropy in fp32, bf16-mixed = torch.autocast(bfloat16) around the forward with fp32 weights and optimizer.
    Faster than a naive loop by: fused AdamW (one kernel per parameter instead of ~10 elementwise ops) and foreach
    gradient clipping. Precisions: 32-true and bf16-mixed (others: ConfigError).
    """
    PRECISIONS = ("32-true", "bf16-mixed")

    @classmethod
    def check_precision(cls, precision: str) -> None:
        if precision not in cls.PRECISIONS:
            raise ConfigError(f"trainer.precision={precision}: the bare training step runs "
                              f"{' or '.join(cls.PRECISIONS)}")

    def __init__(self, model_cfg: dict, batches: torch.Tensor, precision: str, compiled: bool, optim: dict,
                 device: str = "cpu", warmup_steps: int = 10, clip: float | None = 1.0):
        self.check_precision(precision)
        torch.manual_seed(0)
        self.device, self.batches = device, batches.to(device)
        self.model = build_model(model_cfg, device).train()
        self.V, self.tokens = model_cfg["vocab_size"], batches.size(1) * (batches.size(2) - 1)
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": float(optim["weight_decay"])},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.lr, self.warmup = float(optim["lr"]), warmup_steps
        self.opt = torch.optim.AdamW(groups, lr=self.lr, betas=tuple(optim["betas"]), eps=float(optim["eps"]),
                                     fused=True)
        self.fwd = compile_model(self.model) if compiled else self.model
        dev_type = torch.device(device).type
        self.autocast = (lambda: torch.autocast(dev_type, dtype=torch.bfloat16)) if precision == "bf16-mixed" \
            else contextlib.nullcontext
        self.clip = clip or None  # 0 or None: no clipping, as Lightning's gradient_clip_val
        self.step_idx, self.losses, self.logits_dtype = 0, [], None

    def step(self) -> float:
        batch = self.batches[self.step_idx % len(self.batches)]
        x, y = batch[:, :-1], batch[:, 1:]  # targets are the inputs shifted by one
        for g in self.opt.param_groups:  # linear warm-up, then constant: enough for a loss comparison
            g["lr"] = self.lr * min(1.0, (self.step_idx + 1) / self.warmup)
        with self.autocast():
            logits = self.fwd(x)
        self.logits_dtype = logits.dtype  # what the precision made of the forward (paired reports it per arm)
        loss = F.cross_entropy(logits.float().view(-1, self.V), y.reshape(-1))
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip, foreach=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.losses.append(loss.detach())
        self.step_idx += 1
        return float(self.tokens)

    def state_bytes(self) -> int:
        """Weights and optimizer state: what the variant keeps resident between steps (gradients are freed)."""
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return weights + sum(t.numel() * t.element_size() for s in self.opt.state.values() for t in s.values()
                             if torch.is_tensor(t))


@section
class Train(Section):
    name, order, needs, uses_precisions = "train", 20, ("ceilings",), True

    def work(self, bench: Bench) -> dict[str, Callable[[], float]]:
        T, V = bench.model["block_size"], bench.model["vocab_size"]
        batches, self.data_name = training_batches(V, bench.batch_size, T, n=16 if bench.opts.quick else 64)
        run = bench.precisions.run
        variants = [(p, p, False) for p in run]
        if run and not bench.opts.no_compile:
            variants.append((f"{run[-1]}+compile", run[-1], True))
            self.warmup = 2  # the first steps compile
        self.trainers: dict[str, BareTrainer] = {}
        self.precision: dict[str, str] = {}  # variant -> its precision
        for name, precision, compiled in variants:
            bench.log(f"building {name}" + (" (torch.compile: the first steps compile, tens of seconds)"
                                            if compiled else ""))
            self.trainers[name] = BareTrainer(bench.model, batches, precision, compiled, bench.cfg.optim, bench.device)
            self.precision[name] = precision
        return {name: tr.step for name, tr in self.trainers.items()}

    def run(self, bench: Bench, rates: dict[str, dict], earlier: dict) -> Figures:
        from modules import accounting

        if not self.trainers:  # every precision asked for was skipped (the run's "precisions" row says why)
            return Figures({"train_bare": {}}, [])
        flops_tok, mfu_peak = accounting.flops_per_token(bench.model), earlier["mfu_peak_flops"]
        steps_done = min(len(t.losses) for t in self.trainers.values())
        k = max(1, min(5, steps_done // 4))
        train_rows, rows = {}, []
        for name, tr in self.trainers.items():
            precision = self.precision[name]
            tps = rates[name]["best"]
            loss = float(torch.stack(tr.losses[steps_done - k:steps_done]).mean())
            r = {"tokens_per_sec": tps, "tokens_per_sec_best_round": rates[name].get("best_round"),
                 "tokens_per_sec_median": rates[name]["median"],
                 "mfu": tps * flops_tok / mfu_peak[precision], "steps": len(tr.losses),
                 "loss_at_step": {"step": steps_done, "loss": loss}}
            train_rows[name] = r
            rows.append((f"bare loop {name}", f"{fmt(tps, 'tok/s')}  MFU {r['mfu']:.1%} of {precision} peak  "
                                              f"loss@{steps_done} {loss:.3f}"))
        if bench.cuda:
            for name, nbytes in self._peak_memory().items():
                train_rows[name]["peak_memory_bytes"] = nbytes
                rows.append((f"peak memory {name}", fmt(float(nbytes), "B")))
        values = {"train_bare": train_rows, "train_loss_data": self.data_name}
        if {"32-true", "bf16-mixed"} <= set(train_rows):
            speedup = train_rows["bf16-mixed"]["tokens_per_sec"] / train_rows["32-true"]["tokens_per_sec"]
            values["bf16_speedup"] = speedup
            rows.append(("bf16-mixed / 32-true tokens/sec", f"{speedup:.2f}x  (losses above on {self.data_name}, "
                                                            f"same batches and init)"))
        compiled = next((n for n in train_rows if n.endswith("+compile")), None)
        if compiled:
            eager = self.precision[compiled]
            c = train_rows[compiled]["tokens_per_sec"] / train_rows[eager]["tokens_per_sec"]
            values["compile_speedup"] = c
            rows.append((f"compile / eager ({eager})", f"{c:.2f}x"))
        self.trainers = {}  # free the models before the next sections
        return Figures(values, rows)

    def _peak_memory(self) -> dict[str, int]:
        """Peak memory of one step of each variant: its resident state + the step's (CUDA only)."""
        out = {}
        for name, tr in self.trainers.items():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            tr.step()
            torch.cuda.synchronize()
            out[name] = torch.cuda.max_memory_allocated() - base + tr.state_bytes()
        return out
