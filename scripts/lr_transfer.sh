#!/usr/bin/env bash
# The lr-transfer study (issue 18, item 4): final val loss against lr at widths 32..256 (8x), under sp and mup,
# for AdamW and Muon, 2 seeds per point; then reports/lr-transfer/ (analysis/lr_transfer.py).
#
#   scripts/lr_transfer.sh            # run (or continue) the study into study/lr-transfer/, then the report
#   scripts/lr_transfer.sh --report   # only regenerate reports/lr-transfer/ from the store; without a
#                                     # study/lr-transfer/mlflow.db it unpacks the committed reports/lr-transfer/mlflow.db.gz
#
# Setting: 2 layers, n_head 4 at every width (width grows by head size, as the mup base model assumes), char-level
# tinyshakespeare (one 1 MB file: the cheapest corpus to load), block 32, batch 8, 120 steps (12 warm-up, cosine to
# 0), final validation only on 128 windows, untied embedding/readout; mup relative to base width 32 (there mup is
# sp). One process: a Hydra multirun with the basic launcher runs every job in-process (no per-run interpreter
# start-up); a width whose points are all in the store is skipped, so a second call continues an interrupted
# study (a width it had begun is run again whole; the report keeps the newest run of each point). One thread.
# Offline, point the corpus at a local copy with ABLATIONS_SHAKESPEARE_PATH (else it is downloaded and checksummed).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
root=$(pwd)
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=study/lr-transfer
gz=reports/lr-transfer/mlflow.db.gz
uri="sqlite:///$store/mlflow.db"
export OMP_NUM_THREADS=1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, also when run from a git worktree
mkdir -p "$store" reports/lr-transfer

# lr grids (factor 2, 5 points), per optimizer, from a pilot at widths 32 and 256 (one seed, 120 steps): at width 32
# AdamW was best at 2^-7 (2.78 nats), Muon at 2^-5 (2.53; 2^-3: 2.57); each grid is centred on that optimum, two
# steps either side (an optimum that leaves the grid still bounds the shift from below: see analysis/lr_transfer.py)
adamw_lrs=0.001953125,0.00390625,0.0078125,0.015625,0.03125  # 2^-9 .. 2^-5
muon_lrs=0.0078125,0.015625,0.03125,0.0625,0.125             # 2^-7 .. 2^-3
widths=(32 64 128 256)
seeds=0,1
# checkpoints and the per-run peak-FLOP/s probe off (peak_flops: this machine's probe, measured once), tiny sample
common=(threads=1 data=shakespeare tokenizer=char model=tiny model.n_layer=2 model.n_head=4 model.block_size=32
  model.mup.base_width=32 data.batch_size=8 data.val_windows=128 trainer.max_steps=120 optim.warmup_steps=12
  optim.min_lr=0 trainer.val_check_interval=1000000 trainer.log_every_n_steps=20
  "checkpoint.dir=$root/$store/scratch-checkpoints" checkpoint.every_n_steps=1000000 generate.max_new_tokens=8
  generate.bench_prefill_tokens=8 generate.bench_decode_tokens=4 tracking.system_metrics=false tracking.peak_flops=3.95e10
  trainer.enable_progress_bar=false tracking.experiment=lr-transfer "tracking.uri=sqlite:///$root/$store/mlflow.db"
  model.tie_weights=false model.parametrization=sp,mup "seed=$seeds")

# the widths whose points (every optimizer, lr, seed, parametrization) are all in the store, finished or diverged
complete_widths() {
  python - "$uri" "$adamw_lrs" "$muon_lrs" "$seeds" <<'EOF'
import sys
from analysis.lr_transfer import load_study
from analysis.store import AnalysisError
uri, grids, seeds = sys.argv[1], {"adamw": sys.argv[2], "muon": sys.argv[3]}, sys.argv[4].split(",")
try:
    pts = load_study(uri).points
except AnalysisError:
    sys.exit(0)
have = set(zip(pts["optimizer"], pts["width"], pts["parametrization"], pts["lr"], pts["seed"]))
for w in sorted(set(pts["width"])):
    want = {(o, w, p, float(lr), int(s)) for o, g in grids.items() for lr in g.split(",") for p in ("sp", "mup")
            for s in seeds}
    if want <= have:
        print(w)
EOF
}

if [[ $report_only == 0 ]]; then
  echo "[lr-transfer] $(date -u +%FT%TZ) start at $(git rev-parse HEAD) (dirty: $(git status --porcelain --untracked-files=no | wc -l) files)"
  done_widths=""
  if [[ -f "$store/mlflow.db" ]]; then done_widths=$(complete_widths); fi
  todo=()
  for w in "${widths[@]}"; do
    if grep -qx "$w" <<<"$done_widths"; then echo "[lr-transfer] width $w: in the store, skipped"; else todo+=("$w"); fi
  done
  todo_csv=$(IFS=,; echo "${todo[*]:-}")
  if [[ -n "$todo_csv" ]]; then
    # one process for the whole sweep (widths slowest, seeds fastest): one interpreter start-up, not one per run.
    # With different grids per optimizer, one process per optimizer. A diverged job fails (one line) and the
    # multirun goes on; its exit status is then non-zero: the report counts the diverged runs.
    if [[ "$adamw_lrs" == "$muon_lrs" ]]; then sweeps=("optim=adamw,muon optim.lr=$adamw_lrs"); else
      sweeps=("optim=adamw optim.lr=$adamw_lrs" "optim=muon optim.lr=$muon_lrs"); fi
    for sw in "${sweeps[@]}"; do
      echo "[lr-transfer] $(date -u +%T) widths $todo_csv: $sw"
      # shellcheck disable=SC2086  # $sw: two overrides
      (cd "$store" && python -m ablations.run -m "model.n_embd=$todo_csv" $sw "${common[@]}") || true
    done
  fi
  echo "[lr-transfer] $(date -u +%FT%TZ) runs done"
  rm -rf "$store/scratch-checkpoints"
  # a compact copy of the store (runs, params, metrics; no artifacts) beside the report
  compact_store "$store/mlflow.db" "$gz"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
python -m analysis.report lr-transfer lr-transfer tracking_uri="$uri" out=reports/lr-transfer
