#!/usr/bin/env bash
# The first study (issue 7): the four shipped ablations on tinyshakespeare (char tokenizer), small-cpu size,
# 3 seeds each, matched budgets (conf/experiment/*.yaml: same steps, batch, context and lr for every variant), then
# one report per family regenerated from the MLflow store the study wrote.
#
#   scripts/first_study.sh            # train everything into study/mlflow.db, then write reports/first-study/
#   scripts/first_study.sh --report   # only regenerate reports/first-study/*/ from the store; without a
#                                     # study/mlflow.db it uses the committed copy reports/first-study/mlflow.db.gz
#
# The store's metrics, params and tags (not its checkpoint artifacts) are committed as
# reports/first-study/mlflow.db.gz so that anyone can regenerate or re-analyse the report without re-training.
# Offline, point the corpus at a local copy with ABLATIONS_SHAKESPEARE_PATH (else it is downloaded and checksummed).
# OMP_NUM_THREADS=1 by default: on a shared 2-core machine one thread per run gives steady timings.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=study
gz=reports/first-study/mlflow.db.gz
mkdir -p "$store"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
families=(norms positions mlps attention)
# The arms the first study trained, pinned: the experiment files have since gained variants (dyt, t5bias).
declare -A arms=([norms]="norm=layernorm,rmsnorm" [positions]="position=learned,rope,alibi,nope,sinusoidal"
                 [mlps]="mlp=gelu,relu2,swiglu,geglu" [attention]="attention=mha,gqa,mqa,sliding,mla")
if [[ $report_only == 0 ]]; then
  for family in "${families[@]}"; do
    (cd "$store" && MLFLOW_TRACKING_URI="sqlite:///$(pwd)/mlflow.db" \
      python -m ablations.run -m "experiment=$family" "${arms[$family]}" trainer.enable_progress_bar=false)
  done
  # a compact copy of the store (no artifacts) beside the report
  compact_store "$store/mlflow.db" "$gz"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
for family in "${families[@]}"; do
  rm -rf "reports/first-study/$family"
  MLFLOW_TRACKING_URI="sqlite:///$store/mlflow.db" python -m analysis.report ablation "$family" out="reports/first-study/$family"
done
