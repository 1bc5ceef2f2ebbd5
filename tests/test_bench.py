"""`python -m ablations.bench` on the tiny model: every cheap section runs and reports sane figures.

No timing assertions (the machine is shared): figures must exist, be positive and finite, and the measured cache
bytes must equal the analytic ones.
"""
import json
import math

import pytest

from ablations import bench
from modules.registry import names


def run_bench(argv: list[str]) -> int:
    """bench.main on one thread, torch's thread count restored after. The figures' sanity does not depend on the
    thread count, and a tiny model's parallel ops on a busy machine wait for their slowest thread (the bench's own
    note): with two threads and another process on the cores, these sections took 10x longer."""
    import torch

    threads = torch.get_num_threads()
    try:
        return bench.main([*argv, "--threads", "1"])
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    rc = run_bench(["model=tiny", "--quick", "--no-compile", "--only", "ceilings,train,inference,scaling",
                    "--window", "0.1", "--rounds", "1", "--new-tokens", "4", "--contexts", "8,16",
                    "--json", str(path)])
    assert rc == 0
    return json.loads(path.read_text())


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_ceilings(report):
    assert positive(report["gemm_flops"]["fp32"]) and positive(report["gemm_flops"]["bf16"])
    assert all(positive(report["bandwidth_bytes_per_sec"][k]) for k in ("read", "copy", "triad"))
    assert report["mfu_peak_source"] == "measured"


def test_train(report):
    rows = report["train_bare"]
    assert set(rows) == set(report["precisions"]["run"])  # --no-compile; an emulated bf16 is skipped
    # without native bf16 (e.g. an AVX2-only CPU: bf16 GEMM ~0.4 GFLOP/s) the bf16 GEMM is no ceiling of the
    # bf16-mixed step, whose linear layers take other kernels: its MFU is only bounded where bf16 is native
    native_bf16 = report["gemm_flops"]["bf16"] >= report["gemm_flops"]["fp32"]
    for name, r in rows.items():
        assert positive(r["tokens_per_sec"]) and positive(r["steps"]) and positive(r["mfu"])
        if name == "32-true" or native_bf16:
            assert r["mfu"] < 1.5  # a tiny model on a shared machine: far from the peak, never far above it
        assert positive(r["loss_at_step"]["loss"]) and r["loss_at_step"]["loss"] < 7  # ln(256) = 5.5 at init
    assert "bf16-mixed" not in rows or positive(report["bf16_speedup"])
    assert report["train_loss_data"] == "stdlib bytes"
    assert report["flops_per_token"] > 6 * report["params_non_embedding"]


def test_inference(report):
    inf = report["inference"]
    assert set(inf["decode"]) == {"8", "16"}
    assert set(inf["prefill"]) == {"8", "16", "32"}  # the decode contexts and block_size
    assert all(positive(v) for v in inf["prefill"].values())
    for ctx, d in inf["decode"].items():
        assert d["cache_bytes_measured"] == d["cache_bytes_analytic"] > 0
        # tiny: 2 layers x 2 (k, v) x 32 numbers x 4 bytes (fp32) per token
        assert d["cache_bytes_measured"] == int(ctx) * 2 * 2 * 32 * 4
        for key in ("cached_tokens_per_sec", "nocache_tokens_per_sec", "speedup", "ceiling_tokens_per_sec",
                    "fraction_of_ceiling"):
            assert positive(d[key]), key
        assert d["bytes_read_per_token"] > inf["weight_bytes_per_token"] > 0


def test_scaling(report):
    sc = report["scaling"]
    kv = sc["kv_cache"]
    assert set(kv) == set(names("attention")) >= {"mha", "gqa", "mqa", "sliding", "mla"}  # every registered one
    for name, v in kv.items():
        assert v["measured_bytes"] == v["analytic_bytes"] > 0, name
    assert kv["mqa"]["measured_bytes"] < kv["gqa"]["measured_bytes"] < kv["mha"]["measured_bytes"]
    assert kv["sliding"]["measured_bytes"] < kv["mha"]["measured_bytes"]
    ctx = sc["context"]
    mem = [ctx[k]["activation_bytes"] for k in sorted(ctx, key=int)]
    assert all(positive(v["step_sec"]) for v in ctx.values())
    assert mem == sorted(mem) and mem[-1] > mem[0]  # activations grow with the context


def test_table_printed(report, capsys):
    names = [row[0] for row in report["table"]]
    assert any(n.startswith("GEMM fp32") for n in names) and any(n.startswith("decode b=1") for n in names)


