"""`python -m ablations.bench [hydra overrides] [options]`: the machine's ceilings and how close the model gets.

Prints one table of figures for the composed config (and writes JSON; `--mlflow` also logs it). One section per
module of this package, in table order (each module's docstring says what it measures and how):

- ceilings (ceilings.py): dense GEMM throughput at fp32 and bf16 and memory bandwidth (read, copy, STREAM's triad),
  measured here;
- train (train.py): training tokens/sec and MFU of a bare PyTorch loop (no Lightning, no logging) at 32-true,
  bf16-mixed and bf16-mixed + torch.compile, and the loss each reached after the same steps on the same batches;
- harness (harness.py): the same model trained through `ablations.train.train` (Lightning + Hydra + MLflow), over
  the bare loop, paired step by step in one process;
- inference (inference.py): batch-1 prefill tokens/sec, and batch-1 greedy decode tokens/sec with and without the
  KV cache at several context lengths, the cache bytes measured (and predicted), and the decode ceiling (read
  bandwidth / bytes read per token) with the fraction of it reached;
- startup (startup.py): seconds from launching `python -m ablations.run` to the end of its first optimizer step;
- scaling (scaling.py): step time and activation memory against context length and width, measured KV-cache bytes
  of every attention variant;
- variants (variants.py): every registered variant of every family swapped into the composed model one at a time,
  training, prefill and decode tokens/s each as a fraction of its own analytic bound;
- norms (norms.py): RMSNorm against LayerNorm: paired training in 32-true and bf16-mixed, each norm's forward and
  backward per call inside training steps, and its kernels at the model's activation shape;
- gelu (gelu.py): GELU's tanh form eager on CPU, the harness's C++ kernel against ATen's gelu: each form's forward
  and backward at the MLP's activation shape, and eager training with each paired in one process;
- roofline (roofline.py): each position, norm and MLP variant's paired extra time per training step over the
  composed model, beside the bytes its element-wise passes must move (modules.elementwise) over the triad bandwidth;
- malloc (malloc.py): bare-loop training with freed memory kept between steps (ablations.malloc) against glibc's
  defaults, one child process per arm in alternating order, and the page faults per step of each.

Definitions. MFU = flops_per_token (modules.accounting: 6N + attention) x tokens/sec / the measured dense GEMM peak
of the precision the matmuls run in (fp32 for 32-true, bf16 for bf16-mixed), or `peak_flops=` when given (e.g. a
GPU's datasheet figure). The machine is shared and noisy, so every figure of a section is measured in interleaved
rounds (A B C A B C ...) and the best round of each is kept: ratios between rows are side by side (timing.py).

Options are key=value beside the training overrides (`threads=1 only=[train,norms] json=PATH`); `python -m
ablations.bench --help` lists them (declared once, in cli.py).

Precisions: train and harness run the composed trainer.precision when it names one, else 32-true and bf16-mixed,
less any whose GEMM peak (a quick probe before anything is built) is below fp32's (emulated on this CPU), which one
row of the table names (ceilings.plan_precisions).

Adding a section is one new module here, `ablations/bench/<name>.py`; nothing else lists the sections (they are
found by importing every module of the package, as modules.registry finds variants):

    from .core import Bench, Figures, Section, section

    @section
    class Data(Section):
        name, order = "data", 80        # only=data; `order` places its rows in the table and its keys in the JSON
        needs = ()                      # sections that must run with it, e.g. ("ceilings",) for a fraction of a peak

        def check(self, bench): ...     # optional: SystemExit("ablations.bench: ...") on options it cannot use
        def work(self, bench): ...      # optional: {name: fn() -> amount} timed in the shared interleaved rounds

        def run(self, bench, rates, earlier) -> Figures:
            # bench: config (bench.cfg, bench.model), options (bench.opts), bench.window/rounds, bench.log;
            # rates: this section's `work` items -> {"best", "best_round", "median"} amount/sec;
            # earlier: the JSON so far (e.g. earlier["gemm_flops"] when it needs the ceilings)
            return Figures({"data": {...}}, [("data: tokens/sec", "...")])

Its values become top-level JSON keys (and MLflow metrics with --mlflow); its rows lines of the table. Time work
with timing.py (interleaved, best_time, timed_rate) and format figures with core.fmt.
"""
from .core import build_model, model_dict
from .cli import main
from .train import BareTrainer, training_batches

__all__ = ["main", "build_model", "model_dict", "BareTrainer", "training_batches"]
