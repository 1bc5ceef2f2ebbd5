#!/usr/bin/env bash
# Here (with PyPI), once: what the GPU machine of the `device` tool lacks, into .gpu/ (ignored by git, carried):
#   .gpu/wheels/          hydra-core, omegaconf, antlr4-python3-runtime (the device image has torch 2.11, lightning,
#                         tiktoken, numpy, pyyaml, but not Hydra; it has no network)
#   .gpu/tiktoken-cache/  the GPT-2 BPE files (tokenizer=gpt2), copied from ../shared
# Then `bash scripts/gpu/rehearse.sh` runs the device command on this CPU from a fresh venv with the network off,
# and the device tool runs it for real (the command is printed at the end, and in docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/wheels
PY=${PYTHON:-python3}
# pure-Python wheels for any CPython 3 (the device runs 3.12); antlr4 4.9.3 exists only as an sdist: built here
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels "hydra-core==1.3.8" "omegaconf==2.3.1"
"$PY" -m pip wheel -q --no-deps -w .gpu/wheels "antlr4-python3-runtime==4.9.3"
for d in shared/tiktoken-cache ../shared/tiktoken-cache; do
  [[ -d $d ]] && { cp -r "$d" .gpu/tiktoken-cache; break; }
done
[[ -d .gpu/tiktoken-cache ]] || { echo "prepare.sh: no shared/tiktoken-cache beside the checkout" >&2; exit 1; }
ls -l .gpu/wheels && du -sh .gpu
echo "device command (carry: .gpu):"
echo "  bash scripts/gpu/device.sh"
