#!/usr/bin/env bash
# GPU probe (device tool): why does a warm start from the live-filled database take longer than
# one from the imported database (§1)? Builds both from cold runs, then runs warm starts from
# each into a fresh dir and a fresh TMPDIR, alternating, with CACHEDB_LOG_FILE tracing every
# lookup of every process (compile workers included), and sums the misses per kind.
#   bash benchmarks/_live_vs_imported_probe.sh [PAIRS]     (needs .whl/; benchmarks/README.md)
set -uo pipefail
PAIRS=${1:-2}; MODELS=mlp_autotune,transformer,dynamic_gpu
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
python3 -m compileall -q -j 0 /tmp/site "$PWD/cachedb" "$PWD/benchmarks" > /dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
W=/tmp/lvi; rm -rf $W; mkdir -p $W
child() {  # MODE NAME ARGS...: one _warm_child process with its own TMPDIR; prints first calls and per-model seconds
  local mode=$1 name=$2; shift 2; mkdir -p $W/tmp-$name
  TMPDIR=$W/tmp-$name CACHEDB_LOG_FILE=$W/$name.log python3 -m benchmarks._warm_child $mode --models $MODELS \
    --device cuda --t0 "$(date +%s.%N)" "$@" 2>>$W/$name.err | tail -1 | python3 -c "
import json, sys; d = json.loads(sys.stdin.read()); s = d['seconds']
print('$name', d['first_call_s'], {k: s[k] for k in ('mlp_autotune', 'transformer', 'dynamic_gpu')},
      {k: v for k, v in d['counters'].items() if 'runtime' in k or 'cache' in k})"
}
child files cold --cache-dir $W/cold/inductor
child cachedb-cold live-cold --cache-dir $W/live-cold/inductor --db $W/live.db
python3 -c "
from cachedb import CacheDB
from cachedb.fingerprint import cpp_host_key, current
from cachedb.layout.importer import Importer
with CacheDB('$W/imported.db') as db: Importer(db, fingerprint=current(), host_key=cpp_host_key()).run('$W/cold/inductor')" || exit 1
for r in $(seq 1 $PAIRS); do
  child cachedb warm-live$r --cache-dir $W/warm-live$r/inductor --db $W/live.db
  child cachedb warm-imp$r --cache-dir $W/warm-imp$r/inductor --db $W/imported.db
done
python3 - "$W" "$PAIRS" <<'PY'
import re, sqlite3, sys
from collections import Counter
w, pairs = sys.argv[1], int(sys.argv[2])
for db in ("live", "imported"):
    con = sqlite3.connect(f"{w}/{db}.db")
    rows = dict(con.execute("SELECT kind, count(DISTINCT key) FROM kernel_artifacts GROUP BY kind").fetchall())
    print(db, "kernel keys", rows, "best configs", con.execute("SELECT count(*) FROM best_configs").fetchone()[0],
          "guarded", con.execute("SELECT count(*) FROM guarded_entries").fetchone()[0],
          "timings", con.execute("SELECT count(*) FROM autotune_timings").fetchone()[0])
pat = re.compile(r"pid=(\d+) DEBUG (.*?) (?:lookup|kernel lookup) (\S+).*: (hit|miss|\d+ (?:variant|file)\S*)$")
for r in range(1, pairs + 1):
    for name in (f"warm-live{r}", f"warm-imp{r}"):
        seen, misses, pids = Counter(), Counter(), set()
        missed = []
        for line in open(f"{w}/{name}.log", errors="replace"):
            m = pat.search(line.strip())
            if not m:
                continue
            pid, kind, key, result = m.groups()
            pids.add(pid); seen[kind] += 1
            if result == "miss" or result.startswith("0 "):
                misses[kind] += 1; missed.append(f"{kind} {key}")
        print(name, "processes", len(pids), "lookups", dict(seen), "misses", dict(misses))
        for m in missed[:15]:
            print("   miss:", m)
PY