@pytest.mark.parametrize("argv,message", [
    (["--bogus"], "unknown option"),
    (["only=nope"], "unknown section"),
    (["model=tiny", "only=inference", "contexts=[30]", "new_tokens=8"], "model.block_size=38"),
    (["model=tiny", "trainer.precision=16-mixed", "only=train"], "trainer.precision=16-mixed: the bench trains"),
])
def test_bad_arguments(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv + [f"json={tmp_path / 'b.json'}"])
    assert message in str(e.value) + capsys.readouterr().err  # the command line's own errors: printed, exit 2


# Faked GEMM peaks (FLOP/s), the only way to meet an emulated bf16 on this AVX512-BF16 machine: the AVX2-only
# CPU measured bf16 at 7.9e8 against fp32's 7.9e10 (emulated, 1%); a native one is ~2x fp32.
EMULATED = {"32-true": 7.9e10, "bf16-mixed": 7.9e8}
NATIVE = {"32-true": 4e10, "bf16-mixed": 9e10}


@pytest.mark.parametrize("overrides,peaks,force,trained,skipped", [
    ([], EMULATED, False, ["32-true"], ["bf16-mixed"]),
    ([], EMULATED, True, ["32-true", "bf16-mixed"], []),
    (["trainer.precision=32-true"], NATIVE, False, ["32-true"], []),  # the command line's precision, alone
    (["trainer.precision=bf16-mixed"], EMULATED, False, [], ["bf16-mixed"]),
])
def test_precisions_trained_skipped_and_forced(monkeypatch, tmp_path, overrides, peaks, force, trained, skipped):
    """`--only ceilings,train,harness` with the GEMM probe faked: the precisions whose models are built (train) and
    run through the harness (its Lightning runs replaced by a record) are the configured one, or both, less one
    whose peak is below fp32's unless --force-emulated; a skip is one row of the table and the JSON says why."""
    from ablations.bench import ceilings, harness, train

    built, harnessed = [], []
    init = train.BareTrainer.__init__

    def watched(self, model_cfg, batches, precision, *args, **kwargs):
        built.append(precision)
        init(self, model_cfg, batches, precision, *args, **kwargs)

    def fake_harness(bench, precision, steps):
        harnessed.append(precision)
        return {"harness_tokens_per_sec": 1.0, "ratio": None, "ratio_ci_low": None, "windows": 0,
                "steps_per_window": 10}

    monkeypatch.setattr(ceilings, "gemm_probe", lambda device: dict(peaks))
    monkeypatch.setattr(train.BareTrainer, "__init__", watched)
    monkeypatch.setattr(harness, "paired_harness", fake_harness)
    path = tmp_path / "bench.json"
    assert run_bench(["model=tiny", *overrides, "--quick", "--no-compile", "--only", "ceilings,train,harness",
                      "--window", "0.05", "--rounds", "1", "--json", str(path)] + ["--force-emulated"] * force) == 0
    out = json.loads(path.read_text())
    assert built == trained and harnessed == trained and sorted(out["train_bare"]) == sorted(trained)
    assert list(out["precisions"]["skipped"]) == skipped and out["precisions"]["run"] == trained
    lines = [v for _, v in out["table"] if "skipped" in v]
    if skipped:
        assert len(lines) == 1, lines
        assert all(w in lines[0] for w in ("bf16-mixed", "0.01x fp32", "emulated on this CPU", "--force-emulated"))
        assert out["gemm_flops"]["bf16"] == EMULATED["bf16-mixed"]  # not timed at full size: the probe's figure
    else:
        assert not lines


def test_cache_appends_in_place():
    """Decoding writes into the cache's preallocated buffer (no copy of the whole cache per token), while nbytes
    still counts exactly the positions held."""
    import torch

    from modules import accounting

    from ablations.compose import compose

    model = bench.build_model(bench.model_dict(compose(["model=tiny"]))).eval()
    cfg, T = model.config, model.config.block_size
    cache = model.new_cache(1)
    with torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, 10)), cache=cache)
        storage = cache.layers[0]["k"].untyped_storage().data_ptr()
        for _ in range(5):
            model(torch.randint(0, cfg.vocab_size, (1, 1)), cache=cache)
    assert cache.layers[0]["k"].untyped_storage().data_ptr() == storage  # appended in place, no reallocation
    assert cache.nbytes == accounting.kv_cache_bytes(cfg, 15, dtype=torch.float32)
    assert cache.nbytes <= cache.reserved_nbytes <= accounting.kv_cache_bytes(cfg, T, dtype=torch.float32)


