"""`python -m ablations.bench [hydra overrides] [options]`: the machine's ceilings and how close the model gets.

Prints one table of figures for the composed config (and writes JSON; `--mlflow` also logs it):

- ceilings: dense GEMM throughput at fp32 and bf16 and memory bandwidth (read, copy), measured here;
- train: training tokens/sec and MFU of a bare PyTorch loop (no Lightning, no logging) at 32-true, bf16-mixed and
  bf16-mixed + torch.compile, and the loss each reached after the same steps on the same batches;
- harness: the same model trained through `ablations.train.train` (Lightning + Hydra + MLflow), over the bare loop;
- inference: batch-1 prefill tokens/sec, and batch-1 greedy decode tokens/sec with and without the KV cache at
  several context lengths, the cache bytes measured (and predicted), and the decode ceiling (read bandwidth / bytes
  read per token) with the fraction of it reached;
- startup: seconds from launching `python -m ablations.run` to the end of its first optimizer step;
- scaling: step time and activation memory against context length and width, measured KV-cache bytes of every
  attention variant;
- variants: every registered variant of every family (modules.registry; its shipped options from conf/<family>/)
  swapped into the composed model one at a time: training tokens/s at the model's block size, batch-1 prefill and
  decode tokens/s at one context (default 1024), the KV-cache bytes, and each as a fraction of its analytic bound
  (FLOPs against the measured GEMM peak for training and prefill, bytes read per token against the measured read
  bandwidth for decode), so an implementation that falls behind its own bound shows, whatever its speed.

Definitions. MFU = flops_per_token (modules.accounting: 6N + attention) x tokens/sec / the measured dense GEMM peak
of the precision the matmuls run in (fp32 for 32-true, bf16 for bf16-mixed), or `--peak-flops` when given (e.g. a
GPU's datasheet figure). The machine is shared and noisy, so every figure of a section is measured in interleaved
rounds (A B C A B C ...) and the best round of each is kept: ratios between rows are side by side.

Options: --json PATH (default bench.json), --mlflow, --quick (short windows), --only/--skip SECTION[,SECTION],
--threads N, --device cpu|cuda, --contexts C1,C2,... (decode/prefill contexts), --new-tokens N, --no-compile,
--inference-dtype fp32|bf16, --peak-flops F (bf16 peak for MFU, e.g. 989e12), --rounds N, --steps N (train only N
steps per variant, for a dry run).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .generation import decode_cached, decode_uncached, prefill  # the generation measurements train() makes too
from .generation import sync as _sync
from modules.errors import AblationsError, ConfigError

REPO = Path(__file__).resolve().parents[1]
SECTIONS = ("ceilings", "train", "harness", "inference", "startup", "scaling", "variants")
FAMILIES = ("position", "norm", "mlp", "attention")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ----------------------------------------------------------------------------------------------------------------
# timing


def interleaved(items: dict, seconds: float, rounds: int, device: str = "cpu", warmup: int = 1) -> dict:
    """Measure the rate of each item side by side: `rounds` rounds, each giving every item about `seconds`.

    items: name -> fn() that does one unit of work and returns its amount (tokens, FLOPs, bytes). Returns name ->
    {"best": amount/sec of the fastest call, "best_round": of the best round, "median": median of the rounds}.
    Interleaving puts every item through the same phases of other people's load. On a shared machine with several
    threads, one descheduled thread stalls every parallel region (a 7 ms step can take 400 ms), so the fastest call
    is the best estimate of an idle machine; it is what the table shows, for peaks and workloads alike.
    """
    for fn in items.values():
        for _ in range(warmup):
            fn()
    _sync(device)
    rounds_rate: dict[str, list[float]] = {name: [] for name in items}
    best: dict[str, float] = {name: 0.0 for name in items}
    for _ in range(rounds):
        for name, fn in items.items():
            amount, t0 = 0.0, time.perf_counter()
            while True:
                t_call = time.perf_counter()
                a = fn()
                _sync(device)
                now = time.perf_counter()
                amount += a
                best[name] = max(best[name], a / (now - t_call))
                if now - t0 >= seconds:
                    break
            rounds_rate[name].append(amount / (now - t0))
    return {name: {"best": best[name], "best_round": max(r), "median": sorted(r)[len(r) // 2]}
            for name, r in rounds_rate.items()}


def _best_time(fn, reps: int, device: str = "cpu") -> float:
    """Fastest of `reps` timed calls of fn() (after one untimed call)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


# ----------------------------------------------------------------------------------------------------------------
# ceilings


def gemm_item(dtype: torch.dtype, device: str, n: int):
    """One n x n x n matmul per call; returns its FLOPs. Large enough to be compute-bound (the practical peak)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return lambda: (torch.mm(a, b), 2.0 * n**3)[1]


def bandwidth_items(device: str, nbytes: int) -> dict:
    """Read (a sum: reads nbytes, writes nothing) and copy (reads and writes nbytes) over buffers far larger than
    any cache. Decoding one token mostly reads weights, so the read figure is its ceiling."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return {"read bandwidth": lambda: (src.sum(), float(nbytes))[1],
            "copy bandwidth": lambda: (dst.copy_(src), 2.0 * nbytes)[1]}


