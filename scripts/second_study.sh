#!/usr/bin/env bash
# The second study (issue 14): the seeds' two swaps (learned -> rope, layernorm -> rmsnorm) and the MLP family, run
# through the verdict protocol (conf/verdict/second-study.yaml): per size of a 3-rung ladder and per arm an lr grid
# search (one seed), then 2 seeds at that arm's best lr (5 at the largest size), every run at the size's compute
# budget; then the n-gram floor of the same data (python -m sweeps.floor) and the report with verdicts, the floor,
# scaling fits and compute multipliers. The runs (made before issue 19) recorded no margin: the report tests no
# equivalence, and its Holm family is the default, all 15 comparisons.
#
#   scripts/second_study.sh            # run (or continue) the protocol into study/second-study/, then the report
#   scripts/second_study.sh --report   # only regenerate reports/second-study/ from the store; without a
#                                      # study/second-study/mlflow.db it uses the committed reports/second-study/mlflow.db.gz
#
# Offline, point the corpus at a local copy with ABLATIONS_SHAKESPEARE_PATH (else it is downloaded and checksummed).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
report_only=0
if [[ "${1:-}" == "--report" ]]; then report_only=1; fi
store=study/second-study
gz=reports/second-study/mlflow.db.gz
mkdir -p "$store" reports/second-study
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [[ $report_only == 0 ]]; then
  (cd "$store" && python -m sweeps.verdict verdict=second-study "tracking.uri=sqlite:///$(pwd)/mlflow.db" \
    "verdict.storage=sqlite:///$(pwd)/optuna.db" trainer.enable_progress_bar=false)
  # the n-gram floor of the same data, tokenizer and val targets, logged into the store (the report reads it)
  python -m sweeps.floor experiment=second-study log=true "tracking.uri=sqlite:///$store/mlflow.db"
  # a compact copy of the store (no artifacts) beside the report
  compact_store "$store/mlflow.db" "$gz"
  # training throughput of the arms, paired: interleaved rounds in one process at the largest size (m), not the
  # runs' own tokens/s, which were measured at different times on a shared machine
  m="model.n_layer=2 model.n_head=2 model.n_embd=64 tokenizer=char tokenizer.vocab_size=65"
  python -m ablations.paired model=small-cpu threads=1 steps=10 rounds=12 json=reports/second-study/paired.json \
    "baseline=$m" "rope=$m position=rope" "rmsnorm=$m norm=rmsnorm" "swiglu=$m mlp=swiglu" "geglu=$m mlp=geglu" \
    "relu2=$m mlp=relu2"
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
rm -rf reports/second-study/report
MLFLOW_TRACKING_URI="sqlite:///$store/mlflow.db" python -m analysis.report protocol second-study out=reports/second-study/report \
  paired=reports/second-study/paired.json
