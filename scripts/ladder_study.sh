#!/usr/bin/env bash
# The ladder study (issue 37; conf/verdict/known-results-ladder.yaml; docs/ladder.md): the known-results arms at four
# smaller widths through the verdict protocol (sequential seeds, the lr walk) from one clean commit, then the n-gram
# floor of the same val targets and the ladder report, whose held-out rung is the committed known-results study.
#
#   scripts/ladder_study.sh            # run (or continue: finished runs are skipped, the lr studies resume) into
#                                      # study/known-results-ladder/; start it from a `git worktree` at the study's
#                                      # commit so main moves on; the store is compacted into reports/ on every exit
#   scripts/ladder_study.sh --report   # only regenerate the report from the store; without
#                                      # study/known-results-ladder/mlflow.db it uses the committed mlflow.db.gz
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's code, whatever is installed
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
name=known-results-ladder
out=reports/$name
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=$(mkdir -p "study/$name" && cd "study/$name" && pwd)
gz=$out/mlflow.db.gz
optuna_gz=$out/optuna.db.gz
uri="sqlite:///$store/mlflow.db"
mkdir -p "$out"
if [[ $report_only == 0 ]]; then
  continue_stores "$store" "$gz" "$optuna_gz"  # scripts/store.sh: resume from, and compact into, the committed stores
  python -m sweeps.verdict verdict=$name tracking.uri="$uri" verdict.storage="sqlite:///$store/optuna.db" \
    checkpoint.dir="$store/checkpoints" trainer.enable_progress_bar=false
  python -m sweeps.floor experiment=$name log=true tracking.uri="$uri"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
rm -rf "$out/report"
# the store named relative to this checkout: the report (its Regenerate command) is the same wherever it is cloned
MLFLOW_TRACKING_URI="sqlite:///study/$name/mlflow.db" python -m analysis.report ladder $name out="$out/report" \
  held_out=known-results=reports/known-results/mlflow.db.gz
