#!/usr/bin/env bash
# Prints the path of the first Python 3.12 here that runs, for scripts/gpu/rehearse.sh's venv (the image's python3
# is 3.12). Each candidate is run, not just found: pyenv puts a python3.12 shim on PATH that exits 127 ("command
# not found") unless 3.12 is the active version. Candidates in order: $PY312 (when set, the only one), every
# python3.12 on PATH, $PYENV_ROOT/versions/3.12*/bin/python3 (newest first), python3 on PATH.
# None runs: one line on stderr, exit 1.
set -uo pipefail

runs_312() {  # the interpreter starts and is 3.12 (a 3.11 called python3.12 would build the wrong venv)
  "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1
}

if [[ -n ${PY312:-} ]]; then
  runs_312 "$PY312" && { echo "$PY312"; exit 0; }
  echo "python312.sh: PY312=$PY312 does not run as Python 3.12; point PY312 at one that does, or unset it" >&2
  exit 1
fi
candidates=()
while IFS= read -r c; do candidates+=("$c"); done < <(type -ap python3.12)
while IFS= read -r c; do candidates+=("$c"); done < <(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3 \
                                                          2>/dev/null | sort -rV)
while IFS= read -r c; do candidates+=("$c"); done < <(type -ap python3)
for c in "${candidates[@]}"; do
  runs_312 "$c" && { echo "$c"; exit 0; }
done
echo "python312.sh: no Python 3.12 here runs (tried: ${candidates[*]:-none}); set PY312=/path/to/python3.12" >&2
exit 1
