#!/usr/bin/env bash
# The one GPU check, run on the device tool's machine (run: `bash scripts/gpu/device.sh`, carry `.gpu`, timeout_s
# 540): installs the carried wheels offline, then scripts/gpu_bench.sh on gpt2-124m (tokenizer gpt2, batch 32 x 1024
# tokens): training tokens/s and MFU at 32-true, bf16-mixed and bf16-mixed + torch.compile against the H200's dense
# bf16 peak of 989 TFLOP/s (NVIDIA's H200 SXM datasheet: 1,979 TFLOP/s with sparsity, half that dense), batch-1
# decode tokens/s at contexts 128, 512, 992; figures and JSON under $OUT (bench.txt, bench.json, gpu.json).
# Rehearsed on CPU by scripts/gpu/rehearse.sh (DEVICE=cpu: a dry run of the same code path at a tiny size).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_bench_out}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if [[ -d .gpu/wheels ]]; then  # what the image lacks, offline; its torch/lightning/tiktoken stay as they are
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site \
    .gpu/wheels/*.whl
  export PYTHONPATH=/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHON=$PY
[[ -d .gpu/tiktoken-cache ]] && export TIKTOKEN_CACHE_DIR=$PWD/.gpu/tiktoken-cache
"$PY" -c "import torch, lightning, hydra, omegaconf, tiktoken; print('device.sh: torch', torch.__version__, \
'lightning', lightning.__version__, 'hydra', hydra.__version__, 'cuda', torch.cuda.is_available())"
if [[ $DEVICE == cuda ]]; then
  ARGS=(--peak-tflops 989 --out "$OUT" -- --rounds 3 --window 1)
else  # the CPU rehearsal: same path, tiny sizes, 2 steps per variant
  ARGS=(--device cpu --steps 2 --out "$OUT")
fi
timeout "${BENCH_TIMEOUT:-480}" bash scripts/gpu_bench.sh "${ARGS[@]}"
"$PY" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
r = json.load(open(f"{out}/bench.json"))
t = r["train_bare"]
best = t.get("bf16-mixed+compile") or t.get("bf16-mixed") or next(iter(t.values()))
dec = r.get("inference", {}).get("decode", {})
summary = {"device": r.get("gpu", r["device"]), "torch": r["torch"], "model": "gpt2-124m",
           "mfu_peak_flops_bf16": r["mfu_peak_flops"]["bf16-mixed"], "mfu_peak_source": r["mfu_peak_source"],
           "train": {k: {"tokens_per_sec": v["tokens_per_sec"], "mfu": v["mfu"]} for k, v in t.items()},
           "mfu_bf16_compile": best["mfu"], "target_mfu": 0.40, "meets_target": best["mfu"] >= 0.40,
           "decode_cached_tokens_per_sec": {c: d["cached_tokens_per_sec"] for c, d in dec.items()}}
json.dump(summary, open(f"{out}/gpu.json", "w"), indent=1)
print(f"device.sh: MFU bf16-mixed+compile {best['mfu']:.1%} of {summary['mfu_peak_flops_bf16'] / 1e12:.0f} TFLOP/s "
      f"(target 40%: {'met' if summary['meets_target'] else 'NOT met'}); decode "
      + ", ".join(f"ctx {c}: {v:,.0f} tok/s" for c, v in summary["decode_cached_tokens_per_sec"].items()))
PY
