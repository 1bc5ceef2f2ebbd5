#!/usr/bin/env bash
# The one GPU check, as the device tool runs it on its H200 (docs/bench.md, section GPU):
#   run  command: bash scripts/gpu/device.sh   carry: [".gpu"]   timeout_s: 540
# Offline: installs the carried pure-Python wheels (.gpu/wheels: hydra-core, omegaconf, antlr4; the image has torch
# 2.11, numpy, pyyaml, tiktoken but no Hydra) with --no-index, then scripts/gpu_bench.sh on gpt2-124m (tokenizer gpt2,
# V=50257, batch 32 x 1024 tokens): training tokens/s and MFU at 32-true, bf16-mixed and bf16-mixed + torch.compile,
# MFU against the H200's dense bf16 peak of 989 TFLOP/s (NVIDIA's H200 SXM datasheet: 1,979 with sparsity), and
# batch-1 bf16 decode tokens/s at contexts 128, 512, 992; then gpt2-124m under trainer=fsdp (scripts/gpu/fsdp_mfu.py:
# MFU, peak memory against ablations/memory.py's estimate). Under $OUT: gpu.json (the summary), bench.json, bench.txt,
# device.log, fsdp.json. Expected wall time on an H200: ~3 min (3 rounds x 7 items x ~1 s, torch.compile ~1-2 min in the
# warm-up, decode ~30 s); capped at BENCH_TIMEOUT (420 s on CUDA).
# Rehearsed on this CPU by scripts/gpu/rehearse.sh (DEVICE=cpu: the same code path at a tiny size, 2 steps each).
#
# `bash scripts/gpu/device.sh --paired` (carry [".gpu"], timeout_s 540) instead measures the known-results paired
# throughput table on the GPU (docs/bench.md, "Each arm on its fastest path"): ablations.paired path=fastest, every
# arm on the faster of eager and torch.compile by a paired probe, labelled; $OUT/paired.json and device.log. Not yet
# run on a GPU; rehearsed by `scripts/gpu/rehearse.sh --paired`.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_bench_out}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [[ -z ${DEVICE_SH_LOGGED:-} ]]; then  # everything it prints also goes to $OUT/device.log
  DEVICE_SH_LOGGED=1 OUT=$OUT bash "$0" "$@" 2>&1 | tee "$OUT/device.log"
  exit "${PIPESTATUS[0]}"
