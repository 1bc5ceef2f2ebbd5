#!/usr/bin/env bash
# The test command, for a fresh clone on a fresh machine (and exactly what CI's .ci/run calls):
#
#   bash scripts/test.sh                     # the whole suite
#   bash scripts/test.sh tests/test_x.py -x  # arguments go to pytest
#
# 1. Debian's `postgresql` (sweep workers, the protocol and the MLflow tracking-server tests) and `chromium` (the
#    report's browser test) are installed when missing: apt-get as root, else `sudo -n`; without either right it
#    prints the one command to run and stops (those tests fail, never skip, when CI=true).
# 2. As root (CI), the packaged PostgreSQL cluster is started with a role and database `ablations`, exported as
#    ABLATIONS_TEST_POSTGRES_URL. Otherwise the tests start throwaway servers themselves (tests/pgtest.py).
# 3. .venv is created (or reused), torch and the project with [test] installed, and pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "scripts/test.sh: $*" >&2; }

# --- 1. system packages
missing=()
command -v pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]]; then SUDO=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=(sudo -n)
  else
    say "missing ${missing[*]}: run 'sudo apt-get install -y ${missing[*]}' (Debian/Ubuntu), then this command again"
    exit 1
  fi
  say "installing ${missing[*]} (apt-get)"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 2. PostgreSQL: the packaged cluster as root (as CI runs); else tests/pgtest.py starts throwaway servers
if [[ $(id -u) == 0 && -z ${ABLATIONS_TEST_POSTGRES_URL:-} ]] && command -v pg_ctlcluster >/dev/null 2>&1; then
  pg_version=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
  pg_lsclusters -h | grep -q "^${pg_version} *main " || pg_createcluster "$pg_version" main >/dev/null
  pg_ctlcluster "$pg_version" main start 2>/dev/null || pg_lsclusters -h | grep -q "^${pg_version} *main .*online"
  port=$(pg_lsclusters -h | awk -v v="$pg_version" '$1 == v && $2 == "main" {print $3}')
  psql_pg() { runuser -u postgres -- psql -p "$port" -tAc "$1"; }
  psql_pg "SELECT 1 FROM pg_roles WHERE rolname='ablations'" | grep -q 1 \
    || psql_pg "CREATE ROLE ablations LOGIN PASSWORD 'ablations' CREATEDB" >/dev/null
  psql_pg "SELECT 1 FROM pg_database WHERE datname='ablations'" | grep -q 1 \
    || runuser -u postgres -- createdb -p "$port" -O ablations ablations
  export ABLATIONS_TEST_POSTGRES_URL=postgresql://ablations:ablations@127.0.0.1:${port}/ablations
fi

# --- 3. the environment and the suite (torch first: a bare resolve could pull another build)
if [[ -z ${TIKTOKEN_CACHE_DIR:-} && -d ../shared/tiktoken-cache ]]; then
  export TIKTOKEN_CACHE_DIR=../shared/tiktoken-cache
fi
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0
pip install -q -e '.[test]'
# two pytest-xdist workers, one test file each at a time (a file's module fixtures stay in one process):
# CI's 2 cores; ABLATIONS_TEST_WORKERS=0 runs in this one process
exec python -m pytest -n "${ABLATIONS_TEST_WORKERS:-2}" --dist loadfile "$@"
