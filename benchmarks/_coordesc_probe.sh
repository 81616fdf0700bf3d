#!/usr/bin/env bash
# GPU probe for issue 10: which kernels still run coordinate descent on a warm start.
# Usage: bash benchmarks/_coordesc_probe.sh OUTDIR  (a cold run with cachedb installed fills a
# DB; a warm run from it into a fresh dir and a warm run on the cold run's local files are
# traced: one JSON line per runtime coordinate descent, --trace-coordesc).
set -eu
out=$1; w=$(mktemp -d)
run() { python3 -m benchmarks._warm_child "$@" --models mlp_autotune,transformer,dynamic_gpu --device cuda --t0 "$(date +%s.%N)"; }
run cachedb-cold --cache-dir "$w/cold" --db "$w/db.db" > "$out/cold.json"
run cachedb --cache-dir "$w/fresh" --db "$w/db.db" --trace-coordesc "$out/trace_db.jsonl" > "$out/db.json"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute(\"select key, content from best_configs where key like 'coordesc/%'\").fetchall())" "$w/db.db" > "$out/coordesc_configs.txt"
