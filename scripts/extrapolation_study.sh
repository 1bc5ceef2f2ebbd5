#!/usr/bin/env bash
# The context extrapolation study (issue 13): train six position schemes at context 64 (experiment=extrapolation:
# tinyshakespeare char, small-cpu, same budget, 3 seeds), evaluate every run at 64/128/256/512 tokens in both modes
# (non-overlapping and sliding windows), evaluate rope with each position.scaling, log the n-gram floor of the same
# data (python -m sweeps.floor), then write the report.
#
#   scripts/extrapolation_study.sh            # train + evaluate into $EXTRAPOLATION_STORE/mlflow.db (default
#                                             # study/extrapolation/), then write reports/extrapolation/report/
#   scripts/extrapolation_study.sh --report   # only regenerate reports/extrapolation/report/ from the store; without
#                                             # one it uses the committed reports/extrapolation/mlflow.db.gz
#
# The store's metrics, params and tags (no checkpoint artifacts) are committed as reports/extrapolation/mlflow.db.gz.
# Offline, point the corpus at a local copy with ABLATIONS_SHAKESPEARE_PATH. One thread per process; the schemes
# train and evaluate in 3 parallel streams of two schemes each (EXTRAPOLATION_STREAMS=1 for one after the other).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=$(mkdir -p "${EXTRAPOLATION_STORE:-study/extrapolation}" && cd "${EXTRAPOLATION_STORE:-study/extrapolation}" && pwd)
gz=reports/extrapolation/mlflow.db.gz
uri="sqlite:///$store/mlflow.db"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
contexts="[64,128,256,512]"
max_tokens=8192   # the first 8192 targets of the val split, the same for every run and context
if [[ ${EXTRAPOLATION_STREAMS:-3} == 1 ]]; then streams=("learned,sinusoidal,rope,alibi,nope,t5bias")
else streams=("learned,sinusoidal" "rope,alibi" "nope,t5bias"); fi

evaluate_run() {  # <run id> <position>
  local run=$1 position=$2 ctx=$contexts mode scaling
  if [[ $position == learned ]]; then ctx="[64]"; fi   # a table of 64 positions: nothing past it to evaluate
  for mode in nonoverlap sliding; do
    python -m ablations.evaluate run_id="$run" tracking.uri="$uri" threads=1 eval.mode=$mode \
      eval.contexts="$ctx" eval.max_tokens=$max_tokens
    if [[ $position == rope ]]; then
      for scaling in "{name: linear, factor: 4}" "{name: ntk, factor: 4}" "{name: yarn, factor: 4, original_max: 64}"; do
        python -m ablations.evaluate run_id="$run" tracking.uri="$uri" threads=1 eval.mode=$mode \
          eval.contexts="$ctx" eval.max_tokens=$max_tokens position.scaling="$scaling"
      done
    fi
  done
}

stream() {  # <comma-separated positions>: train them (3 seeds each), then evaluate their finished runs
  (cd "$store" && MLFLOW_TRACKING_URI="$uri" \
    python -m ablations.run -m experiment=extrapolation "position=$1" trainer.enable_progress_bar=false)
  MLFLOW_TRACKING_URI="$uri" python -c "
import sys
from mlflow import MlflowClient
cl = MlflowClient()
exp = cl.get_experiment_by_name('extrapolation')
for r in cl.search_runs([exp.experiment_id], \"attributes.status = 'FINISHED'\", order_by=['attributes.start_time']):
    if r.data.tags['choice.position'] in sys.argv[1].split(','):
        print(r.info.run_id, r.data.tags['choice.position'])" "$1" |
  while read -r run position; do evaluate_run "$run" "$position"; done
}

if [[ $report_only == 0 ]]; then
  pids=()  # (the harness tolerates two streams creating the experiment at once; the sleep makes it rare)
  for s in "${streams[@]}"; do stream "$s" & pids+=($!); sleep 20; done
  for p in "${pids[@]}"; do wait "$p"; done
  # the n-gram floor of the same data, tokenizer and val targets, logged into the store (the report reads it)
  python -m sweeps.floor experiment=extrapolation log=true tracking.uri="$uri"
  # a compact copy of the store (no artifacts) beside the report
  mkdir -p reports/extrapolation
  compact_store "$store/mlflow.db" "$gz"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
rm -rf reports/extrapolation/report
# a store path relative to the repository, so that the report (which names its store) is the same on any checkout
MLFLOW_TRACKING_URI="sqlite:///$(realpath --relative-to=. "$store")/mlflow.db" \
  python -m analysis.report ablation extrapolation out=reports/extrapolation/report
