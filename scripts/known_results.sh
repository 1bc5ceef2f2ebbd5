#!/usr/bin/env bash
# The known-results study (issue 26; conf/verdict/known-results.yaml): seven published swaps against one baseline,
# each decided through the verdict protocol from one clean commit, with the recipe and the seed spread of the recipe
# pilot (reports/recipe-pilot/); then the n-gram floor of the same val targets, paired training throughput of the arms,
# the compact store and the generated report (reports/known-results/report/).
#
#   scripts/known_results.sh            # run (or continue: the protocol skips finished runs) into study/known-results/
#   scripts/known_results.sh --report   # only regenerate the report from the store; without study/known-results/mlflow.db
#                                       # it uses the committed reports/known-results/mlflow.db.gz
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"   # this checkout's code, whatever is installed
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
name=known-results
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=$(mkdir -p "study/$name" && cd "study/$name" && pwd)
gz=reports/$name/mlflow.db.gz
optuna_gz=reports/$name/optuna.db.gz
uri="sqlite:///$store/mlflow.db"
mkdir -p "reports/$name" study/recipe-pilot
# the planner's seed spread: the committed recipe pilot
[[ -f study/recipe-pilot/mlflow.db ]] || gunzip -c reports/recipe-pilot/mlflow.db.gz > study/recipe-pilot/mlflow.db
if [[ $report_only == 0 ]]; then
  continue_stores "$store" "$gz" "$optuna_gz"  # scripts/store.sh: resume from, and compact into, the committed stores
  python -m sweeps.verdict verdict=$name tracking.uri="$uri" verdict.storage="sqlite:///$store/optuna.db" \
    checkpoint.dir="$store/checkpoints" trainer.enable_progress_bar=false
  python -m sweeps.floor experiment=known-results log=true tracking.uri="$uri"
  # training throughput of the arms, paired: interleaved rounds in one process (the runs' own tokens/s were measured
  # at different times on a shared machine), each arm on its fastest path (eager or torch.compile, probed and
  # labelled); the committed measurement's figures stay in the new file's history (docs/bench.md, issue 34)
  m="experiment=known-results"
  python -m ablations.paired model=small-cpu threads=1 steps=2 rounds=40 warmup=3 path=fastest \
    history=reports/$name/paired.json json=reports/$name/paired.json \
    "baseline=$m" "rope=$m position=rope" "rmsnorm=$m norm=rmsnorm" "swiglu=$m mlp=swiglu" "geglu=$m mlp=geglu" \
    "gqa=$m attention=gqa attention.n_kv_head=2" "mqa=$m attention=mqa" "qknorm=$m norm.qk_norm=true"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
# the seed plan (from the committed pilot: what the protocol ran on), and as JSON the sds each arm's seeds were
# planned for, which the report's verdicts check the observed sds against
python -m sweeps.plan verdict=$name pilot_uri=sqlite:///study/recipe-pilot/mlflow.db json="reports/$name/plan.json" \
  > "reports/$name/plan.txt"
rm -rf "reports/$name/report"
MLFLOW_TRACKING_URI="sqlite:///study/$name/mlflow.db" python -m analysis.report known-results $name \
  out="reports/$name/report" paired="reports/$name/paired.json" plan="reports/$name/plan.json"
