#!/usr/bin/env bash
# The recipe pilot (issue 26 item 1; conf/verdict/recipe-pilot.yaml): the known-results baseline under three training
# recipes, each at its own searched lr, five seeds each, through the verdict protocol from one clean commit; then the
# n-gram floor of the same val targets, the compact store and the generated report.
#
#   scripts/recipe_pilot.sh            # run (or continue) the protocol into study/recipe-pilot/, then the report
#   scripts/recipe_pilot.sh --report   # only regenerate reports/recipe-pilot/report/ from the store; without a
#                                      # study/recipe-pilot/mlflow.db it uses the committed reports/recipe-pilot/mlflow.db.gz
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's code, whatever is installed
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
name=recipe-pilot
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=$(mkdir -p "study/$name" && cd "study/$name" && pwd)
gz=reports/$name/mlflow.db.gz
uri="sqlite:///$store/mlflow.db"
mkdir -p "reports/$name"
if [[ $report_only == 0 ]]; then
  if [[ ! -f "$store/mlflow.db" && -f "$gz" ]]; then gunzip -c "$gz" > "$store/mlflow.db"; fi  # resume from a commit
  python -m sweeps.verdict verdict=$name tracking.uri="$uri" verdict.storage="sqlite:///$store/optuna.db" \
    checkpoint.dir="$store/checkpoints" trainer.enable_progress_bar=false
  # the floor: count models fitted on the same train tokens, scored on the runs' val targets
  python -m sweeps.floor experiment=known-results log=true tracking.uri="$uri"
  # a compact copy of the store (metrics, params, tags; no artifacts) beside the report
  compact_store "$store/mlflow.db" "$gz"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
rm -rf "reports/$name/report"
MLFLOW_TRACKING_URI="sqlite:///study/$name/mlflow.db" python -m analysis.report protocol $name out="reports/$name/report"
