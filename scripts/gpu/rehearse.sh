#!/usr/bin/env bash
# The GPU check rehearsed on this CPU, so nothing is learned on the GPU's clock: a fresh venv holding what the
# device image holds (torch pinned: 2.11.0 there; here the CPU build in /opt/wheels or $TORCH_WHEEL, lightning
# 2.6.6, tiktoken, numpy, pyyaml, scipy), then scripts/gpu/device.sh with DEVICE=cpu, whose wheel install is
# --no-index (no network) from the carried .gpu/wheels alone. Run scripts/gpu/prepare.sh first.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ -d .gpu/wheels ]] || { echo "rehearse.sh: run scripts/gpu/prepare.sh first" >&2; exit 1; }
VENV=${VENV:-/tmp/gpu-rehearsal-venv}
TORCH_WHEEL=${TORCH_WHEEL:-$(ls /opt/wheels/torch-*.whl 2>/dev/null | head -n 1)}
if [[ ! -x $VENV/bin/python ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "${TORCH_WHEEL:-torch==2.11.0}"
  "$VENV/bin/pip" install -q "lightning==2.6.6" "tiktoken==0.14.0" numpy pyyaml scipy
fi
"$VENV/bin/python" -c "import hydra" 2>/dev/null && { echo "rehearse.sh: $VENV already has hydra" >&2; exit 1; }
rm -rf /tmp/gpu-site
OUT=${OUT:-/tmp/gpu-rehearsal-out} DEVICE=cpu PYTHON=$VENV/bin/python bash scripts/gpu/device.sh
