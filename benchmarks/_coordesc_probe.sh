#!/usr/bin/env bash
# GPU probe for issue 10: which kernels still run coordinate descent on a warm start from the
# database. Usage: bash benchmarks/_coordesc_probe.sh OUTDIR
set -eu
out=$1; w=$(mktemp -d)
run() { python3 -m benchmarks._warm_child "$@" --models mlp_autotune,transformer,dynamic_gpu --device cuda --t0 "$(date +%s.%N)"; }
run files --cache-dir "$w/cold" > "$out/cold.json"
python3 - "$w/cold" "$w/db.db" <<'PY'
import sys
from cachedb import CacheDB
from cachedb.fingerprint import current, cpp_host_key
from cachedb.importer import Importer
with CacheDB(sys.argv[2]) as db:
    Importer(db, fingerprint=current(), host_key=cpp_host_key()).run(sys.argv[1])
PY
run files --cache-dir "$w/cold" --trace-coordesc "$out/trace_local.jsonl" > "$out/local.json"
run cachedb --cache-dir "$w/fresh" --db "$w/db.db" --trace-coordesc "$out/trace_db.jsonl" > "$out/db.json"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select key, content from best_configs').fetchall())" "$w/db.db" > "$out/best_configs.txt"