# ----------------------------------------------------------------------------------------------------------------
# config and model


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def build_model(model_cfg: dict, device: str = "cpu"):
    from modules.gpt import GPT

    return GPT.from_config(model_cfg).to(device)


def _model_dict(cfg) -> dict:
    from omegaconf import OmegaConf

    model = OmegaConf.to_container(cfg.model, resolve=True)
    if model.get("vocab_size") is None:  # char tokenizer: vocabulary size is only known after reading the corpus
        model["vocab_size"] = 65
    return model


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


# ----------------------------------------------------------------------------------------------------------------
# training: the bare loop (no Lightning, no logging) the harness is compared against


class BareTrainer:
    """One model + AdamW stepping through fixed batches: the fastest honest training step we know.

    As the harness: AdamW (decay on matrices only), gradient clipping at 1.0, cross-entropy in fp32, bf16-mixed =
    torch.autocast(bfloat16) around the forward with fp32 weights and optimizer. Faster than a naive loop by:
    fused AdamW (one kernel per parameter instead of ~10 elementwise ops) and foreach gradient clipping.
    """

    def __init__(self, model_cfg: dict, batches: torch.Tensor, precision: str, compiled: bool, optim: dict,
                 device: str = "cpu", warmup_steps: int = 10):
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
        self.fwd = torch.compile(self.model) if compiled else self.model
        dev_type = torch.device(device).type
        self.autocast = (lambda: torch.autocast(dev_type, dtype=torch.bfloat16)) if precision == "bf16-mixed" \
            else contextlib.nullcontext
        self.step_idx, self.losses = 0, []

    def step(self) -> float:
        batch = self.batches[self.step_idx % len(self.batches)]
        x, y = batch[:, :-1], batch[:, 1:]  # targets are the inputs shifted by one
        for g in self.opt.param_groups:  # linear warm-up, then constant: enough for a loss comparison
            g["lr"] = self.lr * min(1.0, (self.step_idx + 1) / self.warmup)
        with self.autocast():
            logits = self.fwd(x)
        loss = F.cross_entropy(logits.float().view(-1, self.V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=True)
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


def harness_tokens_per_sec(overrides: list[str], steps: int) -> dict:
    """Train through the real harness (Lightning + MLflow on a throwaway SQLite store) and read its figure."""
    from ablations.train import train

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose(overrides + [
            f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=2",
            "trainer.enable_progress_bar=false", f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            "tracking.experiment=bench", f"checkpoint.dir={tmp}/checkpoints",
            "generate.max_new_tokens=4", "generate.bench_decode_tokens=4", "generate.bench_prefill_tokens=16",
        ])
        old = os.getcwd()
        os.chdir(tmp)
        try:
            return train(cfg)
        finally:
            os.chdir(old)


# ----------------------------------------------------------------------------------------------------------------
# inference (batch 1, greedy): the same forward calls `GPT.generate` makes


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


# ----------------------------------------------------------------------------------------------------------------
# start-up


_FIRST_STEP_HOOK = """
import sys, time, runpy, torch.optim.optimizer as o
_out = sys.argv.pop(1)
def _hook(opt, args, kwargs):
    if not getattr(_hook, "done", False):
        _hook.done = True
        open(_out, "w").write(repr(time.time()))
o.register_optimizer_step_post_hook(_hook)
sys.argv[0] = "ablations/run.py"
runpy.run_module("ablations.run", run_name="__main__", alter_sys=False)
"""


def startup_seconds(overrides: list[str]) -> dict:
    """Launch `python -m ablations.run` for one optimizer step; a global optimizer hook (installed before the
    harness starts: it costs what `import torch` costs, which the harness pays anyway) records when that step
    ended. first_step_sec = that moment minus the launch, in wall-clock seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        stamp = Path(tmp) / "first_step"
        cmd = [sys.executable, "-c", _FIRST_STEP_HOOK, str(stamp), *overrides, "trainer.max_steps=1",
               "trainer.val_check_interval=1", "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false",
               f"tracking.uri=sqlite:///{tmp}/mlflow.db", "tracking.experiment=startup",
               f"checkpoint.dir={tmp}/checkpoints", "generate.max_new_tokens=4", "generate.bench_decode_tokens=4"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        t_launch = time.time()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env=env)
        wall = time.time() - t_launch
        if not stamp.exists():
            err = (proc.stderr or proc.stdout).strip().splitlines()
            return {"error": err[-1] if err else f"exit {proc.returncode}, no optimizer step"}
        return {"first_step_sec": float(stamp.read_text()) - t_launch, "whole_command_sec": wall}


# ----------------------------------------------------------------------------------------------------------------
# the report


def _fmt(value, unit="", digits=3):
    if value is None:
        return "n/a"
    if isinstance(value, (float, int)):
        value = float(value)
        for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= scale:
                return f"{value / scale:.{digits}g} {prefix}{unit}".strip()
        return f"{value:.{digits}g} {unit}".strip()
    return f"{value} {unit}".strip()


def run(overrides: list[str], sections: tuple[str, ...], opts: dict) -> dict:
    from modules import accounting

    quick, device = opts["quick"], opts["device"]
    window = opts.get("window") or (0.25 if quick else 1.0)
    rounds = opts.get("rounds") or (2 if quick else 3)
    cfg = compose(overrides)
    model_cfg = _model_dict(cfg)
    batch_size = int(cfg.data.batch_size)
    T, V = model_cfg["block_size"], model_cfg["vocab_size"]
    flops_tok = accounting.flops_per_token(model_cfg)
    out: dict = {"overrides": overrides, "model": model_cfg, "batch_size": batch_size, "device": device,
                 "threads": torch.get_num_threads(), "torch": torch.__version__,
                 "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                 "flops_per_token": flops_tok, **accounting.param_counts(model_cfg)}
    if device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name()
    rows: list[tuple[str, str]] = []
    log = opts.get("log", lambda msg: None)
    if "inference" in sections:
        decode_contexts(T, opts)  # refuse bad --contexts before measuring anything
    if "variants" in sections:
        variant_context(opts)

    # --- ceilings, and training variants measured in the same interleaved rounds --------------------------------
    need_peaks = any(s in sections for s in ("ceilings", "train", "inference"))
    items: dict = {}
    if need_peaks:
        n = 8192 if device.startswith("cuda") else (1024 if quick else 2048)
        items["gemm fp32"] = gemm_item(torch.float32, device, n)
        items["gemm bf16"] = gemm_item(torch.bfloat16, device, n)
        items.update(bandwidth_items(device, (1024 if device.startswith("cuda") else 256) * 2**20))
    trainers: dict[str, BareTrainer] = {}
    if "train" in sections:
        batches, data_name = training_batches(V, batch_size, T, n=16 if quick else 64)
        out["train_data"] = data_name
        variants = [("32-true", "32-true", False), ("bf16-mixed", "bf16-mixed", False)]
        if not opts["no_compile"]:
            variants.append(("bf16-mixed+compile", "bf16-mixed", True))
        for name, precision, compiled in variants:
            log(f"building {name}" + (" (torch.compile: the first steps compile, tens of seconds)" if compiled else ""))
            trainers[name] = BareTrainer(model_cfg, batches, precision, compiled, cfg.optim, device)
            items[name] = trainers[name].step
    if items:
        if opts.get("steps"):  # dry run: a fixed number of steps per variant, no timing rounds
            res = {}
            for name, fn in items.items():
                fn()  # warm-up (and compile)
                _sync(device)
                t0 = time.perf_counter()
                amount = sum(fn() for _ in range(opts["steps"]))
                _sync(device)
                rate = amount / (time.perf_counter() - t0)
                res[name] = {"best": rate, "best_round": rate, "median": rate}
        else:
            log(f"measuring {', '.join(items)} in {rounds} interleaved rounds of {window:g} s each")
            res = interleaved(items, window, rounds, device, warmup=2 if "bf16-mixed+compile" in items else 1)
    peak = {}
    if need_peaks:
        peak = {"32-true": res["gemm fp32"]["best"], "bf16-mixed": res["gemm bf16"]["best"]}
        out["gemm_flops"] = {"fp32": peak["32-true"], "bf16": peak["bf16-mixed"]}
        out["bandwidth_bytes_per_sec"] = {"read": res["read bandwidth"]["best"], "copy": res["copy bandwidth"]["best"]}
        # shown whenever measured: the MFU and decode-ceiling rows below are relative to them
        rows += [("GEMM fp32 (measured peak)", _fmt(peak["32-true"], "FLOP/s")),
                 ("GEMM bf16 (measured peak)", f"{_fmt(peak['bf16-mixed'], 'FLOP/s')}  "
                                               f"({peak['bf16-mixed'] / peak['32-true']:.2f}x fp32)"),
                 ("memory bandwidth read / copy", f"{_fmt(res['read bandwidth']['best'], 'B/s')} / "
                                                  f"{_fmt(res['copy bandwidth']['best'], 'B/s')}")]
    mfu_peak = dict(peak)
    if opts.get("peak_flops"):  # a configured (datasheet) bf16 peak, e.g. a GPU's dense bf16 TFLOP/s
        mfu_peak["bf16-mixed"] = float(opts["peak_flops"])
    out["mfu_peak_flops"] = mfu_peak
    out["mfu_peak_source"] = "configured (bf16)" if opts.get("peak_flops") else "measured"

    if "train" in sections:
        steps_done = min(len(t.losses) for t in trainers.values())
        k = max(1, min(5, steps_done // 4))
        train_rows = {}
        for name, tr in trainers.items():
            precision = "32-true" if name == "32-true" else "bf16-mixed"
            tps = res[name]["best"]
            loss = float(torch.stack(tr.losses[steps_done - k:steps_done]).mean())
            r = {"tokens_per_sec": tps, "tokens_per_sec_best_round": res[name].get("best_round"),
                 "tokens_per_sec_median": res[name]["median"],
                 "mfu": tps * flops_tok / mfu_peak[precision], "steps": len(tr.losses),
                 "loss_at_step": {"step": steps_done, "loss": loss}}
            train_rows[name] = r
            rows.append((f"bare loop {name}", f"{_fmt(tps, 'tok/s')}  MFU {r['mfu']:.1%} of {precision} peak  "
                                              f"loss@{steps_done} {loss:.3f}"))
        if device.startswith("cuda"):  # peak memory of one step of each variant: its resident state + the step's
            for name, tr in trainers.items():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                tr.step()
                torch.cuda.synchronize()
                train_rows[name]["peak_memory_bytes"] = torch.cuda.max_memory_allocated() - base + tr.state_bytes()
                rows.append((f"peak memory {name}", _fmt(float(train_rows[name]["peak_memory_bytes"]), "B")))
        out["train_bare"] = train_rows
        out["train_loss_data"] = out.pop("train_data")
        speedup = train_rows["bf16-mixed"]["tokens_per_sec"] / train_rows["32-true"]["tokens_per_sec"]
        out["bf16_speedup"] = speedup
        rows.append(("bf16-mixed / 32-true tokens/sec", f"{speedup:.2f}x  (losses above on {out['train_loss_data']}, "
                                                        f"same batches and init)"))
        if "bf16-mixed+compile" in train_rows:
            c = train_rows["bf16-mixed+compile"]["tokens_per_sec"] / train_rows["bf16-mixed"]["tokens_per_sec"]
            out["compile_speedup"] = c
            rows.append(("compile / eager (bf16-mixed)", f"{c:.2f}x"))
        del trainers, items

    if "harness" in sections:
        steps = 30 if quick else 120
        harness = {}
        for precision in ("32-true", "bf16-mixed"):
            log(f"harness {precision}: {steps} steps through ablations.train.train")
            try:
                r = harness_tokens_per_sec(overrides + [f"trainer.precision={precision}"], steps)
            except AblationsError as e:  # the harness refused this config: report it, keep the other sections
                harness[precision] = {"error": f"{type(e).__name__}: {e}"}
                rows.append((f"harness {precision}", f"error: {type(e).__name__}: {str(e)[:120]}"))
                continue
            # the harness reports throughput over whole logging windows: compare with the bare loop's best window
            bare = out.get("train_bare", {}).get(precision, {}).get("tokens_per_sec_best_round")
            ratio = r["tokens_per_sec"] / bare if bare and r.get("tokens_per_sec") else None
            harness[precision] = {"harness_tokens_per_sec": r.get("tokens_per_sec"), "harness_mfu": r.get("mfu"),
                                  "bare_tokens_per_sec": bare, "ratio": ratio}
            rows.append((f"harness {precision}", f"{_fmt(r.get('tokens_per_sec'), 'tok/s')}"
                         + (f"  = {ratio:.3f} of the bare loop's best 1-round throughput ({_fmt(bare, 'tok/s')})"
                            if ratio else "  (run the train section for the ratio)")))
        out["harness"] = harness

    if "inference" in sections:
        out["inference"] = inference_figures(model_cfg, out, rows, opts, window)

    if "startup" in sections:
        log("startup: launching python -m ablations.run for one step")
        out["startup"] = s = startup_seconds(overrides)
        rows.append(("launch -> first optimizer step", "error: " + s["error"] if "error" in s else
                     f"{s['first_step_sec']:.2f} s  (whole 1-step command {s['whole_command_sec']:.1f} s)"))

    if "scaling" in sections:
        out["scaling"] = scaling_figures(model_cfg, window, rows, device)

    if "variants" in sections:
        out["variants"] = variants_figures(model_cfg, cfg, opts, window, rounds, rows)

    out["table"] = rows
    return out


def decode_contexts(T: int, opts: dict) -> tuple[int, list[int]]:
    """(new tokens per decode measurement, decode contexts); each context + new tokens must fit in block_size."""
    new = opts.get("new_tokens") or (8 if opts["quick"] else 32)
    contexts = opts.get("contexts")
    if contexts is None:
        contexts = sorted({c for c in (T // 8, T // 4, T // 2, T - new) if c >= 8}) or [max(1, T - new)]
    too_long = [c for c in contexts if c + new > T or c < 1]
    if too_long:
        raise SystemExit(f"ablations.bench: decode context {too_long[0]} + {new} new tokens must fit in "
                         f"model.block_size={T}; add model.block_size={too_long[0] + new} (or larger) to the "
                         f"overrides, or lower --new-tokens")
    return new, contexts


def inference_figures(model_cfg: dict, out: dict, rows: list, opts: dict, window: float) -> dict:
    from modules import accounting

    device, quick = opts["device"], opts["quick"]
    T = model_cfg["block_size"]
    dtype = DTYPES[opts["inference_dtype"]]
    new, contexts = decode_contexts(T, opts)
    torch.manual_seed(0)
    model = build_model(model_cfg, device).to(dtype).eval()
    weight_bytes = weight_bytes_read_per_token(model)
    result = {"dtype": opts["inference_dtype"], "new_tokens": new, "weight_bytes_per_token": weight_bytes,
              "prefill": {}, "decode": {}}
    reps = 2 if quick else 3
    prompts = {c: torch.randint(0, model_cfg["vocab_size"], (1, c), device=device) for c in sorted({*contexts, T})}
    for c, prompt in prompts.items():
        sec = _best_time(lambda: prefill(model, prompt, dtype), reps, device)
        result["prefill"][c] = c / sec
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
    for c in contexts:
        prompt = prompts[c]
        nocache = decode_uncached(model, prompt, new, window, device)
        per_tok_c, nbytes_c = per_tok[c], nbytes[c]
        analytic = accounting.kv_cache_bytes(model_cfg, c, batch_size=1, dtype=dtype)
        # one decode step reads every weight once and the whole cache (at context c .. c+new; the middle)
        bytes_per_tok = weight_bytes + accounting.kv_cache_bytes(model_cfg, c + new // 2, 1, dtype)
        ceiling = read_bw / bytes_per_tok
        d = {"cached_tokens_per_sec": 1 / per_tok_c, "nocache_tokens_per_sec": 1 / nocache,
             "speedup": nocache / per_tok_c, "cache_bytes_measured": nbytes_c, "cache_bytes_analytic": analytic,
             "bytes_read_per_token": bytes_per_tok, "ceiling_tokens_per_sec": ceiling,
             "fraction_of_ceiling": (1 / per_tok_c) / ceiling}
        result["decode"][c] = d
        rows.append((f"decode b=1 ctx={c} ({opts['inference_dtype']})",
                     f"cache {_fmt(d['cached_tokens_per_sec'], 'tok/s')}  no-cache "
                     f"{_fmt(d['nocache_tokens_per_sec'], 'tok/s')}  x{d['speedup']:.1f}  "
                     f"{d['fraction_of_ceiling']:.0%} of ceiling {_fmt(ceiling, 'tok/s')}  "
                     f"cache {_fmt(float(nbytes_c), 'B')}" + ("" if nbytes_c == analytic else
                                                            f" (analytic {_fmt(float(analytic), 'B')}!)")))
    rows.append(("decode ceiling bandwidth (read)", f"{_fmt(read_bw, 'B/s')} (interleaved with the decode rounds)"))
    rows.append(("prefill b=1 tok/s by ctx", "  ".join(f"{c}: {_fmt(v)}" for c, v in result["prefill"].items())))
    return result


def scaling_figures(base: dict, window: float, rows: list, device: str = "cpu") -> dict:
    """Step time and activation memory against context length and width (batch 4, fp32); measured KV-cache bytes
    of every attention variant."""
    from modules import accounting

    result = {"context": {}, "width": {}, "kv_cache": {}}

    def step_cost(model_cfg):
        torch.manual_seed(0)
        model = build_model(model_cfg, device)
        T, V = model_cfg["block_size"], model_cfg["vocab_size"]
        x = torch.randint(0, V, (4, T + 1), device=device)

        def step():
            loss = F.cross_entropy(model(x[:, :-1]).view(-1, V), x[:, 1:].reshape(-1))
            loss.backward()
            model.zero_grad(set_to_none=True)

        sec = _best_time(step, 3, device)
        return sec, activation_bytes(model, x[:, :-1])

    for T in (base["block_size"] // 2, base["block_size"], base["block_size"] * 2, base["block_size"] * 4):
        sec, mem = step_cost({**base, "block_size": T})
        result["context"][T] = {"step_sec": sec, "activation_bytes": mem}
    for d in (base["n_embd"] // 2, base["n_embd"], base["n_embd"] * 2):
        sec, mem = step_cost({**base, "n_embd": d})
        result["width"][d] = {"step_sec": sec, "activation_bytes": mem}
    for key, label in (("context", "ctx"), ("width", "d")):
        rows.append((f"scaling by {key} (b=4 fp32 fwd+bwd)", "  ".join(
            f"{label}={k}: {v['step_sec'] * 1e3:.1f} ms {_fmt(float(v['activation_bytes']), 'B')}"
            for k, v in result[key].items())))
    T = base["block_size"]
    cells = []
    for name, att in attention_variants(T).items():
        model_cfg = {**base, "attention": att}
        try:
            model = build_model(model_cfg, device).eval()
        except ConfigError as e:  # a variant whose shipped options do not fit this model size: say so, go on
            result["kv_cache"][name] = {"skipped": str(e)}
            cells.append(f"{name} skipped ({e})")
            continue
        cache = model.new_cache(batch_size=1, dtype=torch.bfloat16)
        with torch.no_grad():
            model(torch.randint(0, base["vocab_size"], (1, T), device=device), cache=cache)
        measured = int(cache.nbytes)
        analytic = accounting.kv_cache_bytes(model_cfg, T, batch_size=1, dtype=torch.bfloat16)
        result["kv_cache"][name] = {"measured_bytes": measured, "analytic_bytes": analytic}
        cells.append(f"{name} {_fmt(float(measured), 'B')}" + ("" if measured == analytic else "(!)"))
    rows.append((f"kv cache bf16 ctx={T} (measured)", "  ".join(cells)))
    return result


def attention_variants(block_size: int) -> dict[str, dict]:
    """Every registered attention variant (modules.registry) with its shipped options (conf/attention/<name>.yaml);
    a variant with a `window` option gets a quarter of the context, so that the window shows in the cache size."""
    import dataclasses

    from omegaconf import OmegaConf

    from modules.registry import names, variant

    out = {}
    for name in names("attention"):
        att = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "attention" / f"{name}.yaml"), resolve=True)
        if "window" in {f.name for f in dataclasses.fields(variant("attention", name).Options)}:
            att["window"] = max(1, block_size // 4)
        out[name] = att
    return out


# ----------------------------------------------------------------------------------------------------------------
# variants: every registered variant at its best implementation, against its own analytic bound


def variant_configs(base: dict) -> dict[str, dict]:
    """label -> model config: the composed model ("baseline"), then every other registered variant of each family
    (modules.registry) swapped in alone, with its shipped options (conf/<family>/<name>.yaml)."""
    from omegaconf import OmegaConf

    from modules.registry import names

    out = {"baseline": base}
    for family in FAMILIES:
        for name in names(family):
            if name == base[family]["name"]:
                continue
            opts = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / family / f"{name}.yaml"), resolve=True)
            out[f"{family}={name}"] = {**base, family: opts}
    return out


def variant_context(opts: dict) -> tuple[int, int]:
    """(decode/prefill context, new tokens per decode measurement) of the variants section."""
    c = max(opts["contexts"]) if opts.get("contexts") else 1024
    new = opts.get("new_tokens") or (8 if opts["quick"] else 32)
    if c < 1 or new < 1:
        raise SystemExit(f"ablations.bench: variants need a context >= 1 and --new-tokens >= 1 (got {c}, {new})")
    return c, new


def _timed_rate(fn, seconds: float, device: str) -> float:
    """Amount per second of repeated fn() calls (each returns its amount) over at least `seconds`, >= 1 call."""
    _sync(device)
    amount, t0 = 0.0, time.perf_counter()
    while True:
        amount += fn()
        _sync(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return amount / elapsed




def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def variants_figures(base: dict, cfg, opts: dict, window: float, rounds: int, rows: list) -> dict:
    """Per variant (variant_configs): medians over `rounds` interleaved rounds (A B C ..., A B C ...) of training
    tokens/s (steps for `window` seconds), prefill tokens/s (prefills for `window` seconds) and decode tokens/s
    (one untimed prefill, then `new` timed steps) at the section's context, and their fractions of the analytic
    bounds.

    Bounds. Training: GEMM peak / flops_per_token(cfg) at block_size (modules.accounting, 6N + attention).
    Prefill of c tokens: GEMM peak / (flops_per_token(cfg, seq_len=(c+1)//2) / 3): the forward third, each query
    attending on average to (c+1)/2 keys (causal), capped by a window. Decode: read bandwidth / (weights read per
    step + the KV cache at context c + new/2). Peaks are the best call of the rounds (the practical ceiling of this
    machine, as in the ceilings section); the variants' figures are medians, so a fraction is conservative.
    Training runs in the bare loop (BareTrainer: fused AdamW, fp32 cross-entropy) at 32-true on CPU, bf16-mixed on
    CUDA; inference in --inference-dtype. The inference models have block_size max(block_size, c + new) so that a
    learned position table reaches c; their other weights are the training model's shapes."""
    from modules import accounting

    device, log = opts["device"], opts.get("log", lambda msg: None)
    c, new = variant_context(opts)
    T, V = base["block_size"], base["vocab_size"]
    precision = "bf16-mixed" if device.startswith("cuda") else "32-true"
    dtype = DTYPES[opts["inference_dtype"]]
    batch_size = int(cfg.data.batch_size)
    batches, _ = training_batches(V, batch_size, T, n=8)
    prompt = torch.randint(0, V, (1, c), generator=torch.Generator().manual_seed(0)).to(device)
    n = 8192 if device.startswith("cuda") else (1024 if opts["quick"] else 2048)
    infer_prec = "bf16-mixed" if dtype == torch.bfloat16 else "32-true"
    gemm = {p: gemm_item(torch.bfloat16 if p == "bf16-mixed" else torch.float32, device, n)
            for p in dict.fromkeys((precision, infer_prec))}  # only the peaks a bound uses
    read = bandwidth_items(device, (1024 if device.startswith("cuda") else 256) * 2**20)["read bandwidth"]

    arms, skipped = {}, {}
    for label, model_cfg in variant_configs(base).items():
        infer_cfg = {**model_cfg, "block_size": max(T, c + new)}
        try:
            trainer = BareTrainer(model_cfg, batches, precision, False, cfg.optim, device)
            torch.manual_seed(0)
            model = build_model(infer_cfg, device).to(dtype).eval()
        except ConfigError as e:  # shipped options that do not fit this model: say so, measure the others
            skipped[label] = str(e)
            continue
        arms[label] = {"cfg": model_cfg, "infer_cfg": infer_cfg, "trainer": trainer, "model": model,
                       "train": [], "prefill": [], "decode": []}
        trainer.step()  # warm-up: allocations, the first kernels
        prefill(model, prompt, dtype)
        decode_cached(model, prompt, 2, dtype, device)
    peak = {p: 0.0 for p in gemm}
    read_bw = 0.0
    nbytes: dict[str, int] = {}
    log(f"variants: {len(arms)} variants x {rounds} interleaved rounds (train, prefill {c}, decode {c}+{new}), "
        f"~{window:g} s each")
    for r in range(rounds):
        for prec, fn in gemm.items():
            peak[prec] = max(peak[prec], _best_rate(fn, device))
        read_bw = max(read_bw, _best_rate(read, device))
        # measurement-major (every arm's training, then every arm's prefill, ...): the arms of one comparison are
        # timed seconds apart, not a whole round apart, so they meet the same load
        for a in arms.values():
            a["train"].append(_timed_rate(a["trainer"].step, window, device))
        for a in arms.values():
            a["prefill"].append(_timed_rate(lambda m=a["model"]: (prefill(m, prompt, dtype), c)[1], window, device))
        for label, a in arms.items():
            # one prefill (untimed: at long contexts it costs more than the decode) and `new` timed steps
            sec_per_tok, nbytes[label], _ = decode_cached(a["model"], prompt, new, dtype, device)
            a["decode"].append(1 / sec_per_tok)
        log(f"variants: round {r + 1}/{rounds} done")
    peak_infer = peak[infer_prec]
    if opts.get("peak_flops") and precision == "bf16-mixed":  # a configured (datasheet) bf16 peak for training
        peak["bf16-mixed"] = float(opts["peak_flops"])

    result = {"context": c, "new_tokens": new, "block_size": T, "batch_size": batch_size, "rounds": rounds,
              "train_precision": precision, "inference_dtype": opts["inference_dtype"],
              "gemm_peak_flops": peak, "read_bandwidth": read_bw, "skipped": skipped, "variants": {}}
    for label, a in arms.items():
        model_cfg, infer_cfg = a["cfg"], a["infer_cfg"]
        train_bound = peak[precision] / accounting.flops_per_token(model_cfg)
        prefill_bound = peak_infer / (accounting.flops_per_token(infer_cfg, seq_len=(c + 1) // 2) / 3)
        bytes_per_tok = (weight_bytes_read_per_token(a["model"])
                         + accounting.kv_cache_bytes(infer_cfg, c + new // 2, 1, dtype))
        decode_bound = read_bw / bytes_per_tok
        med = {k: _median(a[k]) for k in ("train", "prefill", "decode")}
        result["variants"][label] = {
            "family": label.split("=")[0] if "=" in label else None,
            "train_tokens_per_sec": med["train"], "train_bound": train_bound,
            "train_fraction": med["train"] / train_bound,
            "prefill_tokens_per_sec": med["prefill"], "prefill_bound": prefill_bound,
            "prefill_fraction": med["prefill"] / prefill_bound,
            "decode_tokens_per_sec": med["decode"], "decode_bound": decode_bound,
            "decode_fraction": med["decode"] / decode_bound,
            "decode_bytes_per_token": bytes_per_tok,
            "cache_bytes": nbytes[label],
            "cache_bytes_analytic": accounting.kv_cache_bytes(infer_cfg, c, 1, dtype),
            "rounds": {k: a[k] for k in ("train", "prefill", "decode")},
        }
    # paired ratios to the baseline: per round, then the median (the rounds share the machine's load)
    ref = arms.get("baseline")
    for label, a in arms.items():
        v = result["variants"][label]
        for k in ("train", "prefill", "decode"):
            v[f"{k}_vs_baseline"] = _median([x / y for x, y in zip(a[k], ref[k])]) if ref else None
    del arms

    rows.append((f"variants: bounds ({rounds} rounds)",
                 f"GEMM {precision} {_fmt(peak[precision], 'FLOP/s')}, read {_fmt(read_bw, 'B/s')}; train b="
                 f"{batch_size} T={T} {precision}, prefill/decode ctx {c} {opts['inference_dtype']}; "
                 f"medians, (fraction of bound), x baseline"))
    for label, v in result["variants"].items():
        rows.append((f"variant {label}",
                     f"train {_fmt(v['train_tokens_per_sec'], 'tok/s')} ({v['train_fraction']:.0%}) "
                     f"x{v['train_vs_baseline']:.2f}  prefill {_fmt(v['prefill_tokens_per_sec'], 'tok/s')} "
                     f"({v['prefill_fraction']:.0%}) x{v['prefill_vs_baseline']:.2f}  decode "
                     f"{_fmt(v['decode_tokens_per_sec'], 'tok/s')} ({v['decode_fraction']:.0%}) "
                     f"x{v['decode_vs_baseline']:.2f}  cache {_fmt(float(v['cache_bytes']), 'B')}"
                     + ("" if v["cache_bytes"] == v["cache_bytes_analytic"] else "(!)")))
    for label, why in skipped.items():
        rows.append((f"variant {label}", f"skipped: {why}"))
    return result


def _best_rate(fn, device: str, calls: int = 3) -> float:
    """The fastest of `calls` calls of fn() (a ceiling: the machine at its least disturbed), amount/sec."""
    best = 0.0
    for _ in range(calls):
        _sync(device)
        t0 = time.perf_counter()
        a = fn()
        _sync(device)
        best = max(best, a / (time.perf_counter() - t0))
    return best


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


# ----------------------------------------------------------------------------------------------------------------
# command line

USAGE = ("python -m ablations.bench [hydra overrides] [--json PATH] [--mlflow] [--quick] [--only|--skip S[,S]] "
         "[--threads N] [--device cpu|cuda] [--contexts C,C] [--new-tokens N] [--no-compile] "
         "[--inference-dtype fp32|bf16] [--peak-flops F] [--rounds N] [--window SEC] [--steps N]; "
         f"sections: {','.join(SECTIONS)}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and a non-zero exit, like every command of the harness
        raise SystemExit(f"ablations.bench: {message}; usage: {USAGE}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ablations.bench", usage=USAGE, add_help=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--json", type=Path, default=Path("bench.json"))
    p.add_argument("--mlflow", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-compile", dest="no_compile", action="store_true")
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default="cpu")
    p.add_argument("--contexts", type=lambda v: [int(c) for c in v.split(",")])
    p.add_argument("--new-tokens", dest="new_tokens", type=int)
    p.add_argument("--inference-dtype", dest="inference_dtype", default="fp32")
    p.add_argument("--peak-flops", dest="peak_flops", type=float)
    p.add_argument("--rounds", type=int)
    p.add_argument("--window", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--only")
    p.add_argument("--skip")
    return p


def parse_args(argv: list[str]) -> tuple[list[str], list[str], dict]:
    """-> (Hydra overrides, sections to run, options). Anything that is not an option is a Hydra override."""
    ns, rest = _parser().parse_known_args(argv)
    if ns.help:
        raise SystemExit(USAGE)
    unknown = [a for a in rest if a.startswith("-")]
    if unknown:
        raise SystemExit(f"ablations.bench: unknown option {unknown[0]!r}; usage: {USAGE}")
    overrides = list(rest)
    sections = ns.only.split(",") if ns.only else list(SECTIONS)
    if ns.skip:
        sections = [s for s in sections if s not in ns.skip.split(",")]
    opts = {k: v for k, v in vars(ns).items() if k not in ("help", "only", "skip")}
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        raise SystemExit(f"ablations.bench: unknown section {bad[0]!r}; choose from {','.join(SECTIONS)}")
    if opts["inference_dtype"] not in DTYPES:
        raise SystemExit(f"ablations.bench: --inference-dtype must be one of {','.join(DTYPES)}")
    if opts["device"].startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("ablations.bench: --device cuda but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}); install a CUDA build of torch or use --device cpu")
    return overrides, sections, opts


def main(argv: list[str] | None = None) -> int:
    overrides, sections, opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    if opts["threads"]:
        torch.set_num_threads(opts["threads"])
    if opts["device"].startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # "fp32" means fp32: the 32-true peak and MFU stay honest
    opts["log"] = lambda msg: print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    out = run(overrides, tuple(sections), opts)
    out["bench_wall_sec"] = time.perf_counter() - start
    width = max((len(k) for k, _ in out["table"]), default=0)
    load = f"  load={out['load_average']:.1f}" if out.get("load_average") is not None else ""
    print(f"ablations.bench  {' '.join(overrides) or '(defaults)'}  device={out['device']}"
          f"{' (' + out['gpu'] + ')' if out.get('gpu') else ''}  threads={out['threads']}{load}  "
          f"params={out['params']:,}  flops/token={out['flops_per_token']:,}  batch={out['batch_size']}")
    cores = os.cpu_count() or 1
    if out.get("load_average") is not None and out["threads"] > 1 and out["load_average"] > 0.5:
        print(f"  note: load average {out['load_average']:.1f} on {cores} cores when the bench started: with "
              f"{out['threads']} threads, each parallel op waits for its slowest (descheduled) thread; if figures "
              f"look erratic, rerun with --threads 1")
    for k, v in out["table"]:
        print(f"  {k:<{width}}  {v}")
    print(f"  (bench took {out['bench_wall_sec']:.0f} s; JSON in {opts['json']})")
    opts["json"].parent.mkdir(parents=True, exist_ok=True)
    opts["json"].write_text(json.dumps(out, indent=2, default=str))
    if opts["mlflow"]:
        _log_to_mlflow(out)
    return 0


def _log_to_mlflow(out: dict) -> None:
    import mlflow

    from .tracking import tracking_uri

    # the harness's rule (tracking.uri override, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)
    mlflow.set_tracking_uri(tracking_uri(compose(out["overrides"])))
    mlflow.set_experiment("bench")
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[prefix.replace("+", "_")] = float(value)

    walk("", {k: v for k, v in out.items() if k not in ("table", "model", "overrides")})
    with mlflow.start_run(run_name=" ".join(out["overrides"]) or "default"):
        mlflow.log_metrics(flat)
        mlflow.set_tags({"device": out["device"], "threads": out["threads"], "torch_version": out["torch"],
                         "mfu_peak_source": out["mfu_peak_source"]})
        mlflow.log_dict(out, "bench.json")


if __name__ == "__main__":
    sys.exit(main())
