#!/usr/bin/env bash
# GPU check for issue 10: the configs kernels run with after a warm start from the database equal
# the cold run's winners. Usage: bash benchmarks/_launcher_probe.sh OUTDIR
set -eu
out=$1; w=$(mktemp -d)
run() { python3 -m benchmarks._warm_child "$@" --models mlp_autotune,transformer,dynamic_gpu --device cuda --t0 "$(date +%s.%N)"; }
run cachedb-cold --cache-dir "$w/cold" --db "$w/db.db" --dump-launchers "$out/cold_launchers.json" > "$out/cold.json"
run cachedb --cache-dir "$w/fresh" --db "$w/db.db" --dump-launchers "$out/db_launchers.json" > "$out/db.json"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
cold = json.load(open(f"{out}/cold_launchers.json")); warm = json.load(open(f"{out}/db_launchers.json"))
same = sorted(k for k in cold if k in warm and cold[k] == warm[k])
diff = {k: (cold[k], warm[k]) for k in cold if k in warm and cold[k] != warm[k]}
summary = {"kernels_cold": len(cold), "kernels_warm": len(warm), "same_config": len(same),
           "different": diff, "only_cold": sorted(set(cold) - set(warm)), "only_warm": sorted(set(warm) - set(cold))}
json.dump(summary, open(f"{out}/launcher_compare.json", "w"), indent=1)
print(json.dumps({k: v if not isinstance(v, dict) else len(v) for k, v in summary.items() if k != "only_cold" and k != "only_warm"}))
PY
