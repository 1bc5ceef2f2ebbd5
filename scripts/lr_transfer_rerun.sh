#!/usr/bin/env bash
# The lr-transfer re-run (issue 25 item 4): final val loss against lr at widths 32..256 (8x), sp and mup, AdamW,
# 2 seeds per point, 480 steps (4x the first study's 120), each (parametrization, width) grid grown past its edge
# until the optimum is interior; then reports/lr-transfer/480-steps/ (analysis/lr_transfer.py, and
# analysis/lr_hypothesis.py: Tensor Programs V's Figure 1 as (a)-(c), written before the runs).
#
#   scripts/lr_transfer_rerun.sh            # run (or continue) the study into study/lr-transfer-480/, then the report
#   scripts/lr_transfer_rerun.sh --report   # only regenerate the report from the store; without a
#                                           # study/lr-transfer-480/mlflow.db it unpacks the committed mlflow.db.gz
#
# Setting: as scripts/lr_transfer.sh (2 layers, char-level tinyshakespeare, block 32, batch 8, final validation
# only on 128 windows, untied head, mup base width 32), but 480 steps (48 warm-up, cosine to 0) and heads of 8 at
# every width in both parametrizations (n_head = width / 8: mup's default width rule, and sp the same
# architecture, so the two differ only in the parametrization). mup at width 32 is sp: both are run, as a check.
# One process per (parametrization, width, lrs): a Hydra multirun with the basic launcher, jobs in-process. A point
# already in the store (both seeds) is not run again, so a second call continues an interrupted study. One thread.
# Measured before the run (one thread, 480 steps, single runs with start-up, the other core busy): 47 s at
# width 32, 60 s at 256, 91 s at 128 under a second load: ~80 runs, ~1-1.5 h on one core.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
root=$(pwd)
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
exp=lr-transfer-480
store=study/$exp
out=reports/lr-transfer/480-steps
gz=$out/mlflow.db.gz
uri="sqlite:///$store/mlflow.db"
export OMP_NUM_THREADS=1
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, also when run from a git worktree
mkdir -p "$store" "$out"

# first grids (log2 lr, factor 2, 5 points) per parametrization and width, centred where the first study and the
# issue's 480-step pilot put each optimum: sp's drifts down ~1 step per doubling, mup's stays near 2^-7
first_grid() {  # parametrization width -> "lo hi"
  if [[ $1 == mup ]]; then echo "-9 -5"; return; fi
  case $2 in 32) echo "-9 -5";; 64) echo "-10 -6";; 128) echo "-11 -7";; *) echo "-12 -8";; esac
}
widths=(32 256 128 64)  # the 8x pair first
seeds=0,1
max_extend=3            # lrs a grid may grow past either edge
common=(threads=1 data=shakespeare tokenizer=char model=tiny model.n_layer=2 model.block_size=32
  model.mup.base_width=32 model.mup.head_dim=8 data.batch_size=8 data.val_windows=128 trainer.max_steps=480
  optim=adamw optim.warmup_steps=48 optim.min_lr=0 trainer.val_check_interval=1000000 trainer.log_every_n_steps=40
  "checkpoint.dir=$root/$store/scratch-checkpoints" checkpoint.every_n_steps=1000000 generate.max_new_tokens=8
  generate.bench_prefill_tokens=8 generate.bench_decode_tokens=4 tracking.system_metrics=false tracking.peak_flops=3.95e10
  trainer.enable_progress_bar=false "tracking.experiment=$exp" "tracking.uri=sqlite:///$root/$store/mlflow.db"
  model.tie_weights=false "seed=$seeds")

# what is still to run: lines "parametrization width lr,lr,..."; the first grid's missing points, else one lr past
# an edge where the best lr (lowest mean over seeds) sits at it (at most max_extend past each edge)
todo() {
  local spec=""
  for w in "${widths[@]}"; do for p in sp mup; do spec+="$p $w $(first_grid $p $w);"; done; done
  python - "$uri" "$exp" "$spec" "$seeds" "$max_extend" <<'EOF'
import sys
from analysis.lr_transfer import load_study
from analysis.store import AnalysisError
uri, exp, spec, seeds, max_extend = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(","), int(sys.argv[5])
try:
    pts = load_study(uri, exp).points
except AnalysisError:
    pts = None
for item in filter(None, spec.split(";")):
    p, w, lo, hi = item.split()
    first = [2.0 ** e for e in range(int(lo), int(hi) + 1)]
    mine = pts[(pts["parametrization"] == p) & (pts["width"] == int(w))] if pts is not None else None
    done = {} if mine is None else {lr: g["loss"].mean() for lr, g in mine.groupby("lr") if len(g) >= len(seeds)}
    missing = [lr for lr in first if lr not in done]
    if not missing:
        best, lrs = min(done, key=lambda lr: (done[lr], lr)), sorted(done)
        if best == lrs[0] and lrs[0] > first[0] / 2 ** max_extend:
            missing = [best / 2]
        elif best == lrs[-1] and lrs[-1] < first[-1] * 2 ** max_extend:
            missing = [best * 2]
    if missing:
        print(p, w, ",".join(repr(lr) for lr in missing))
EOF
}

if [[ $report_only == 0 ]]; then
  echo "[lr-transfer-480] $(date -u +%FT%TZ) start at $(git rev-parse HEAD) (dirty: $(git status --porcelain --untracked-files=no | wc -l) files)"
  for round in $(seq 1 12); do  # each round runs every line of todo; a grid grows by one lr per round
    lines=$(todo)
    if [[ -z "$lines" ]]; then break; fi
    while read -r p w lrs; do
      echo "[lr-transfer-480] $(date -u +%T) round $round: $p width $w lr $lrs"
      # a diverged job fails (one line) and the multirun goes on; its exit status is then non-zero
      (cd "$store" && python -m ablations.run -m "model.parametrization=$p" "model.n_embd=$w" \
        "model.n_head=$((w / 8))" "optim.lr=$lrs" "${common[@]}") < /dev/null > "$store/last-multirun.log" 2>&1 || true
    done <<<"$lines"
  done
  if [[ -n "$(todo)" ]]; then echo "[lr-transfer-480] points still missing after 12 rounds:"; todo; fi
  echo "[lr-transfer-480] $(date -u +%FT%TZ) runs done"
  rm -rf "$store/scratch-checkpoints"
  # a compact copy of the store (runs, params, metrics; no artifacts) beside the report
  compact_store "$store/mlflow.db" "$gz"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
python -m analysis.report lr-transfer "$exp" tracking_uri="$uri" out="$out" script=scripts/lr_transfer_rerun.sh
python -m analysis.report mup-hypothesis "$exp" tracking_uri="$uri" out="$out" previous=..
