#!/usr/bin/env bash
# GPU benchmark: GPT-2 small (model=gpt2-124m tokenizer=gpt2, V=50257, context 1024) trained by the bare PyTorch
# loop of `python -m ablations.bench` at 32-true, bf16-mixed and bf16-mixed + torch.compile; prints tokens/sec, MFU
# against the chip's dense bf16 peak (a flag: H100/H200 SXM = 989 TFLOP/s), peak memory, and batch-1 decode
# tokens/sec with and without the KV cache (bf16 weights). Optionally (--harness) the same training through
# `python -m ablations.run` with trainer.precision=bf16-mixed compile=true trainer.accelerator=gpu.
#
#   scripts/gpu_bench.sh                       # on a CUDA machine (writes gpu_bench_out/)
#   scripts/gpu_bench.sh --peak-tflops 312     # A100: set the bf16 dense peak of your chip
#   scripts/gpu_bench.sh --harness             # also the Lightning + Hydra + MLflow run
#   scripts/gpu_bench.sh --device cpu --steps 2   # dry run on a CPU: tiny batch/context, 2 steps per variant
#
# Options: --device cuda|cpu, --peak-tflops F, --batch N (data.batch_size, default 32 x 1024 tokens), --block N
# (model.block_size), --steps N (fixed steps per variant instead of timed rounds), --contexts C,C,
# --no-compile, --pad-vocab (vocab 50304, a multiple of 64, as nanoGPT: faster matmuls; random tokens only),
# --harness, --harness-steps N, --out DIR; anything after `--` goes to ablations.bench.
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=cuda PEAK_TFLOPS=989 BATCH=32 BLOCK="" STEPS="" CONTEXTS="128,512,992" COMPILE=1 PAD=0 HARNESS=0
HARNESS_STEPS=200 OUT=gpu_bench_out EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --peak-tflops) PEAK_TFLOPS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --block) BLOCK=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --contexts) CONTEXTS=$2; shift 2 ;;
    --no-compile) COMPILE=0; shift ;;
    --pad-vocab) PAD=1; shift ;;
    --harness) HARNESS=1; shift ;;
    --harness-steps) HARNESS_STEPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] && PY=${PYTHON:-.venv/bin/python}
# offline GPT-2 BPE files (tokenizer=gpt2 in the harness run), where the checkout keeps them
for d in shared/tiktoken-cache ../shared/tiktoken-cache; do
  [[ -d $d && -z ${TIKTOKEN_CACHE_DIR:-} ]] && export TIKTOKEN_CACHE_DIR=$(cd "$d" && pwd)
done
mkdir -p "$OUT"

if [[ $DEVICE == cuda* ]]; then
  "$PY" - <<'EOF' || exit 3
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_bench.sh: torch {torch.__version__} sees no CUDA device; install a CUDA build of torch "
             "(pip install torch --index-url https://download.pytorch.org/whl/cu128) or pass --device cpu")
p = torch.cuda.get_device_properties(0)
print(f"gpu_bench.sh: {p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
      f"bf16 {torch.cuda.is_bf16_supported()}")
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit \
    --format=csv,noheader || true
fi

OVR=(model=gpt2-124m tokenizer=gpt2 "data.batch_size=$BATCH")
ARGS=("device=$DEVICE" "only=[ceilings,train,inference]" inference_dtype=bf16 "contexts=[$CONTEXTS]"
      "json=$OUT/bench.json")
if [[ $DEVICE == cuda* ]]; then ARGS+=("peak_flops=${PEAK_TFLOPS}e12"); fi
if [[ -n $STEPS ]]; then ARGS+=("steps=$STEPS"); fi
if [[ $COMPILE == 0 ]]; then ARGS+=(no_compile=true); fi
if [[ $PAD == 1 ]]; then OVR+=(model.vocab_size=50304); fi
if [[ $DEVICE == cpu && -n $STEPS ]]; then
  # dry run: the same code path at a size a CPU finishes in a few minutes
  [[ -z $BLOCK ]] && BLOCK=128
  [[ $BATCH == 32 ]] && OVR=("${OVR[@]/data.batch_size=32/data.batch_size=2}")
  [[ $CONTEXTS == "128,512,992" ]] && ARGS=("${ARGS[@]/128,512,992/32,96}")
  ARGS+=(quick=true new_tokens=8)
fi
if [[ -n $BLOCK ]]; then OVR+=("model.block_size=$BLOCK"); fi

echo "== bare loop: $PY -m ablations.bench ${OVR[*]} ${ARGS[*]} ${EXTRA[*]:-}"
"$PY" -m ablations.bench "${OVR[@]}" "${ARGS[@]}" "${EXTRA[@]}" | tee "$OUT/bench.txt"

"$PY" - "$OUT/bench.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
t = r.get("train_bare", {})
print(f"\n== summary ({r.get('gpu', r['device'])}, torch {r['torch']}, batch {r['batch_size']} x "
      f"{r['model']['block_size']} tokens, MFU peak {r['mfu_peak_source']}: "
      f"{r['mfu_peak_flops']['bf16-mixed'] / 1e12:.3g} TFLOP/s bf16)")
for name, v in t.items():
    mem = v.get("peak_memory_bytes")
    print(f"  train {name:20s} {v['tokens_per_sec']:>12,.0f} tok/s  MFU {v['mfu']:6.1%}"
          + (f"  peak mem {mem / 2**30:.1f} GiB" if mem else ""))
for ctx, d in r.get("inference", {}).get("decode", {}).items():
    print(f"  decode b=1 ctx={ctx:>5} ({r['inference']['dtype']}) {d['cached_tokens_per_sec']:>9,.0f} tok/s cached, "
          f"{d['nocache_tokens_per_sec']:,.0f} without cache, {d['fraction_of_ceiling']:.1%} of the bandwidth ceiling")
EOF

if [[ $HARNESS == 1 ]]; then
  ACC=gpu; [[ $DEVICE == cpu ]] && ACC=cpu
  HOVR=(model=gpt2-124m tokenizer=gpt2 "data.batch_size=$BATCH" trainer.precision=bf16-mixed
        "compile=$([[ $COMPILE == 1 ]] && echo true || echo false)" "trainer.accelerator=$ACC"
        "trainer.max_steps=$HARNESS_STEPS" "trainer.val_check_interval=$HARNESS_STEPS" trainer.limit_val_batches=4
        "tracking.uri=sqlite:///$(cd "$OUT" && pwd)/mlflow.db" tracking.experiment=gpu_bench
        "checkpoint.dir=$OUT/checkpoints")
  [[ -n $BLOCK ]] && HOVR+=("model.block_size=$BLOCK")
  echo "== harness: $PY -m ablations.run ${HOVR[*]}"
  "$PY" -m ablations.run "${HOVR[@]}" 2>&1 | tee "$OUT/harness.txt"
fi
echo "gpu_bench.sh: figures in $OUT/ (bench.txt, bench.json$([[ $HARNESS == 1 ]] && echo ', harness.txt, mlflow.db'))"
