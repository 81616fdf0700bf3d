#!/usr/bin/env bash
# GPU check for issue 10: a cold run with cachedb installed fills a DB (CACHEDB_LOG_FILE trace,
# best configs counted, .best_config files left in the cache dir counted: 0 expected); a warm
# run from it into a fresh dir records the config each kernel's launcher ran with
# (--dump-launchers) and each runtime coordinate descent (--trace-coordesc); prints how many
# kernels ran the cold run's winner. Usage: bash benchmarks/_launcher_probe.sh OUTDIR
set -eu
out=$1; w=$(mktemp -d)
run() { python3 -m benchmarks._warm_child "$@" --models mlp_autotune,transformer,dynamic_gpu --device cuda --t0 "$(date +%s.%N)"; }
CACHEDB_LOG_FILE=$out/cold_trace.log run cachedb-cold --cache-dir "$w/cold" --db "$w/db.db" --dump-launchers "$out/cold_launchers.json" > "$out/cold.json"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print('best_configs', c.execute('select count(*) from best_configs').fetchone())" "$w/db.db"
find "$w/cold" -name "*.best_config" | wc -l
CACHEDB_LOG_FILE=$out/warm_trace.log run cachedb --cache-dir "$w/fresh" --db "$w/db.db" --trace-coordesc "$out/trace_db.jsonl" --dump-launchers "$out/db_launchers.json" > "$out/db.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
cold = json.load(open(f"{out}/cold_launchers.json")); warm = json.load(open(f"{out}/db_launchers.json"))
diff = {k: (cold[k], warm[k]) for k in cold if k in warm and cold[k] != warm[k]}
print(json.dumps({"kernels_cold": len(cold), "kernels_warm": len(warm), "same": sum(1 for k in cold if k in warm and cold[k] == warm[k]), "different": len(diff)}))
for k, v in diff.items(): print(k, v)
print("coordesc warm:", json.load(open(f"{out}/db.json"))["counters"].get("coordesc_tuning_bench"), "first calls", json.load(open(f"{out}/db.json"))["first_call_s"])
PY
