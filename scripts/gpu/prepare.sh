#!/usr/bin/env bash
# Here (with PyPI), once: what the device tool's H200 image lacks for scripts/gpu/device.sh, into .gpu/ (ignored by
# git through .git/info/exclude; the run carries it):
#   .gpu/wheels/          hydra-core, omegaconf, antlr4-python3-runtime: pure-Python wheels for the image's Python
#                         3.12 (the image has torch 2.11.0+cu130, numpy, pyyaml, packaging, tiktoken 0.14, lightning;
#                         not Hydra, OmegaConf or MLflow; it has no network)
#   .gpu/tiktoken-cache/  the GPT-2 BPE files (tokenizer=gpt2), from shared/ (../shared does not travel)
# Then `bash scripts/gpu/rehearse.sh` runs the device command on this CPU as the device would (docs/bench.md, GPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/wheels
PY=${PYTHON:-python3}
# the versions this checkout's .venv runs; any CPython 3 wheel, checked for Python 3.12 (the device's)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  -d .gpu/wheels "hydra-core==1.3.8" "omegaconf==2.3.1"
# antlr4-python3-runtime 4.9.3 (the 4.9.* omegaconf pins) exists only as an sdist: built here into a py3 wheel
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .gpu/wheels "antlr4-python3-runtime==4.9.3" 2>/dev/null ||
  "$PY" -m pip wheel -q --no-deps -w .gpu/wheels "antlr4-python3-runtime==4.9.3"
for w in .gpu/wheels/*.whl; do
  [[ $w == *-py3-none-any.whl || $w == *-py2.py3-none-any.whl ]] || { echo "prepare.sh: $w is not pure Python" >&2; exit 1; }
done
# not scipy (ablations.paired's t intervals): the image has it (KINDS.md's package list), and its 35 MB wheel beside the
# tracked files' ~55 MiB (reports/' stores) would put the call over the tool's 64 MiB
for d in shared/tiktoken-cache ../shared/tiktoken-cache; do
  [[ -d $d ]] && { cp -r "$d" .gpu/tiktoken-cache; break; }
done
[[ -d .gpu/tiktoken-cache ]] || { echo "prepare.sh: no shared/tiktoken-cache in or beside the checkout" >&2; exit 1; }
git check-ignore -q .gpu || { echo "prepare.sh: .gpu is not ignored by git" >&2; exit 1; }
ls -l .gpu/wheels .gpu/tiktoken-cache
du -sh .gpu
echo "prepare.sh: now bash scripts/gpu/rehearse.sh; on the device: run command 'bash scripts/gpu/device.sh' carry [\".gpu\"] timeout_s 540"
