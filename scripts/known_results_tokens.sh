#!/usr/bin/env bash
# A follow-up of the known-results study (issue 26), designed after its results: how much of GQA's and MQA's
# difference from multi-head attention is tokens? The study matches FLOPs, so the arms with fewer KV projections train
# longer (GQA 1,623 steps: +8.2% tokens; MQA 1,693: +12.9%). Here every arm trains the baseline's 1,500 steps
# (3,072,000 tokens) at the lr the study chose for it, on the study's seeds 0-5 (the same data order per seed), in
# one store at one commit; the baseline's runs repeat the study's own.
#
#   scripts/known_results_tokens.sh            # train into study/known-results-tokens/, then the report
#   scripts/known_results_tokens.sh --report   # only regenerate reports/known-results/matched-tokens/report/ from the
#                                              # store; without one it uses the committed mlflow.db.gz there
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/store.sh   # compact_store
export PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
name=known-results-tokens
out=reports/known-results/matched-tokens
store=$(mkdir -p "study/$name" && cd "study/$name" && pwd)
gz=$out/mlflow.db.gz
uri="sqlite:///$store/mlflow.db"
steps=trainer.max_steps=1500
mkdir -p "$out"
# each arm: its overrides and the lr the study's lr stage chose for it (reports/known-results/report/lr_search.csv)
arms=("optim.lr=0.003" "attention=gqa attention.n_kv_head=2 optim.lr=0.006" "attention=mqa optim.lr=0.003")

stream() {  # <comma-separated seeds>: every arm at these seeds
  local arm
  for arm in "${arms[@]}"; do
    # shellcheck disable=SC2086  # an arm is several overrides
    (cd "$store" && python -m ablations.run -m experiment=known-results tracking.experiment=$name tracking.uri="$uri" \
      $steps $arm "seed=$1" trainer.enable_progress_bar=false)
  done
}

if [[ "${1:-}" != "--report" ]]; then
  trap 'compact_store "$store/mlflow.db" "$gz"' EXIT
  stream 0,1,2 & a=$!
  stream 3,4,5 & b=$!
  failed=0
  wait $a || failed=1
  wait $b || failed=1
  if ((failed)); then echo "known_results_tokens.sh: a stream failed (see above); rerun to add its runs" >&2; exit 1; fi
elif [[ ! -f "$store/mlflow.db" ]]; then
  gunzip -c "$gz" > "$store/mlflow.db"
fi
rm -rf "$out/report"
# the study's margin (fixed before its runs); Holm over the two comparisons; a relative URI: the same bytes anywhere
MLFLOW_TRACKING_URI="sqlite:///study/$name/mlflow.db" python -m analysis.report ablation $name out="$out/report" \
  margin=0.02 baseline="$steps ${arms[0]}"
# the baseline's runs repeat the study's seeds 0-5 exactly (same config, seed and data order), on whatever machine
# ran them (each report's Provenance names the machines): per seed, this re-run minus the study's run
python - "$out/report/runs.csv" reports/known-results/report/runs.csv "$steps ${arms[0]}" > "$out/baseline_rerun.txt" <<'PY'
import sys
import pandas as pd
rerun, study, variant = pd.read_csv(sys.argv[1]), pd.read_csv(sys.argv[2]), sys.argv[3]
a = rerun[rerun["variant"] == variant].set_index("seed")
b = study[(study["verdict.arm"] == "baseline") & (study["verdict.stage"] == "seeds")].set_index("seed")
print("the baseline, seeds 0-5: this follow-up's re-run against the study's run (final val bpb)")
print("seed  study   re-run  re-run - study")
d = (a["final_val_bpb"] - b["final_val_bpb"].loc[a.index]).rename("d")
for s in a.index:
    print(f"{s:>4}  {b.loc[s, 'final_val_bpb']:.4f}  {a.loc[s, 'final_val_bpb']:.4f}  {d[s]:+.4f}")
print(f"mean {d.mean():+.4f}, sd {d.std():.4f}, largest |difference| {d.abs().max():.4f} over {len(d)} seeds")
PY
