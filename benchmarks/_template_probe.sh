#!/usr/bin/env bash
# GPU probe: do template kernels' coordinate-descent winners reach the database? A cold run
# with cachedb installed, then two warm runs from its DB into fresh dirs, each traced
# (benchmarks/_probe_site/sitecustomize.py: check_autotune_cache / coordesc / save per process).
set -u
out=$1; w=$(mktemp -d)
export PYTHONPATH=$PWD/benchmarks/_probe_site:$PYTHONPATH
run() { python3 -m benchmarks._warm_child "$@" --models mlp_autotune --device cuda --t0 "$(date +%s.%N)"; }
PROBE_TRACE=$out/cold.jsonl run cachedb-cold --cache-dir "$w/cold" --db "$w/db.db" > "$out/cold.json" 2> "$out/cold.err"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select count(*), sum(found_by_coordesc) from best_configs').fetchone())" "$w/db.db"
PROBE_TRACE=$out/warm1.jsonl run cachedb --cache-dir "$w/fresh1" --db "$w/db.db" > "$out/warm1.json" 2> "$out/warm1.err"
PROBE_TRACE=$out/warm2.jsonl run cachedb --cache-dir "$w/fresh2" --db "$w/db.db" > "$out/warm2.json" 2> "$out/warm2.err"
PROBE_TRACE=$out/local.jsonl run files --cache-dir "$w/cold" > "$out/local.json" 2> "$out/local.err"
for f in cold warm1 warm2 local; do
  python3 - "$out/$f" <<'PY'
import json, sys, collections
p = sys.argv[1]
recs = [json.loads(l) for l in open(p + ".jsonl")] if __import__("os").path.exists(p + ".jsonl") else []
ev = collections.Counter(r["ev"] for r in recs)
tem = [r for r in recs if "tem" in str(r.get("kernel", "")) or r["ev"] == "save"]
res = json.load(open(p + ".json")) if __import__("os").path.getsize(p + ".json") else {}
print("==", p.split("/")[-1], dict(ev), "coordesc_bench", res.get("counters", {}).get("coordesc_tuning_bench"), "first_call_s", res.get("first_call_s"))
for r in tem[:40]: print("  ", json.dumps(r)[:400])
PY
done
tail -5 $out/cold.err
