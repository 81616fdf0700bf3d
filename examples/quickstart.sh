#!/usr/bin/env bash
# The quick start, one command on a fresh machine: installs cachedb and torch 2.13 (CPU), builds
# a real Inductor cache with torch.compile, imports it into one SQLite file and queries it.
#   bash examples/quickstart.sh [WORK_DIR]
# Installs into the active virtual environment, else into ./.venv (created if absent).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  . .venv/bin/activate
fi
python -m pip install -q torch==2.13.0          # pinned first: never an unpinned torch
python -m pip install -q -e ".[torch]"

work=${1:-$(mktemp -d)}
python examples/build_cache.py "$work/inductor"  # real torch.compile runs into a fresh cache dir
cachedb --db "$work/cache.db" import "$work/inductor"
cachedb --db "$work/cache.db" stats
cachedb --db "$work/cache.db" query \
  "SELECT op, precision, choice_hash, timing_ms, candidates FROM autotune_winners"
cachedb --db "$work/cache.db" query \
  "SELECT kind, key, guards_expr, size_bytes FROM guarded_entries WHERE guards_expr IS NOT NULL"
echo "database: $work/cache.db"
