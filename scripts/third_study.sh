#!/usr/bin/env bash
# The third study (issue 19): the seeds' two swaps (learned -> rope, layernorm -> rmsnorm) on models that beat the
# n-gram floor, through the verdict protocol (conf/verdict/third-study.yaml: margin, Holm family, seed plan and lr
# design fixed before any run; mup, lr searched at width 32 with two seeds per point and reused at width 128), from
# one clean commit (sweeps.verdict refuses a dirty tree); then the n-gram floor of the same val targets, paired
# throughput of the arms at the largest size, the compact store and the generated report.
#
#   scripts/third_study.sh            # run (or continue) the protocol into study/third-study/, then the report
#   scripts/third_study.sh --report   # only regenerate reports/third-study/report/ and plan.txt from the store; without a
#                                     # study/third-study/mlflow.db it uses the committed reports/third-study/mlflow.db.gz
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's code, whatever is installed
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=$(mkdir -p study/third-study && cd study/third-study && pwd)
gz=reports/third-study/mlflow.db.gz
uri="sqlite:///$store/mlflow.db"
mkdir -p reports/third-study
if [[ $report_only == 0 ]]; then
  python -m sweeps.verdict verdict=third-study tracking.uri="$uri" verdict.storage="sqlite:///$store/optuna.db" \
    checkpoint.dir="$store/checkpoints" trainer.enable_progress_bar=false
  # the floor: count models fitted on the same train tokens, scored on the runs' val targets (512 windows of 64)
  python -m sweeps.floor experiment=third-study log=true tracking.uri="$uri"
  # training throughput of the arms at m, paired: interleaved rounds in one process (the runs' own tokens/s were
  # measured at different times on a shared machine)
  m="experiment=third-study model.n_layer=4 model.n_head=4 model.n_embd=128"
  python -m ablations.paired model=small-cpu threads=1 steps=10 rounds=8 \
    json=reports/third-study/paired.json "baseline=$m" "rope=$m position=rope" "rmsnorm=$m norm=rmsnorm"
  # a compact copy of the store (metrics, params, tags; no artifacts) beside the report
  compact_store "$store/mlflow.db" "$gz"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
# the plan the protocol ran on (plan.sd of conf/verdict/third-study.yaml), as JSON: the sds each arm's seeds were
# planned for, which the report's verdicts check the observed sds against
python -m sweeps.plan verdict=third-study json=reports/third-study/plan.json > /dev/null
rm -rf reports/third-study/report
MLFLOW_TRACKING_URI="sqlite:///study/third-study/mlflow.db" python -m analysis.report protocol third-study out=reports/third-study/report \
  paired=reports/third-study/paired.json plan=reports/third-study/plan.json
# what the study's own seed spread says it would take (the planner with this store as the pilot, not plan.sd)
python -m sweeps.plan verdict=third-study pilot=third-study pilot_uri=sqlite:///study/third-study/mlflow.db sd=null \
  > reports/third-study/plan.txt
