#!/usr/bin/env bash
# The GPU check rehearsed on this CPU, so that nothing is learned on the GPU's clock (run scripts/gpu/prepare.sh first):
# 1. a fresh venv ($VENV) on Python 3.12 (the image's python3 is 3.12.3; scripts/gpu/python312.sh picks one that
#    runs) with the image's versions of what the check uses: torch 2.11.0 (PyPI's Linux build, the CUDA 13 one as
#    on the image: it runs on the CPU here), numpy 2.5.2, tiktoken 0.14.0, pyyaml, lightning 2.6.6; and not Hydra,
#    OmegaConf or MLflow, which the image lacks too;
# 2. a copy of what the device tool sends (git's tracked and untracked-not-ignored files) plus the carried .gpu/,
#    at a path with no ../shared beside it;
# 3. scripts/gpu/device.sh there with DEVICE=cpu and the network off (unshare -n), pip with no config: the wheel
#    install is --no-index from .gpu/wheels alone; then the files under $OUT are checked against the tool's limits.
# `rehearse.sh --paired` rehearses `device.sh --paired` (the known-results paired table) the same way.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -d .gpu/wheels ]] || { echo "rehearse.sh: run scripts/gpu/prepare.sh first" >&2; exit 1; }
VENV=${VENV:-/tmp/gpu-rehearsal-venv}
TREE=${TREE:-/tmp/gpu-rehearsal/tree}
OUT=${OUT:-/tmp/gpu-rehearsal/out}
if [[ ! -x $VENV/bin/python ]]; then
  PY312=$(bash scripts/gpu/python312.sh) || exit 1  # the first candidate that runs (a pyenv shim may not)
  "$PY312" -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.11.0 numpy==2.5.2 tiktoken==0.14.0 pyyaml lightning==2.6.6 scipy
fi
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
assert sys.version_info[:2] == (3, 12), sys.version
import torch
assert torch.__version__.startswith("2.11.0"), torch.__version__
extra = [m for m in ("hydra", "omegaconf", "antlr4", "mlflow", "optuna", "datasets") if importlib.util.find_spec(m)]
assert not extra, f"the rehearsal venv has {extra}, which the device image lacks"
PY
# what travels: the working tree as git sees it (tracked + untracked-not-ignored) and the carried .gpu/
rm -rf "$TREE" "$OUT" && mkdir -p "$TREE" "$OUT"
{ git ls-files -co --exclude-standard -z | grep -zv '^\.gpu/'; find .gpu -type f -print0; } |
  tar --null -T - -cf - | tar -xf - -C "$TREE"
size=$(du -sb "$TREE" | cut -f1)
echo "rehearse.sh: the device would receive $((size / 1024)) KiB ($(du -sh .gpu | cut -f1) of it .gpu); limit 64 MiB"
(( size < 60 * 2**20 )) || { echo "rehearse.sh: over the device tool's 64 MiB" >&2; exit 1; }
# no network, as on the device; loopback up, as there (FSDP's rendezvous store listens on 127.0.0.1: with lo down
# in the new namespace, fsdp_mfu.py retried its connection for the store's 30-minute timeout)
NET=(); unshare -n true 2>/dev/null && NET=(unshare -n sh -c 'ip link set lo up 2>/dev/null; exec "$@"' sh)
cd "$TREE"
start=$SECONDS
env -u TIKTOKEN_CACHE_DIR -u PYTHONPATH PIP_CONFIG_FILE=/dev/null TORCHINDUCTOR_CACHE_DIR="$TREE/.inductor-cache" \
  TORCHINDUCTOR_COMPILE_THREADS=1 OUT="$OUT" DEVICE=cpu PYTHON="$VENV/bin/python" GPU_SITE="$TREE/.site" \
  "${NET[@]}" nice -n 10 bash scripts/gpu/device.sh "$@"
echo "rehearse.sh: device.sh took $((SECONDS - start)) s here${NET:+ with the network off}"
n=0
for f in "$OUT"/*; do
  n=$((n + 1)); s=$(stat -c %s "$f")
  (( s < 16 * 2**20 )) || { echo "rehearse.sh: $f is over the 16 MiB that come back" >&2; exit 1; }
done
(( n <= 8 )) || { echo "rehearse.sh: $n files under \$OUT, the tool returns 8" >&2; exit 1; }
want=(gpu.json bench.json bench.txt device.log); [[ ${1:-} == --paired ]] && want=(paired.json device.log)
for f in "${want[@]}"; do [[ -s $OUT/$f ]] || { echo "rehearse.sh: no $OUT/$f" >&2; exit 1; }; done
ls -l "$OUT"