@pytest.mark.slow
def test_harness_pairs_each_window_with_the_bare_steps_inside_it():
    """Section `harness`: one bare step after every harness step, counted in the window it ran in and paused out of
    the harness's clock. A stand-in bare trainer returns 2**i tokens at its i-th call, so each window's token sum
    names exactly the calls it holds; the harness's training time plus the bare steps' time cannot exceed the wall
    time in which both ran (it would if the bare steps were not paused out)."""
    import time

    import lightning.pytorch as pl

    from ablations.bench.harness import bare_steps, harness_tokens_per_sec

    class Stand_in:
        device, calls, seconds = "cpu", 0, 0.0

        def step(self):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.1:  # long beside a tiny step and a flush: a missing pause shows
                pass
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            return float(2 ** (self.calls - 1))

    class Clock(pl.Callback):  # the wall time of training: from the first to the last step's end
        def on_train_start(self, trainer, pl_module):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.t1 = time.perf_counter()
            self.elapsed = next(c for c in trainer.callbacks if hasattr(c, "elapsed_sec")).elapsed_sec

    bare, clock = Stand_in(), Clock()
    cb = bare_steps(bare)
    harness_tokens_per_sec(["model=tiny", "trainer.precision=32-true", "trainer.log_every_n_steps=4",
                            "tracking.system_metrics=false"], 12, callbacks=[cb, clock])
    assert bare.calls == 12 and len(cb.harness) == 3  # windows close at steps 4, 8, 12
    # window 1: the bare steps after harness steps 1-3; window 2: after steps 4-7; window 3: after 8-11
    assert [tokens for tokens, _ in cb.bare] == [2**0 + 2**1 + 2**2, sum(2**i for i in range(3, 7)),
                                                sum(2**i for i in range(7, 11))]
    assert all(h > 0 for h in cb.harness)
    # elapsed_sec is training time up to step 12's window; the bare steps before it ran inside the same wall time
    assert clock.elapsed + sum(seconds for _, seconds in cb.bare) <= clock.t1 - clock.t0 + 1e-3


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "variants.json"
    rc = run_bench(["model=tiny", "data.batch_size=4", "--quick", "--only", "variants", "--window", "0.02",
                    "--rounds", "2", "--contexts", "16", "--new-tokens", "4", "--json", str(path)])
    assert rc == 0
    return json.loads(path.read_text())


def test_variants_table(variants):
    v = variants["variants"]
    rows = v["variants"]
    # the composed model, then every other registered variant of every family, alone
    expected = {"baseline"} | {f"{f}={n}" for f, base in
                               (("position", "learned"), ("norm", "layernorm"), ("mlp", "gelu"), ("attention", "mha"))
                               for n in names(f) if n != base}
    assert set(rows) == expected and not v["skipped"]
    for label, r in rows.items():
        for k in ("train", "prefill", "decode"):
            assert positive(r[f"{k}_tokens_per_sec"]) and positive(r[f"{k}_bound"]), (label, k)
            assert 0 < r[f"{k}_fraction"] <= 1.5, (label, k, r[f"{k}_fraction"])
            assert len(r["rounds"][k]) == 2
            assert r[f"{k}_fraction"] == pytest.approx(r[f"{k}_tokens_per_sec"] / r[f"{k}_bound"])
        assert r["cache_bytes"] == r["cache_bytes_analytic"] > 0, label
    assert all(rows["baseline"][f"{k}_vs_baseline"] == 1.0 for k in ("train", "prefill", "decode"))
    # paired ratios: round by round against the baseline's same round (2 rounds: their mean is the median)
    base, mqa = rows["baseline"]["rounds"]["decode"], rows["attention=mqa"]["rounds"]["decode"]
    assert rows["attention=mqa"]["decode_vs_baseline"] == pytest.approx((mqa[0] / base[0] + mqa[1] / base[1]) / 2)
    # tiny mha, fp32, 2 layers x (k, v) x 32 numbers x 4 bytes per token at context 16; one KV head of 4 for mqa
    assert rows["baseline"]["cache_bytes"] == 16 * 2 * 2 * 32 * 4
    assert rows["attention=mqa"]["cache_bytes"] == rows["baseline"]["cache_bytes"] // 4
    assert any(row[0] == "variant attention=mla" for row in variants["table"])