fi
START=$SECONDS
echo "device.sh: $(date -u +%FT%TZ) $(uname -m) $("$PY" -V 2>&1) at $(command -v "$PY")"
[[ -d .gpu/wheels ]] || { echo "device.sh: no .gpu/wheels: run scripts/gpu/prepare.sh here and carry .gpu" >&2; exit 2; }
SITE=${GPU_SITE:-/tmp/gpu-site}
rm -rf "$SITE"
# what the image lacks, offline and without resolving anything: its torch, numpy, pyyaml, tiktoken stay as they are
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --upgrade \
  --target "$SITE" .gpu/wheels/*.whl
if [[ ${1:-} == --paired ]] && ! "$PY" -c "import scipy" 2>/dev/null; then  # the image has it (KINDS.md)
  echo "device.sh: --paired needs scipy (the paired table's t intervals), which this python lacks" >&2; exit 2
fi
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHON=$PY
export TIKTOKEN_CACHE_DIR=$PWD/.gpu/tiktoken-cache HF_HUB_OFFLINE=1
"$PY" - "$DEVICE" <<'PY'
import sys, torch, numpy, yaml, tiktoken, hydra, omegaconf
print(f"device.sh: torch {torch.__version__} (cuda {torch.version.cuda}), numpy {numpy.__version__}, "
      f"tiktoken {tiktoken.__version__}, hydra {hydra.__version__}, omegaconf {omegaconf.__version__}, "
      f"cuda available {torch.cuda.is_available()}")
assert tiktoken.get_encoding("gpt2").n_vocab == 50257  # from the carried cache, not the network
if sys.argv[1].startswith("cuda") and not torch.cuda.is_available():
    sys.exit("device.sh: DEVICE=cuda but torch sees no GPU")
PY
if [[ ${1:-} == --paired ]]; then
  # the known-results arms (scripts/known_results.sh) at the study's precision (auto: bf16-mixed on CUDA); each arm on
  # the faster of eager and compiled (threads=1: the experiment sets threads=1, honoured as the process's own). On
  # the CPU rehearsal: the same swaps on model=tiny at batch 4, one step per round.
  m="experiment=known-results"; P=("device=${DEVICE%%:*}" path=fastest probe_rounds=3 warmup=3 threads=1)
  if [[ $DEVICE == cuda* ]]; then P+=(steps=10 rounds=12); LIMIT=${BENCH_TIMEOUT:-480}
  else m="data.batch_size=4"; P+=(model=tiny steps=1 rounds=2); LIMIT=${BENCH_TIMEOUT:-1500}; fi
  timeout "$LIMIT" "$PY" -m ablations.paired "${P[@]}" "json=$OUT/paired.json" "baseline=$m" "rope=$m position=rope" \
    "rmsnorm=$m norm=rmsnorm" "swiglu=$m mlp=swiglu" "geglu=$m mlp=geglu" "gqa=$m attention=gqa attention.n_kv_head=2" \
    "mqa=$m attention=mqa" "qknorm=$m norm.qk_norm=true"
  echo "device.sh: paired table in $((SECONDS - START)) s; $OUT/paired.json, device.log"
  exit 0
fi
if [[ $DEVICE == cuda* ]]; then
  ARGS=(--peak-tflops 989 --out "$OUT") BENCH=(rounds=3 window=1)
  LIMIT=${BENCH_TIMEOUT:-420}
else  # the CPU rehearsal: the same path at a tiny size (block 128, batch 2, 2 steps per variant)
  ARGS=(--device cpu --steps 2 --out "$OUT") BENCH=()
  LIMIT=${BENCH_TIMEOUT:-1500}
fi
rc=0
timeout "$LIMIT" bash scripts/gpu_bench.sh "${ARGS[@]}" -- "${BENCH[@]}" || rc=$?
left=$((LIMIT - (SECONDS - START)))
if [[ $rc != 0 && $rc != 124 && -z ${NO_FALLBACK:-} && $left -gt 150 ]]; then
  # torch.compile (Triton/Inductor) is what a CPU cannot rehearse: rather than nothing, the eager figures
  echo "device.sh: gpu_bench.sh failed (exit $rc; its error is above); again without torch.compile (${left} s left)"
  timeout "$left" bash scripts/gpu_bench.sh "${ARGS[@]}" --no-compile -- "${BENCH[@]}"
elif [[ $rc != 0 ]]; then
  echo "device.sh: gpu_bench.sh failed (exit $rc$([[ $rc == 124 ]] && echo ": over its ${LIMIT} s"))" >&2
  exit "$rc"
fi
"$PY" - "$OUT" "$DEVICE" "$((SECONDS - START))" <<'PY'
import json, sys
out, device, wall = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(f"{out}/bench.json"))
t = r["train_bare"]
name = "bf16-mixed+compile" if "bf16-mixed+compile" in t else "bf16-mixed"  # the latter: compile failed
best = t[name]
dec = r.get("inference", {}).get("decode", {})
B, T = r["batch_size"], r["model"]["block_size"]
peak = r["mfu_peak_flops"]["bf16-mixed"]
summary = {"device": r.get("gpu", r["device"]), "torch": r["torch"], "model": "gpt2-124m", "params": r.get("params"),
           "batch_size": B, "block_size": T, "vocab_size": r["model"]["vocab_size"],
           "flops_per_token": r["flops_per_token"], "mfu_peak_flops_bf16": peak,
           "mfu_peak_source": r["mfu_peak_source"], "gemm_bf16_measured_flops": r["gemm_flops"]["bf16"],
           "train": {k: {kk: v.get(kk) for kk in ("tokens_per_sec", "tokens_per_sec_median", "mfu", "peak_memory_bytes")}
                     for k, v in t.items()},
           "compiled": name.endswith("+compile"), "mfu_bf16_compile": best["mfu"] if name.endswith("+compile") else None,
           "mfu_bf16_best": best["mfu"], "target_mfu": 0.40, "meets_target": name.endswith("+compile") and best["mfu"] >= 0.40,
           "decode_dtype": r.get("inference", {}).get("dtype"),
           "decode_cached_tokens_per_sec": {c: d["cached_tokens_per_sec"] for c, d in dec.items()},
           "decode_nocache_tokens_per_sec": {c: d["nocache_tokens_per_sec"] for c, d in dec.items()},
           "decode_fraction_of_ceiling": {c: d["fraction_of_ceiling"] for c, d in dec.items()},
           "wall_sec": wall}
if device.startswith("cuda"):  # what the check promises: else the figures are not the ones asked for
    assert (B, T, summary["vocab_size"], peak) == (32, 1024, 50257, 989e12), (B, T, summary["vocab_size"], peak)
json.dump(summary, open(f"{out}/gpu.json", "w"), indent=1)
num = lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
print(f"device.sh: MFU gpt2-124m {name}{'' if summary['compiled'] else ' (torch.compile failed: eager)'} {best['mfu']:.1%} ({num(best['tokens_per_sec'])} tok/s, batch {B} x {T}) "
      f"of {peak / 1e12:.3g} TFLOP/s bf16 ({r['mfu_peak_source']}; measured bf16 GEMM "
      f"{summary['gemm_bf16_measured_flops'] / 1e12:.3g}); target 40%: {'met' if summary['meets_target'] else 'NOT met'}")
print(f"device.sh: decode b=1 {summary['decode_dtype']} tok/s with the KV cache: "
      + ", ".join(f"ctx {c} {num(v)}" for c, v in summary["decode_cached_tokens_per_sec"].items())
      + "; without: " + ", ".join(f"ctx {c} {num(v)}" for c, v in summary["decode_nocache_tokens_per_sec"].items()))
print(f"device.sh: {wall} s; {out}/gpu.json, bench.json, bench.txt, device.log")
PY
# gpt2-124m under trainer=fsdp (the harness's FSDP2 path) at the same batch: MFU and peak memory against the
# estimate, into $OUT/fsdp.json; after the bench, and its failure is reported, not fatal (the bench's files stand)
left=$((LIMIT - (SECONDS - START)))
if (( left > 60 )); then
  timeout "$left" "$PY" scripts/gpu/fsdp_mfu.py --out "$OUT" --device "$DEVICE" \
    || echo "device.sh: fsdp_mfu.py failed (exit $?; its error is above)" >&2
else
  echo "device.sh: no time left for fsdp_mfu.py (${left} s)" >&2
fi
