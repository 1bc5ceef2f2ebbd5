#!/usr/bin/env bash
# The first study (issue 7): the four shipped ablations on tinyshakespeare (char tokenizer), small-cpu size,
# 3 seeds each, matched budgets (conf/experiment/*.yaml: same steps, batch and context for every variant), then one
# report per family regenerated from the MLflow store the study wrote.
#
#   scripts/first_study.sh [STORE_DIR]          # train everything, then write reports/first-study/
#   scripts/first_study.sh --report [STORE_DIR] # only regenerate the reports from an existing store
#
# STORE_DIR (default: study/) holds mlflow.db and the runs' artifacts. Offline, point the corpus at a local copy
# with ABLATIONS_SHAKESPEARE_PATH (it is downloaded and checksum-verified otherwise).
# OMP_NUM_THREADS=1 by default: on a shared 2-core machine one thread per run gives steady timings.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; shift; fi
store=$(mkdir -p "${1:-study}" && cd "${1:-study}" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MLFLOW_TRACKING_URI="sqlite:///$store/mlflow.db"
families=(norms positions mlps attention)
if [[ $report_only == 0 ]]; then
  for family in "${families[@]}"; do
    (cd "$store" && python -m ablations.run -m "experiment=$family" trainer.enable_progress_bar=false)
  done
fi
for family in "${families[@]}"; do
  python -m analysis.report "$family" --out "$repo/reports/first-study/$family"
done