def test_variants_bounds_known_answers(variants):
    """The bounds of the tiny baseline, worked by hand: d=32, 2 layers, vocab 256, block 32, GELU MLP 4d, tied.
    Matmul weights: 2 x (4 d^2 attention + 8 d^2 MLP) + 256 d lm_head = 32,768."""
    v = variants["variants"]
    b = v["variants"]["baseline"]
    peak, bw = v["gemm_peak_flops"]["32-true"], v["read_bandwidth"]
    # training: 6 x 32,768 + 12 x 2 layers x 32 x T=32 = 221,184 FLOPs per token
    assert b["train_bound"] == pytest.approx(peak / 221_184)
    # prefill of 16 tokens: the forward third, each query attending to (16+1)//2 = 8 keys:
    # (6 x 32,768 + 12 x 2 x 32 x 8) / 3 = 67,584
    assert b["prefill_bound"] == pytest.approx(peak / 67_584)
    # decode: every weight once (33,952 params - the 32x32 position table + its one row read) in fp32, plus the
    # cache at 16 + 4/2 = 18 positions: (33,952 - 1,024 + 32) x 4 + 18 x 2 x 2 x 32 x 4 = 141,056 bytes
    assert b["decode_bytes_per_token"] == 141_056
    assert b["decode_bound"] == pytest.approx(bw / 141_056)


def test_malloc_section_runs_each_arm_in_its_own_process(tmp_path):
    out = tmp_path / "b.json"
    assert run_bench(["model=tiny", "--only", "malloc", "--steps", "2", "--rounds", "1", "--json", str(out)]) == 0
    m = json.loads(out.read_text())["malloc"]
    assert set(m) == {"32-true", "bf16-mixed"}
    for fig in m.values():
        # each child set its allocator as its arm says (the setting is per process: one child per arm)
        assert fig["mode"]["default"] == "default (ABLATIONS_MALLOC)"
        assert fig["mode"]["kept"].startswith("glibc, freed memory kept")
        assert positive(fig["ratio"]) and len(fig["tokens_per_sec"]["kept"]) == 1
        assert all(v >= 0 for v in [*fig["faults_per_step_median"].values(), *fig["kernel_sec_per_step_median"].values()])


def test_gelu_section_pairs_the_kernel_with_atens_gelu(tmp_path, monkeypatch):
    """only=gelu: the activation's forward and backward in each form and dtype, and eager training with the kernel
    paired against ATen's gelu; the kernel is what the kernel arm's model calls and not the other's."""
    from modules.kernels import gelu_tanh as gelu_kernel

    ops = gelu_kernel.kernel()
    calls = {"n": 0}

    class Counting:
        def gelu_tanh(self, x):
            calls["n"] += 1
            return ops.gelu_tanh(x)

    import ablations.bench.gelu as section

    monkeypatch.setitem(gelu_kernel.KERNEL.built, "module", Counting())
    items = section.kernel_items
    monkeypatch.setattr(section, "kernel_items", lambda n, h, _: items(n, h, ops))  # the rounds' calls not counted
    out = tmp_path / "b.json"
    assert run_bench(["model=tiny", "--only", "gelu", "--steps", "2", "--rounds", "1", "--window", "0.05",
                      "--json", str(out)]) == 0
    g = json.loads(out.read_text())["gelu"]
    assert set(g["kernel_ms"]) == {"fp32", "bf16"}
    assert all(positive(v) for ms in g["kernel_ms"].values() for v in ms.values())
    assert set(g["paired"]) and set(g["paired"]) <= {"32-true", "bf16-mixed"}
    for p in g["paired"].values():
        assert positive(p["ratio"]) and len(p["tokens_per_sec"]["kernel"]) == len(p["tokens_per_sec"]["aten"]) == 2
    # tiny: 2 layers; per precision 1 untimed call and 2 rounds of 2 steps, one gelu call per layer per step, in the
    # kernel arm alone (both arms through the kernel would be twice as many)
    assert calls["n"] == len(g["paired"]) * 3 * 2 * 2
    assert gelu_kernel.KERNEL.built["module"].__class__ is Counting  # the arm's swap is undone


def test_gelu_section_refuses_another_mlp(capsys):
    with pytest.raises(SystemExit, match="only=gelu needs mlp=gelu"):
        run_bench(["model=tiny", "mlp=swiglu", "--only", "gelu"])
